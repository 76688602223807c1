"""MERGE of net changes into Iceberg tables (docs/follower-iceberg.md), the Delta follower's
guarantees the Iceberg way.

* Tables: `<sink>.<schema>.<table>` in the sink's catalog (catalog.py), or `<sink>.<schema>.<rename>`
  with table_options rename. Columns: the source columns under their source names (Iceberg keeps
  any name: columns are fields by id) + _cdc_lsn, _cdc_seq, _cdc_op, _cdc_commit_ts. Format v2,
  `write_mode` (the sink's, or the table's in table_options: writemode.py) for MERGE/UPDATE/DELETE
  (merge-on-read: position deletes, no file rewritten).
* A row is only replaced by a newer (lsn, seq); deletes, unchanged TOAST values (the table's value
  kept) as in the Delta sink. Truncate / a new base: rows older than its position (a new base:
  committed before its point) are deleted first (idempotent, so they carry no cut).
* Exactly once per cut: the MERGE's snapshot carries the follower's app id and cut id
  (commit.py); a cut the table has already is skipped. A commit that lost a conflict with
  `cdc maintain` is tried again from that check (conflicts.py).
* `mode: scd2`: every version kept, one MERGE per cut (scd2.py). A keyless table: each row
  identified by its position (_cdc_lsn, _cdc_seq); an insert-only cut's rows are appended, and a
  REPLICA IDENTITY FULL table's cut with deletes is one MERGE on the position that removes, per
  deleted content, one row of it (sinks/multiset.py): the table holds the source's multiset.
* Cuts (cuts.py): after a cut's rows and markers, every table's snapshot id is recorded in
  `<warehouse>/_cdc_cuts`, so readers can read all tables as of one cut.
* Schema (prepare, before anything is written): renamed source columns are renamed (metadata:
  Iceberg columns are fields by id), new columns added (rows older than a constant DEFAULT get it),
  int -> bigint, float -> double, larger decimal precision widened in place (`on_type_change`).
  Another type change stops the batch, except in a batch that starts the table over from a new
  base: the table is then dropped and made again with the new types. A dropped source column is
  kept, set NULL or dropped from the table after the cut's MERGE (`dropped_columns`, scd1).
* Derived views (`views:`) arrive as batches of `views.<name>` (sinks/viewbatch.py: the changes of
  the view's own table since the follower's last cut) and are applied like keyed tables, into the
  namespace `views`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import types as T

from cdc.ground.errors import SinkError
from cdc.ground.tables import spark_ident as q
from sinks.base import ApplyStats, Sink
from sinks.changes import META_COLUMNS, META_TYPES, POSITION_KEY, Batch, NetChanges, TableBatch
from sinks.delta.cuts import forget_table, record_cut
from sinks.iceberg import catalog, catalogread, jvm
from sinks.iceberg.commit import APP_ID, CUT, applied_cut, snapshot_properties
from sinks.iceberg.conflicts import retry_conflicts
from sinks.iceberg.cuts import snapshot_id
from sinks.iceberg.scd2 import apply_scd2
from sinks.iceberg.schema import same_type, type_sql, widenable
from sinks.iceberg.sources import source_view
from sinks.iceberg.writemode import align_write_mode, write_properties
from sinks.marker import Marker
from sinks.multiset import multiset_source
from sinks.scd2 import SCD2_COLUMNS
from sinks.shaping import follower_name
from sinks.viewbatch import ViewBatch

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from cdc.ground.config import Pipeline, SinkConfig
    from cdc.ground.tables import TableName

MARKER_PROPERTY = "cdc.follower"  # the follower's marker (sinks/marker.py), a table property


def lit(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass
class _Plan:
    ident: str
    batch: Batch
    create: T.StructType | None = None
    recreate: bool = False  # a new base whose types Iceberg cannot widen to: drop and make again
    rename: list[tuple[str, str]] = field(default_factory=list)
    add: list[T.StructField] = field(default_factory=list)
    widen: list[tuple[str, T.DataType]] = field(default_factory=list)
    gone: frozenset[str] = frozenset()  # source columns `dropped_columns: drop` took out of the table


class IcebergSink(Sink):
    kind = "iceberg"
    markers = True

    def __init__(self, config: SinkConfig, pipeline: Pipeline, spark: SparkSession):
        super().__init__(config, pipeline, spark)
        self.catalog = config.name
        self._catalog_reader: catalogread.CatalogReader | None = None  # `cdc status`: pyiceberg
        if spark is not None:
            catalog.register(spark, config, pipeline)

    def in_session(self, spark: SparkSession) -> Sink:
        # a new session has its own SQL confs: the catalog is registered there too
        if spark is not self.spark:
            catalog.register(spark, self.config, self.pipeline)
        return super().in_session(spark)

    @property
    def parallel_tables(self) -> bool:  # type: ignore[override]
        # SQLite takes one writer at a time: commits of several tables at once would fail with "locked"
        return self.settings.catalog.type != "sqlite"

    def ident(self, table: TableName) -> str:
        name = follower_name(self.config, table) or table.name
        return f"{q(self.catalog)}.{q(table.schema)}.{q(name)}"

    # without a session (`cdc status`) the tables and markers are read with pyiceberg (catalogread.py)
    reads_without_spark = True

    @property
    def _reader(self) -> catalogread.CatalogReader:
        if self._catalog_reader is None:
            self._catalog_reader = catalogread.CatalogReader(self.config, self.pipeline)
        return self._catalog_reader

    def close(self) -> None:
        """Release pyiceberg's catalog connections, if `cdc status` opened them."""
        if self._catalog_reader is not None:
            self._catalog_reader.close()

    def has_table(self, table: TableName) -> bool:
        if self.spark is None:
            return self._reader.load(*self._where(table)[1:]) is not None
        return self._table_exists(table)

    def _table_exists(self, table: TableName) -> bool:
        if not self._namespace_exists(table.schema):
            return False
        name = follower_name(self.config, table) or table.name
        rows = self.spark.sql(f"SHOW TABLES IN {q(self.catalog)}.{q(table.schema)}").collect()
        return any(r["tableName"] == name for r in rows)

    def _namespace_exists(self, schema: str) -> bool:
        return any(r[0] == schema for r in self.spark.sql(f"SHOW NAMESPACES IN {q(self.catalog)}").collect())

    def clear_table(self, table: TableName) -> None:
        self.spark.sql(f"DROP TABLE IF EXISTS {self.ident(table)} PURGE")
        forget_table(self.spark, self.warehouse, table)  # no recorded cut can read it any more

    # ---- cuts (sinks/iceberg/cuts.py): every table's snapshot id, per applied cut ----------------
    @property
    def warehouse(self) -> str:
        """Where `_cdc_cuts` is kept: the warehouse (a path or a URI)."""
        return catalog.warehouse(self.settings, self.pipeline)

    def cut_applied(self, cut_id: int, lsn: int, tables: list[TableName], again: bool = True) -> None:
        """Record each follower table's current snapshot id at this cut in `<warehouse>/_cdc_cuts`,
        so readers can read all tables as of the same cut; a cut recorded already (`again`: an
        earlier run started it) is not recorded twice."""
        versions: dict[str, int] = {}
        names: dict[str, str] = {}
        for t in tables:
            name = follower_name(self.config, t) or t.name
            snapshot = snapshot_id(self.spark, self.catalog, t.schema, name)
            if snapshot is not None:
                versions[str(t)] = snapshot
                names[str(t)] = name
        record_cut(self.spark, self.warehouse, self.log_id, cut_id, lsn, versions, names, again)

    # ---- marker (sinks/marker.py): the table property `cdc.follower` + the snapshots' `pgcdc.cut` ---
    def _where(self, table: TableName) -> tuple[str, str, str]:
        return self.catalog, table.schema, follower_name(self.config, table) or table.name

    def _stored_marker(self, table: TableName) -> str | None:
        found = jvm.table(self.spark, *self._where(table))
        return None if found is None else found.properties().get(MARKER_PROPERTY)

    def read_marker(self, table: TableName) -> str | None:
        """The property's marker; one that keeps only the fixed parts with the newest cut the
        current state's snapshots carry for this follower (`pgcdc.cut`). Without a session: read
        with pyiceberg."""
        if self.spark is None:
            found = self._reader.load(*self._where(table)[1:])
            if found is None:
                return None
            text = found.properties.get(MARKER_PROPERTY)
        elif not self._table_exists(table):
            return None
        else:
            text = self._stored_marker(table)
        marker = Marker.from_json(text)
        if marker is None or marker.end is not None:
            return text  # none, not ours, or one written before (it keeps its position)
        if self.spark is None:
            return marker.with_cut(catalogread.applied_cut(found, self.app_id)).to_json()
        return marker.with_cut(applied_cut(self.spark, *self._where(table), self.app_id)[0]).to_json()

    def write_marker(self, table: TableName, text: str) -> int | None:
        """Only the fixed parts go in the property (a commit when the table is re-based, or holds a
        marker of the older kind; a table made by this sink has it from its creation); returns
        the cut the table's snapshots carry now."""
        marker = Marker.from_json(text)
        fixed = marker.fixed() if marker is not None else None
        if fixed is not None and Marker.from_json(self._stored_marker(table)) != fixed:
            self.spark.sql(
                f"ALTER TABLE {self.ident(table)} SET TBLPROPERTIES ({lit(MARKER_PROPERTY)} = {lit(fixed.to_json())})"
            )
        return applied_cut(self.spark, *self._where(table), self.app_id)[0]

    # ---- schema --------------------------------------------------------------------------------
    @property
    def scd2(self) -> bool:
        return self.settings.mode == "scd2"

    @property
    def wants_versions(self) -> bool:
        return self.scd2

    def _meta(self) -> dict[str, T.DataType]:
        meta: dict[str, T.DataType] = {m: META_TYPES[m] for m in META_COLUMNS}
        return meta | SCD2_COLUMNS if self.scd2 else meta

    def _plan(self, batch: Batch) -> _Plan:
        ident = self.ident(batch.table)
        if self.scd2 and not batch.schema.key:
            raise SinkError(
                f"sink {self.name} (iceberg, mode scd2) cannot follow {batch.table}: it has no primary key, so it "
                "is followed insert-only, and SCD2 keeps versions of keyed rows",
                f"follow {batch.table} with an iceberg sink in mode scd1 (each inserted row is kept as it came: "
                "its history already), or give it a primary key",
            )
        meta = self._meta()
        wanted = T.StructType(
            list(batch.spark_schema.fields) + [T.StructField(m, t) for m, t in meta.items()]
        )
        if not self._table_exists(batch.table):
            return _Plan(ident, batch, create=wanted)
        current = {f.name: f.dataType for f in self.spark.table(ident).schema.fields}
        plan = _Plan(ident, batch)
        for f in wanted.fields:  # a renamed source column: the table renames its own (metadata only)
            if f.name not in current:
                old = next((o for o in batch.renames.get(f.name, ()) if o in current), None)
                if old is not None:
                    plan.rename.append((old, f.name))
                    current[f.name] = current.pop(old)
        rebase = batch.bootstrap and batch.snapshot_lsn is not None
        gone = self._dropped_before(batch, current)
        for f in wanted.fields:
            have = current.get(f.name)
            if f.name in gone:
                continue  # dropped from the table at this cut already (a replay): not added again
            if have is None:
                if f.name in batch.key_columns or f.name in meta:
                    if rebase and not self.scd2:
                        return _Plan(ident, batch, create=wanted, recreate=True)
                    raise SinkError(
                        f"Iceberg table {ident} ({batch.table}) has no column {f.name!r}, which the follower needs",
                        "the table was changed by hand: restore the column, or drop the table so it is rebuilt",
                    )
                plan.add.append(f)
            elif same_type(have, f.dataType):
                continue
            elif f.name not in meta and widenable(have, f.dataType):
                plan.widen.append((f.name, f.dataType))
            elif rebase and not self.scd2:  # a new base: the table is made again with the new types
                return _Plan(ident, batch, create=wanted, recreate=True)
            else:
                raise SinkError(
                    f"Iceberg table {ident} ({batch.table}): column {f.name!r} is {have.simpleString()} but the "
                    f"source now needs {f.dataType.simpleString()}, which Iceberg cannot widen to",
                    "drop the Iceberg table (it is rebuilt from the log on the next apply) or restore the column type",
                )
        plan.gone = gone
        if plan.widen and self.settings.on_type_change == "stop":
            what = ", ".join(f"{n!r} -> {t.simpleString()}" for n, t in plan.widen)
            raise SinkError(
                f"sink {self.name}: Iceberg table {ident} ({batch.table}): the source widened column(s) {what}; "
                "on_type_change: stop",
                f"set `on_type_change: widen` on sink {self.name} (metadata only) or drop the table to rebuild it",
            )
        return plan

    def _dropped_before(self, batch: Batch, current: dict[str, T.DataType]) -> frozenset[str]:
        """Columns the source dropped in this batch that `dropped_columns: drop` has taken out of
        the table already: the cut was applied before a crash, and is only replayed."""
        if self.config.dropped_columns != "drop":
            return frozenset()
        return frozenset(c for c in batch.retired if c not in current)

    def prepare(self, batches: Sequence[Batch]) -> None:
        plans = [self._plan(b) for b in batches]  # all checks first: nothing is changed if one fails
        self._created: set[str] = set()
        self._gone: dict[str, frozenset[str]] = {p.ident: p.gone for p in plans}
        for plan in plans:
            if plan.create is not None:
                self._create(plan)
            else:
                self._evolve(plan)

    def _create(self, plan: _Plan) -> None:
        assert plan.create is not None
        if plan.recreate:
            self.spark.sql(f"DROP TABLE IF EXISTS {plan.ident} PURGE")
            forget_table(self.spark, self.warehouse, plan.batch.table)
            logger.info(
                f"sink {self.name}: {plan.batch.table}: a new base with types Iceberg cannot widen to: table made again"
            )
        self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {q(self.catalog)}.{q(plan.batch.table.schema)}")
        cols = ", ".join(f"{q(f.name)} {type_sql(f.dataType)}" for f in plan.create.fields)
        props = {"format-version": "2"} | write_properties(self.settings.write_mode_for(plan.batch.table))
        # the marker's fixed parts from the start: the cut's marker step commits nothing
        base = plan.batch.epoch if isinstance(plan.batch, ViewBatch) else getattr(plan.batch, "base", None)
        if base is not None:
            props[MARKER_PROPERTY] = Marker(
                self.pipeline.name, self.name, self.log_id, base, None, None
            ).to_json()
        tblprops = ", ".join(f"{lit(k)} = {lit(v)}" for k, v in props.items())
        self.spark.sql(
            f"CREATE TABLE IF NOT EXISTS {plan.ident} ({cols}) USING iceberg TBLPROPERTIES ({tblprops})"
        )
        self._created.add(plan.ident)

    def _evolve(self, plan: _Plan) -> None:
        mode = self.settings.write_mode_for(plan.batch.table)
        if align_write_mode(self.spark, plan.ident, mode):  # the setting changed (writemode.py)
            logger.info(
                f"sink {self.name}: {plan.batch.table}: write mode set to {mode} (table properties only)"
            )
        for old, new in plan.rename:
            self.spark.sql(f"ALTER TABLE {plan.ident} RENAME COLUMN {q(old)} TO {q(new)}")
        if plan.add:
            cols = ", ".join(f"{q(f.name)} {type_sql(f.dataType)}" for f in plan.add)
            self.spark.sql(f"ALTER TABLE {plan.ident} ADD COLUMNS ({cols})")
            self._backfill_defaults(plan)
        for name, dtype in plan.widen:
            self.spark.sql(f"ALTER TABLE {plan.ident} ALTER COLUMN {q(name)} TYPE {type_sql(dtype)}")
            logger.info(
                f"sink {self.name}: {plan.batch.table}: column {name!r} widened to {type_sql(dtype)} (metadata only)"
            )

    def _backfill_defaults(self, plan: _Plan) -> None:
        """ADD COLUMN ... DEFAULT gave every existing source row the default without a change
        event: rows the follower last wrote before the column appeared get it too."""
        batch = plan.batch
        for f in plan.add:
            if f.name not in batch.defaults:
                continue
            since = batch.defaults[f.name][0]
            keys = list(batch.key_columns)
            # scd2: the current version of each key (one per key) that began before the column
            which = (
                f"_cdc_end_lsn IS NULL AND _cdc_start_lsn < {since}" if self.scd2 else f"_cdc_lsn < {since}"
            )
            # a local checkpoint: the MERGE's source must not read its own target (AMBIGUOUS_REFERENCE)
            older = (
                self.spark.table(plan.ident)
                .filter(which)
                .select(*[q(k) for k in keys], batch.default_value(f.name).alias(f.name))
                .localCheckpoint()
            )
            on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in keys)
            self._merge_sql(
                plan.ident,
                older,
                on + (" AND t._cdc_end_lsn IS NULL" if self.scd2 else ""),
                f"WHEN MATCHED THEN UPDATE SET t.{q(f.name)} = s.{q(f.name)}",
            )

    # ---- writes --------------------------------------------------------------------------------
    @staticmethod
    def _older_than(lsn: int, seq: int) -> str:
        return f"(_cdc_lsn < {lsn} OR (_cdc_lsn = {lsn} AND _cdc_seq < {seq}))"

    def apply(self, batch: Batch, changes: NetChanges, cut_id: int) -> ApplyStats:
        # a commit that lost to `cdc maintain` (a compaction replaced files the MERGE read) wrote
        # nothing: the cut is tried again from the check whether it is in the table already
        return retry_conflicts(lambda: self._apply(batch, changes, cut_id))

    def _apply(self, batch: Batch, changes: NetChanges, cut_id: int) -> ApplyStats:
        ident = self.ident(batch.table)
        stats = ApplyStats(str(batch.table))
        fresh = ident in getattr(self, "_created", set())
        if not fresh:
            done, _ = applied_cut(self.spark, *self._where(batch.table), self.app_id)
            if done is not None and done >= cut_id:
                stats.skipped = True  # this cut's MERGE committed before a crash: nothing to do again
                self._retire(ident, batch)  # a crash may have come between the MERGE and this
                return stats
        if self.scd2:
            where = (
                self.catalog,
                batch.table.schema,
                follower_name(self.config, batch.table) or batch.table.name,
            )
            # the fill of unchanged TOAST values reads the table in the batch's session
            catalog.register(changes.df.sparkSession, self.config, self.pipeline)
            stats.inserted = apply_scd2(self.spark, where, batch, changes, cut_id, self.app_id)
            return stats
        restart = batch.bootstrap and batch.snapshot_lsn is not None
        if restart and not fresh:
            # start over: every row committed before the snapshot's point. A keyless table's snapshot
            # rows sit at the point with negative seqs (cdc.keys.snapshot_seq): not older than it
            self.spark.sql(f"DELETE FROM {ident} WHERE _cdc_lsn < {batch.snapshot_lsn}")
        if batch.truncate_position is not None and not fresh:
            self.spark.sql(f"DELETE FROM {ident} WHERE {self._older_than(*batch.truncate_position)}")
        if isinstance(batch, TableBatch) and not batch.schema.key and batch.deletes > 0:
            self._merge_multiset(ident, batch, changes, cut_id, held=not fresh, restart=restart)
        elif not batch.schema.key:
            self._append(ident, batch, changes, cut_id)
        else:
            self._merge(ident, batch, changes, cut_id)
        _, summary = applied_cut(self.spark, *self._where(batch.table), self.app_id)
        self._retire(ident, batch)
        if summary.get(CUT) == str(cut_id):
            stats.inserted = int(
                summary.get("spark.merge-into.num-target-rows-inserted", summary.get("added-records", 0))
            )
            stats.updated = int(summary.get("spark.merge-into.num-target-rows-updated", 0))
            stats.deleted = int(summary.get("spark.merge-into.num-target-rows-deleted", 0))
        return stats

    def _retire(self, ident: str, batch: Batch) -> None:
        """`dropped_columns: null | drop` (scd1 only, settings.py): after the MERGE of the cut that
        brings a column's DROP, every row gets NULL in it (an UPDATE of the rows that still hold a
        value), or the column goes from the table's schema (Iceberg's schema evolution: metadata
        only; the field id is retired, so a later column of the same name is a new, empty one).
        Neither commit carries the cut's snapshot properties: both are idempotent, and a replayed
        cut repeats them harmlessly."""
        how = self.config.dropped_columns
        if how == "keep" or self.scd2 or not batch.retired:
            return
        have = {f.name for f in self.spark.table(ident).schema.fields}
        present = sorted(c for c in batch.retired if c in have and c not in batch.key_columns)
        if not present:
            return
        if how == "null":
            held = " OR ".join(f"{q(c)} IS NOT NULL" for c in present)
            sets = ", ".join(f"{q(c)} = NULL" for c in present)
            self.spark.sql(f"UPDATE {ident} SET {sets} WHERE {held}")
            what = "set NULL in every row"
        else:
            self.spark.sql(f"ALTER TABLE {ident} DROP COLUMNS ({', '.join(q(c) for c in present)})")
            what = "dropped from the table (metadata only)"
        logger.info(
            f"sink {self.name}: {batch.table}: column(s) {', '.join(present)} dropped at the source: {what}"
        )

    def _columns(self, ident: str, batch: Batch) -> list[str]:
        """The batch's columns the table holds (those a replayed cut dropped already left out), then the meta columns."""
        gone = getattr(self, "_gone", {}).get(ident, frozenset())
        return [*(f.name for f in batch.spark_schema.fields if f.name not in gone), *META_COLUMNS]

    def _append(self, ident: str, batch: Batch, changes: NetChanges, cut_id: int) -> None:
        """A keyless table's cut without deletes: every row is its own, identified by its log
        position (_cdc_lsn, _cdc_seq), so the cut's rows are appended; the check above keeps a
        replayed cut from appending them twice."""
        columns = self._columns(ident, batch)
        names = ", ".join(q(c) for c in columns)
        with (
            source_view(changes.df) as view,
            snapshot_properties(self.spark, {APP_ID: self.app_id, CUT: str(cut_id)}),
        ):
            self.spark.sql(f"INSERT INTO {ident} ({names}) SELECT {names} FROM {view} WHERE _cdc_op != 'd'")

    def _merge(self, ident: str, batch: Batch, changes: NetChanges, cut_id: int) -> None:
        on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in batch.key_columns)
        newer = "(s._cdc_lsn > t._cdc_lsn OR (s._cdc_lsn = t._cdc_lsn AND s._cdc_seq > t._cdc_seq))"
        columns = self._columns(ident, batch)
        sets = []
        for c in columns:
            # an unchanged TOAST value the batch does not know: keep the table's
            flag = changes.unchanged.get(c)
            value = f"CASE WHEN s.{q(flag)} THEN t.{q(c)} ELSE s.{q(c)} END" if flag else f"s.{q(c)}"
            sets.append(f"t.{q(c)} = {value}")
        names = ", ".join(q(c) for c in columns)
        values = ", ".join(f"s.{q(c)}" for c in columns)
        clauses = (
            f"WHEN MATCHED AND s._cdc_op = 'd' AND {newer} THEN DELETE "
            f"WHEN MATCHED AND s._cdc_op != 'd' AND {newer} THEN UPDATE SET {', '.join(sets)} "
            f"WHEN NOT MATCHED AND s._cdc_op != 'd' THEN INSERT ({names}) VALUES ({values})"
        )
        with snapshot_properties(self.spark, {APP_ID: self.app_id, CUT: str(cut_id)}):
            self._merge_sql(ident, changes.df, on, clauses)

    def _merge_multiset(
        self, ident: str, batch: Batch, changes: NetChanges, cut_id: int, held: bool, restart: bool
    ) -> None:
        """A keyless REPLICA IDENTITY FULL table's cut with deletes: each removes one row of its
        content (sinks/multiset.py), in one MERGE on the position that carries the cut id, so a
        replayed cut is skipped by the check above and removes no second copy. `held`: the table has
        rows (not made in this cut); `restart`: a new base, its whole history in the cut. The table
        is read in the batch's session, inside the retried step (a retry chooses from a fresh read),
        and the source is materialized first: a MERGE's source must not read its own target."""
        session = changes.df.sparkSession
        catalog.register(session, self.config, self.pipeline)
        columns = self._columns(ident, batch)
        content = columns[: -len(META_COLUMNS)]
        target = session.table(ident) if held else None
        source = multiset_source(changes.df, content, target, restart)
        if target is not None:
            source = source.localCheckpoint()
        on = " AND ".join(f"t.{k} = s.{k}" for k in POSITION_KEY)
        names = ", ".join(q(c) for c in columns)
        values = ", ".join(f"s.{q(c)}" for c in columns)
        clauses = (
            "WHEN MATCHED AND s._cdc_op = 'd' THEN DELETE "
            f"WHEN NOT MATCHED AND s._cdc_op != 'd' THEN INSERT ({names}) VALUES ({values})"
        )
        with snapshot_properties(self.spark, {APP_ID: self.app_id, CUT: str(cut_id)}):
            self._merge_sql(ident, source, on, clauses)

    def _merge_sql(self, ident: str, source: DataFrame, on: str, clauses: str) -> None:
        with source_view(source) as view:
            self.spark.sql(f"MERGE INTO {ident} t USING {view} s ON {on} {clauses}")

    # ---- reads ---------------------------------------------------------------------------------
    def current(self, table: TableName, batch_schema: Batch | None = None) -> DataFrame | None:
        if not self._table_exists(table):
            return None
        # the session's catalog caches a loaded table: writes made in other sessions since (the apply
        # runs each table in a clone of the session, pipelines/apply/parallel.py) would not be seen
        self.spark.sql(f"REFRESH TABLE {self.ident(table)}")
        rows = self.spark.table(self.ident(table))
        return rows.filter("_cdc_end_lsn IS NULL") if self.scd2 else rows
