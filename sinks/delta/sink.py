"""MERGE of net changes into Delta tables (DESIGN.md §7).

* Columns: the source columns + _cdc_lsn (commit LSN), _cdc_seq (index in the transaction),
  _cdc_op, _cdc_commit_ts. A row is only replaced by a newer (lsn, seq); replays change nothing.
* Exactly once per batch: the MERGE commits with Delta's idempotent-write confs
  (txnAppId = this follower, txnVersion = the cut id), so a cut applied again after a crash
  between MERGE and checkpoint is skipped by Delta itself.
* A table made in this cut gets its netted rows as an append: on an empty table that is all the
  MERGE would do, without its join; a replay finds the table made and MERGEs, changing nothing.
  So does a cut whose rows can only be new to the table (`_appends`: inserts alone, the follower
  holding exactly the log up to the range), with the same idempotent transaction id.
* Truncate: rows older than the truncate's position are deleted, then the batch's later
  events merge in. A follower starting a table over (new snapshot base) deletes the rows older
  than the snapshot first.
* Schema: new source columns are added. A widenable type change (int -> bigint, float -> double,
  larger decimals, date -> timestamp_ntz) follows the sink's `on_type_change`: `rewrite` (default)
  rewrites the table with the new type in one commit, `widen` uses Delta type widening (a table
  feature: delta-rs and Polars lose the table, said in the apply output), `stop` stops the batch.
  Any other difference stops the batch before anything is written, except in a batch that starts
  the table over from a new base (a re-base): then the table takes the new type
  (sinks/delta/retype.py). A renamed source column (same attnum) is renamed in the Delta table
  too: metadata only on a table with column mapping, else by rewriting the table in one commit.
* Column names (sinks/delta/names.py): on a table without column mapping a name plain Delta
  cannot hold is stored encoded (`unit price` -> `unit_x0020_price`, the source name in the
  column's comment); the batch is translated to stored names once (sinks/delta/batch.py).
  Dropped source columns stay in the Delta table with the last value the source had; rows
  written after the drop keep theirs (updates) or get NULL (inserts).
* Table features (sinks/delta/features.py): a table is created at the lowest protocol its data
  allows; column mapping only with `column_mapping: name` (listing its reader features, so
  readers without column mapping refuse it), type widening only at the first widening with
  `on_type_change: widen`. Tables made by earlier versions keep them.
* Marker (sinks/marker.py): the table property `cdc.follower` names the follower and the table's
  base, written when the table is made or re-based; the position is the cut id the data commit
  carries (its txn version), so a cut is one commit per table written.
* Cuts (sinks/delta/cuts.py): after a cut's rows and markers, every table's Delta version is
  recorded in `<path>/_cdc_cuts`, so readers can read all tables as of one cut.
* Writes retry a commit that lost a Delta conflict with `cdc maintain` (sinks/delta/conflicts.py).

It stays one module (over 450 lines): it is the one DeltaSink class, whose schema step (`prepare`) hands
each table's plan and batch to its write step (`apply`) through the instance, and every part that stands
alone (names, features, retyping, SCD2, multisets, cuts, conflicts) lives in the sibling modules above.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.errors import SinkError
from cdc.ground.tables import TableName
from cdc.ground.tables import spark_ident as q
from sinks.base import ApplyStats, Sink
from sinks.changes import META_COLUMNS, META_TYPES, POSITION_KEY, Batch, NetChanges, TableBatch
from sinks.delta import rswrite
from sinks.delta.batch import DeltaBatch
from sinks.delta.conflicts import retry_conflicts
from sinks.delta.cuts import forget_table, record_cut, table_version
from sinks.delta.features import (
    COLUMN_MAPPING,
    LIST_READER_FEATURES,
    LOST_READERS,
    TYPE_WIDENING,
    has_column_mapping,
    has_type_widening,
    set_properties_sql,
)
from sinks.delta.idempotent import follower_write
from sinks.delta.logfiles import is_delta_table, latest_version, table_properties, table_schema, txn_version
from sinks.delta.names import ColumnNames, decoded, source_names
from sinks.delta.paths import table_path
from sinks.delta.retype import end_history, rebuild_scd1, rewrite_columns
from sinks.delta.scd2 import SCD2_COLUMNS, apply_scd2
from sinks.delta.snapshot import reader_protocol, table_property, written_rows
from sinks.delta.snapshot import txn_version as spark_txn_version
from sinks.jvm import driver_jvm
from sinks.marker import Marker
from sinks.multiset import multiset_source
from sinks.shaping import follower_name
from sinks.viewbatch import ViewBatch

logger = logging.getLogger(__name__)

MARKER_PROPERTY = "cdc.follower"  # the follower's marker (sinks/marker.py)


def comment_sql(metadata: dict) -> str:
    """` COMMENT '...'` for a column whose metadata has a comment (an encoded name's source)."""
    comment = metadata.get("comment")
    if not comment:
        return ""
    return " COMMENT '" + comment.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _widenable(old: T.DataType, new: T.DataType) -> bool:
    order: list[type[T.DataType]] = [T.ByteType, T.ShortType, T.IntegerType, T.LongType]
    kinds = [type(old), type(new)]
    if all(k in order for k in kinds):
        return order.index(kinds[0]) <= order.index(kinds[1])
    if isinstance(old, T.FloatType) and isinstance(new, T.DoubleType):
        return True
    if isinstance(old, T.DecimalType) and isinstance(new, T.DecimalType):
        return new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale
    return isinstance(old, T.DateType) and isinstance(new, T.TimestampNTZType)


@dataclass
class _Evolution:
    path: str
    batch: DeltaBatch
    # a table with column mapping at reader version 2, which delta-rs's Arrow path mis-reads
    unlisted: bool = False
    create: T.StructType | None = None
    add: list[T.StructField] = field(default_factory=list)
    widen: list[tuple[str, T.DataType]] = field(default_factory=list)
    rename: list[tuple[str, str]] = field(default_factory=list)  # (old, new)
    # A re-base with a type change Delta cannot widen: (column, its type in the table, the new type).
    replace: list[tuple[str, T.DataType, T.DataType]] = field(default_factory=list)
    current: dict[str, T.DataType] = field(default_factory=dict)  # the table's columns before the plan
    was: dict[str, T.DataType] = field(
        default_factory=dict
    )  # a widened column's type before (by its new name)


class DeltaSink(Sink):
    kind = "delta"
    # False: every cut MERGEs, inserts alone too (the "before" of bench/apply.py --only inserts)
    append_inserts = True

    @property
    def base(self) -> Path:
        return self.pipeline.path(self.settings.path)

    def path_of(self, table: TableName) -> str:
        return str(table_path(self.base, table, follower_name(self.config, table)))

    # without a session (`cdc status`) the table and its marker are read from the _delta_log files
    reads_without_spark = True

    def _exists(self, path: str) -> bool:
        if self._reads_log_files(path):
            return is_delta_table(path)
        return DeltaTable.isDeltaTable(self.spark, path)

    def has_table(self, table: TableName) -> bool:
        return self._exists(self.path_of(table))

    # ---- marker (sinks/marker.py): the table property `cdc.follower` + the commits' txn version ---
    markers = True

    def clear_table(self, table: TableName) -> None:
        # the directory goes, not only the rows: the new table keeps no txn version of an old cut,
        # which would make Delta skip the rebuild's writes as already applied
        jvm = driver_jvm(self.spark)
        path = jvm.org.apache.hadoop.fs.Path(self.path_of(table))
        path.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration()).delete(path, True)
        forget_table(self.spark, self.base, table)  # its versions start over: older cuts cannot read it

    def cut_applied(self, cut_id: int, lsn: int, tables: list[TableName], again: bool = True) -> None:
        """Record the Delta version of every follower table at this cut in `_cdc_cuts`
        (sinks/delta/cuts.py), so readers can read all tables as of the same cut; a cut recorded
        already (`again`: an earlier run started it) is not recorded twice."""
        versions = {str(t): v for t in tables if (v := self._version(self.path_of(t))) is not None}
        paths = {
            str(t): str(Path(self.path_of(t)).relative_to(self.base)) for t in tables if str(t) in versions
        }
        record_cut(self.spark, self.base, self.log_id, cut_id, lsn, versions, paths, again)

    def _version(self, path: str) -> int | None:
        return latest_version(path) if self._reads_log_files(path) else table_version(self.spark, path)

    def _reads_log_files(self, path: str) -> bool:
        """Read the marker and the cut from the table's `_delta_log` files (sinks/delta/logfiles.py,
        milliseconds) rather than through Spark: without a session, and where delta-rs writes the
        small cuts. Spark would rebuild the table's state after each delta-rs commit (its commits
        have no checksum file): 3 jobs, 0.7-1 s per cut on 2 cores."""
        return self.spark is None or (self.settings.small_cuts == "delta-rs" and rswrite.is_local(path))

    def _stored_marker(self, path: str) -> str | None:
        """The table property as it is (the table must exist)."""
        if self._reads_log_files(path):
            return table_properties(path).get(MARKER_PROPERTY)
        return table_property(self.spark, path, MARKER_PROPERTY)  # no file list built (detail() would)

    def read_marker(self, table: TableName) -> str | None:
        """The property's marker; one that keeps only the fixed parts (sinks/marker.py) with the
        newest cut the table's commits carry for this follower (Delta's txn version of its app id)."""
        path = self.path_of(table)
        if not self._exists(path):
            return None
        text = self._stored_marker(path)
        marker = Marker.from_json(text)
        if marker is None or marker.end is not None:
            return text  # none, not ours, or one written before (it keeps its position)
        return marker.with_cut(self._cut_held(path)).to_json()

    def _cut_held(self, path: str) -> int | None:
        """The newest cut this follower's commits carry (Delta's txn version of its app id)."""
        if self._reads_log_files(path):
            return txn_version(path, self.app_id)
        return spark_txn_version(self.spark, path, self.app_id)

    def write_marker(self, table: TableName, text: str) -> int | None:
        """Only the fixed parts go in the property (a commit when the table is re-based, or holds a
        marker of the older kind; a table made by this sink has it from its creation); the cut is
        the data commit's txn version, returned as the table holds it now."""
        path = self.path_of(table)
        marker = Marker.from_json(text)
        fixed = marker.fixed() if marker is not None else None
        held = Marker.from_json(self._stored_marker(path))
        if fixed is not None and held != fixed:  # else nothing new (a replayed cut too): no commit
            value = fixed.to_json().replace("\\", "\\\\").replace("'", "\\'")
            retry_conflicts(
                lambda: self.spark.sql(
                    f"ALTER TABLE delta.{q(path)} SET TBLPROPERTIES ('{MARKER_PROPERTY}' = '{value}')"
                )
            )
        return self._cut_held(path)

    # ---- schema --------------------------------------------------------------------------------
    @property
    def scd2(self) -> bool:
        return self.settings.mode == "scd2"

    def _meta(self) -> dict[str, T.DataType]:
        meta: dict[str, T.DataType] = {m: META_TYPES[m] for m in META_COLUMNS}
        return meta | SCD2_COLUMNS if self.scd2 else meta

    def _names(self, path: str, schema: T.StructType | None = None) -> ColumnNames:
        """How the table stores column names: its columns as they are stored; new ones as they are
        with column mapping (an existing table that has it, or a new one with `column_mapping:
        name`), else encoded (sinks/delta/names.py)."""
        if not self._exists(path):
            return ColumnNames(mapped=self.settings.column_mapping == "name")
        if self._reads_log_files(path):
            mode = table_properties(path).get("delta.columnMapping.mode")
        else:
            mode = table_property(self.spark, path, "delta.columnMapping.mode")
        if schema is None:
            schema = self._schema(path)
        return ColumnNames.of_table(mode not in (None, "none"), schema)

    def _schema(self, path: str) -> T.StructType:
        """The table's columns as Spark reads them. A plain table's schema from its log files where
        they are read (as Spark's own StructType JSON, without the Spark job a snapshot costs); a
        table with column mapping or type widening (whose log keeps more in each field) through Spark."""
        if self._reads_log_files(path):
            properties = table_properties(path)
            if not (has_column_mapping(properties) or has_type_widening(properties)):
                return T.StructType.fromJson(table_schema(path))
        return DeltaTable.forPath(self.spark, path).toDF().schema

    def _plan(self, source: Batch) -> _Evolution:
        path = self.path_of(source.table)
        exists = self._exists(path)
        schema = self._schema(path) if exists else None
        names = self._names(path, schema)
        batch = DeltaBatch(source, names)
        meta = self._meta()
        wanted = T.StructType(
            list(batch.spark_schema.fields) + [T.StructField(m, t) for m, t in meta.items()]
        )
        sources = [*source.schema.column_names, *meta]
        if schema is None:
            names.check(str(batch.table), path, sources, {})
            return _Evolution(path, batch, create=wanted)
        current = {f.name: f.dataType for f in schema.fields}
        have = source_names(schema)  # stored name -> source name
        plan = _Evolution(path, batch, current=dict(current))
        plan.unlisted = names.mapped and reader_protocol(self.spark, path)[0] < 3
        for (
            f
        ) in wanted.fields:  # a renamed source column: the follower renames its own (a metadata-only change)
            old = (
                next((o for o in batch.renames.get(f.name, ()) if o in current), None)
                if f.name not in current
                else None
            )
            if old is not None:
                plan.rename.append((old, f.name))
                current[f.name] = current.pop(old)
                have.pop(old, None)
                have[f.name] = batch.source_name(f.name)
        names.check(str(batch.table), path, sources, have)
        for f in wanted.fields:
            stored = current.get(f.name)
            if stored is None:
                if f.name in batch.key_columns or f.name in meta:
                    raise SinkError(
                        f"Delta table {path} ({batch.table}) has no column {f.name!r}, which the follower needs",
                        "the table was changed by hand: restore the column, or move the table away so it is rebuilt",
                    )
                plan.add.append(f)
            elif stored != f.dataType:
                if f.name not in meta and _widenable(stored, f.dataType):
                    plan.widen.append((f.name, f.dataType))
                    plan.was[f.name] = stored
                elif f.name not in meta and batch.bootstrap and batch.snapshot_lsn is not None:
                    # A new base (a re-base after a table rewrite): the table is rebuilt from it, so the
                    # column may take the new type; the rewrite and the rebuild happen in apply.
                    plan.replace.append((f.name, stored, f.dataType))
                elif not (isinstance(stored, T.DecimalType | T.StringType) and stored == f.dataType):
                    raise SinkError(
                        f"Delta table {path} ({batch.table}): column {f.name!r} is {stored.simpleString()} but the source "
                        f"now needs {f.dataType.simpleString()}, which Delta cannot widen to",
                        "move the Delta table away (it is rebuilt from the log on the next apply) or restore the column type",
                    )
        if plan.widen and self.settings.on_type_change == "stop":
            what = ", ".join(
                f"{n!r} {current[n].simpleString()} -> {t.simpleString()}" for n, t in plan.widen
            )
            raise SinkError(
                f"sink {self.name}: Delta table {path} ({batch.table}): the source widened column(s) {what}; "
                "on_type_change: stop",
                f"set `on_type_change: rewrite` on sink {self.name} (the table is rewritten with the new type, every "
                "reader keeps it) or `widen` (Delta type widening: delta-rs and Polars lose the table), or move the "
                "Delta table away (it is rebuilt from the log on the next apply)",
            )
        return plan

    def prepare(self, batches: Sequence[Batch]) -> None:
        plans = [self._plan(b) for b in batches]  # all checks first: nothing is changed if one fails
        bases = {
            p.path: b.epoch if isinstance(b, ViewBatch) else getattr(b, "base", None)
            for p, b in zip(plans, batches, strict=True)
        }
        self._created: set[str] = set()
        self._replaced: dict[str, _Evolution] = {p.path: p for p in plans if p.replace}
        self._batches: dict[str, DeltaBatch] = {p.path: p.batch for p in plans}
        for plan in plans:
            if plan.unlisted:
                self._list_reader_features(plan)
            if plan.replace:
                continue  # renames, adds and widenings are part of the table's rewrite in apply
            if plan.create is not None:
                self._created.add(plan.path)
                self._create(plan, plan.batch, bases[plan.path])
                continue
            self._evolve(plan, plan.batch)

    def _list_reader_features(self, plan: _Evolution) -> None:
        """A table with column mapping at Delta's legacy reader version 2 (made by an earlier
        version): delta-rs's Arrow path reads it and returns NULL for renamed columns. Listing its
        reader features makes it refuse the table instead (sinks/delta/features.py)."""
        self.spark.sql(set_properties_sql(f"delta.{q(plan.path)}", LIST_READER_FEATURES))
        logger.info(
            f"sink {self.name}: {plan.batch.table}: the Delta table has column mapping; it now lists its reader "
            f"features (reader version 3), so readers without column mapping refuse it instead of reading NULLs: "
            f"{LOST_READERS['columnMapping']}"
        )

    def _create(self, plan: _Evolution, batch: DeltaBatch, base: int | None) -> None:
        """A new table at the lowest protocol its columns allow (sinks/delta/features.py), its
        marker's fixed parts among its properties (so the cut's marker step commits nothing)."""
        assert plan.create is not None
        properties: dict[str, str] = {}
        if self.markers and base is not None:
            marker = Marker(self.pipeline.name, self.name, self.log_id, base, None, None)
            properties[MARKER_PROPERTY] = marker.to_json()
        properties |= rswrite.INT64_TIMESTAMPS  # every writer of this table writes them so
        if self.settings.column_mapping == "name":
            properties |= COLUMN_MAPPING
            self._say_feature(batch, "columnMapping", "column_mapping: name")
        builder = DeltaTable.createIfNotExists(self.spark).location(plan.path)
        for f in plan.create.fields:
            builder = builder.addColumn(f.name, f.dataType, nullable=True, comment=f.metadata.get("comment"))
        for key, value in properties.items():
            builder = builder.property(key, value)
        builder.execute()

    def _evolve(self, plan: _Evolution, batch: DeltaBatch) -> None:
        """Renames, new columns and widenings of an existing table, taking on a table feature only
        when the table has it already or nothing else does (docs/reading-the-lake.md)."""
        if not (plan.rename or plan.add or plan.widen):
            return
        target = f"delta.{q(plan.path)}"
        [detail] = DeltaTable.forPath(self.spark, plan.path).detail().collect()  # one row
        properties = detail["properties"]
        mapped = has_column_mapping(properties)  # else names plain Delta cannot hold come encoded
        # widen in place on a table that has type widening already (made by an earlier version):
        # no reader loses anything more, and it costs no rewrite
        in_place = bool(plan.widen) and (
            self.settings.on_type_change == "widen" or has_type_widening(properties)
        )
        retype = {} if in_place else dict(plan.widen)
        renames = [] if mapped else plan.rename
        if renames or retype:
            rewrite_columns(self.spark, plan.path, renames, retype, batch.metadata)
            what = [f"{o!r} renamed to {n!r}" for o, n in renames]
            what += [f"{n!r} {plan.was[n].simpleString()} -> {t.simpleString()}" for n, t in retype.items()]
            logger.info(f"sink {self.name}: {batch.table}: table rewritten in one commit ({'; '.join(what)})")
        if mapped:
            for old, new in plan.rename:  # metadata only
                self.spark.sql(f"ALTER TABLE {target} RENAME COLUMN {q(old)} TO {q(new)}")
        if plan.add:
            cols = ", ".join(
                f"{q(f.name)} {f.dataType.simpleString()}{comment_sql(f.metadata)}" for f in plan.add
            )
            self.spark.sql(f"ALTER TABLE {target} ADD COLUMNS ({cols})")
            self._backfill_defaults(plan, batch)
        if in_place:
            if not has_type_widening(properties):
                self.spark.sql(set_properties_sql(target, TYPE_WIDENING))
                widened = ", ".join(
                    f"{n!r} {plan.was[n].simpleString()} -> {t.simpleString()}" for n, t in plan.widen
                )
                self._say_feature(batch, "typeWidening", f"on_type_change: widen, column(s) {widened}")
            for name, dtype in plan.widen:
                self.spark.sql(f"ALTER TABLE {target} ALTER COLUMN {q(name)} TYPE {dtype.simpleString()}")

    def _say_feature(self, batch: DeltaBatch, feature: str, why: str) -> None:
        logger.info(
            f"sink {self.name}: {batch.table}: the Delta table takes on table feature {feature} ({why}): "
            f"{LOST_READERS[feature]}"
        )

    def _backfill_defaults(self, plan: _Evolution, batch: DeltaBatch) -> None:
        """ADD COLUMN ... DEFAULT gave every existing source row the default without a change
        event: rows the follower last wrote before the column appeared get it too."""
        table = DeltaTable.forPath(self.spark, plan.path)
        for f in plan.add:
            if f.name not in batch.defaults:
                continue
            since = batch.defaults[f.name][0]
            older = (
                f"_cdc_end_lsn IS NULL AND _cdc_start_lsn < {since}" if self.scd2 else f"_cdc_lsn < {since}"
            )
            table.update(older, {q(f.name): batch.default_value(f.name)})

    # ---- writes --------------------------------------------------------------------------------
    @staticmethod
    def _older_than(lsn: int, seq: int, prefix: str = "") -> str:
        return f"({prefix}_cdc_lsn < {lsn} OR ({prefix}_cdc_lsn = {lsn} AND {prefix}_cdc_seq < {seq}))"

    @property
    def wants_versions(self) -> bool:
        return self.scd2

    def apply(self, source: Batch, changes: NetChanges, cut_id: int) -> ApplyStats:
        path = self.path_of(source.table)
        stats = ApplyStats(str(source.table))
        # the batch with the columns named as the table stores them (sinks/delta/batch.py)
        batch = getattr(self, "_batches", {}).get(path) or DeltaBatch(source, self._names(path))
        changes = batch.changes(changes)
        fresh = path in getattr(self, "_created", set())
        replace = getattr(self, "_replaced", {}).get(path)
        if replace is not None and not self.scd2:
            stats.inserted = rebuild_scd1(
                self.spark, path, replace.current, replace.rename, batch, changes, cut_id, self.app_id
            )
            return stats
        if replace is not None:
            end_history(self.spark, path, replace.rename, replace.replace, batch, changes)
        if self.scd2:
            target = DeltaTable.forPath(self.spark, path)
            # each step is safe to run again (as after a crash), so a conflict retries them all
            scd2 = retry_conflicts(
                lambda: apply_scd2(self.spark, target, batch, changes, cut_id, self.app_id, fresh)
            )
            stats.inserted = scd2["inserted"]
            return stats
        # sinks/multiset.py; a derived view always has a key
        multiset = isinstance(source, TableBatch) and not source.schema.key and source.deletes > 0
        rs = self._writes_in_process(source, path)
        if fresh:
            if multiset:  # the cut's deletes remove rows the cut inserted (the table has none yet)
                content = [f.name for f in batch.spark_schema.fields]
                changes = NetChanges(multiset_source(changes.df, content, None), changes.unchanged)
            # A table made for this cut holds no row, so the MERGE's whole effect is inserting the
            # netted rows that are not deletes: an append does that without the join. A replay
            # (a crash before the checkpoint) finds the table made and MERGEs, which changes nothing.
            stats.inserted = retry_conflicts(lambda: self._append(path, batch, changes, cut_id, rs))
            self._retire(path, batch)
            return stats
        if self._appends(source):
            # rows the table cannot hold yet: the MERGE would only insert them (a replay of this cut
            # is skipped by Delta: same transaction id)
            stats.inserted = retry_conflicts(lambda: self._append(path, batch, changes, cut_id, rs))
            self._retire(path, batch)
            return stats
        if batch.bootstrap and batch.snapshot_lsn is not None and not fresh:
            # start over from the snapshot: every row of the older history committed before its point.
            # A keyless table's snapshot rows sit at the point with negative seqs (cdc.keys.snapshot_seq),
            # so a cut applied again after a crash before the checkpoint must not take them for older.
            older = f"_cdc_lsn < {batch.snapshot_lsn}"
            retry_conflicts(lambda: DeltaTable.forPath(self.spark, path).delete(older))
        if batch.truncate_position is not None and not fresh:
            older = self._older_than(*batch.truncate_position)
            retry_conflicts(lambda: DeltaTable.forPath(self.spark, path).delete(older))
        # a conflict with `cdc maintain` (OPTIMIZE) fails the commit without writing: merge again
        merge = self._merge_multiset if multiset else self._merge_rs if rs else self._merge
        metrics = retry_conflicts(lambda: merge(path, batch, changes, cut_id))
        self._retire(path, batch)
        if metrics is not None:
            stats.inserted = int(metrics["num_inserted_rows"])
            stats.updated = int(metrics["num_updated_rows"])
            stats.deleted = int(metrics["num_deleted_rows"])
        return stats

    def _retire(self, path: str, batch: DeltaBatch) -> None:
        if batch.retired and self.config.dropped_columns != "keep":  # sinks/delta/dropped.py
            from sinks.delta.dropped import retire_columns

            done = retire_columns(self.spark, path, sorted(batch.retired), self.config.dropped_columns)
            if done:
                how = (
                    "set NULL in every row"
                    if self.config.dropped_columns == "null"
                    else "dropped from the table"
                )
                logger.info(
                    f"sink {self.name}: {batch.table}: column(s) {', '.join(done)} dropped at the source: {how}"
                )

    def _appends(self, source: Batch) -> bool:
        """Whether none of the batch's keys can be in the table, so appending its rows does all the
        MERGE would (docs/follower-delta.md, "When a cut appends"). Provably, and only then:
        * the log promises an insert is of a key the table did not hold just before it (the
          embedded log and cdc's Kafka topics: TableBatch.inserts_new), and the range does not
          start at the table's base (a snapshot, a rebase, a rebuild: bootstrap batches MERGE);
        * every event of the range is an insert and the range has no gap (TableBatch.inserts_only:
          a compacted range may hold an insert without the delete before it). A key changed is a
          delete and an insert, a truncate is an event: both MERGE;
        * the table holds exactly the log up to the range: its marker is this follower's, of the
          same base, and the newest cut its commits carry is the one the checkpoint says last wrote
          it (`written_at`, when the checkpoint ended at the range's start); a marker of the older
          kind ends where the range starts. After `cdc reset --to-cut` the table is ahead of its
          checkpoint (it may hold the range's rows already): a table written after that cut has
          no `written_at` (pipelines/reset.py), so it MERGEs. A crash after the append and before
          the checkpoint leaves the table at the new cut: the replayed cut MERGEs with the same
          transaction id, which Delta skips.
        Then each key's first event since the table's position is an insert, so the source did not
        have the key at that position, and neither has the table. Rows written by hand are not
        covered (as the MERGE would overwrite them, the append would add a second row)."""
        if not isinstance(source, TableBatch):
            return False  # a derived view's changes (sinks/viewbatch.py) make no such promise
        if not (self.append_inserts and source.inserts_new) or source.bootstrap or source.base is None:
            return False
        if not source.inserts_only:
            return False
        held = Marker.from_json(self.read_marker(source.table))
        if held is None or held.same_follower != (self.pipeline.name, self.name, self.log_id, source.base):
            return False
        if held.end is not None:  # a marker of the older kind: it keeps the offset it ends at
            return held.end == source.first_offset
        return source.written_at is not None and held.cut_id == source.written_at

    def _writes_in_process(self, source: Batch, path: str) -> bool:
        """delta-rs writes this cut (sinks/delta/rswrite.py): a table's small cut, already in the
        driver (so its netted rows are few), into a table delta-rs writes as Spark would."""
        if self.settings.small_cuts != "delta-rs" or not isinstance(source, TableBatch):
            return False
        return source.in_driver and rswrite.writable(path)

    def _append(
        self, path: str, batch: DeltaBatch, changes: NetChanges, cut_id: int, rs: bool = False
    ) -> int:
        """The rows the MERGE's insert clause would write, appended; returns how many."""
        if rs and changes.arrow is not None:  # typed in the driver already: no Spark job
            import pyarrow.compute as pc

            held = changes.arrow
            columns = [*(f.name for f in batch.spark_schema.fields), *META_COLUMNS]
            return rswrite.append(
                path, held.filter(pc.not_equal(held["_cdc_op"], "d")).select(columns), self.app_id, cut_id
            )
        types = {f.name: f.dataType for f in batch.spark_schema.fields} | self._meta()
        columns = [*(f.name for f in batch.spark_schema.fields), *META_COLUMNS]
        rows = changes.df.where(F.col("_cdc_op") != "d").select(
            *(F.col(q(c)).cast(types[c]).alias(c) for c in columns)
        )
        if rs:
            return rswrite.append(path, rows.toArrow(), self.app_id, cut_id)
        # the idempotent write's id as writer options: the session confs of follower_write belong to
        # this sink's session, while a DataFrame write uses the session the batch was read in
        # (another one when tables are applied side by side)
        writer = rows.write.format("delta").mode("append")
        writer.option("txnAppId", self.app_id).option("txnVersion", str(cut_id)).save(path)
        return written_rows(self.spark, path, self.app_id, cut_id)

    def _merge(self, path: str, batch: DeltaBatch, changes: NetChanges, cut_id: int):
        on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in batch.key_columns)
        newer = f"NOT {self._older_than_cols()}"
        columns = [f.name for f in batch.spark_schema.fields]
        update: dict[str, str | Column] = {}
        for c in columns:
            flag = changes.unchanged.get(c)
            update[q(c)] = (
                F.when(F.col(f"s.{q(flag)}"), F.col(f"t.{q(c)}")).otherwise(F.col(f"s.{q(c)}"))
                if flag
                else F.col(f"s.{q(c)}")
            )
        for m in META_COLUMNS:
            update[q(m)] = F.col(f"s.{m}")
        insert: dict[str, str | Column] = {q(c): F.col(f"s.{q(c)}") for c in [*columns, *META_COLUMNS]}
        with follower_write(self.spark, self.app_id, cut_id):
            return (
                DeltaTable.forPath(self.spark, path)
                .alias("t")
                .merge(changes.df.alias("s"), on)
                .whenMatchedDelete(condition=f"s._cdc_op = 'd' AND {newer}")
                .whenMatchedUpdate(condition=f"s._cdc_op != 'd' AND {newer}", set=update)
                .whenNotMatchedInsert(condition="s._cdc_op != 'd'", values=insert)
                .execute()
                .first()
            )

    def _merge_rs(self, path: str, batch: DeltaBatch, changes: NetChanges, cut_id: int):
        """`_merge`'s MERGE, written by delta-rs: the same clauses in DataFusion's SQL."""
        c = rswrite.ident
        on = " AND ".join(f"t.{c(k)} = s.{c(k)}" for k in batch.key_columns)
        newer = f"NOT {self._older_than_cols()}"
        columns = [f.name for f in batch.spark_schema.fields]
        update: dict[str, str] = {}
        for name in columns:
            flag = changes.unchanged.get(name)
            value = f"s.{c(name)}"
            update[c(name)] = f"CASE WHEN s.{c(flag)} THEN t.{c(name)} ELSE {value} END" if flag else value
        for m in META_COLUMNS:
            update[c(m)] = f"s.{c(m)}"
        insert = {c(name): f"s.{c(name)}" for name in [*columns, *META_COLUMNS]}
        # netted in the driver already (TableBatch._net_in_driver): no Spark job
        rows = changes.arrow if changes.arrow is not None else changes.df.toArrow()
        metrics = rswrite.merge(
            path,
            rows,
            on=on,
            delete_when=f"s._cdc_op = 'd' AND {newer}",
            update_when=f"s._cdc_op != 'd' AND {newer}",
            update=update,
            insert_when="s._cdc_op != 'd'",
            insert=insert,
            app_id=self.app_id,
            cut_id=cut_id,
        )
        if metrics is None:
            return None
        return {
            "num_inserted_rows": metrics["num_target_rows_inserted"],
            "num_updated_rows": metrics["num_target_rows_updated"],
            "num_deleted_rows": metrics["num_target_rows_deleted"],
        }

    def _merge_multiset(self, path: str, batch: DeltaBatch, changes: NetChanges, cut_id: int):
        """A keyless table's cut with deletes: each removes one row of its content (sinks/multiset.py).
        The table is read inside the retried step, so a retry after a conflict chooses from a fresh read."""
        content = [f.name for f in batch.spark_schema.fields]
        restart = batch.bootstrap and batch.snapshot_lsn is not None  # a new base: history replayed whole
        held = self.spark.read.format("delta").load(path)  # the table as of now
        source = multiset_source(changes.df, content, held, restart)
        on = " AND ".join(f"t.{k} = s.{k}" for k in POSITION_KEY)
        insert: dict[str, str | Column] = {q(c): F.col(f"s.{q(c)}") for c in [*content, *META_COLUMNS]}
        with follower_write(self.spark, self.app_id, cut_id):
            return (
                DeltaTable.forPath(self.spark, path)
                .alias("t")
                .merge(source.alias("s"), on)
                .whenMatchedDelete(condition="s._cdc_op = 'd'")
                .whenNotMatchedInsert(condition="s._cdc_op != 'd'", values=insert)
                .execute()
                .first()
            )

    @staticmethod
    def _older_than_cols() -> str:
        """s is not newer than t: (s.lsn, s.seq) <= (t.lsn, t.seq)."""
        return "(s._cdc_lsn < t._cdc_lsn OR (s._cdc_lsn = t._cdc_lsn AND s._cdc_seq <= t._cdc_seq))"

    # ---- reads ---------------------------------------------------------------------------------
    def current(self, table: TableName, batch_schema: Batch | None = None) -> DataFrame | None:
        path = self.path_of(table)
        if not self._exists(path):
            return None
        rows = decoded(self.spark.read.format("delta").load(path))  # under the source's column names
        return rows.filter(F.col("_cdc_end_lsn").isNull()) if self.scd2 else rows
