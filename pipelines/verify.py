"""`cdc verify`: is each follower identical to the source? (exit 0 only if it is)

The source is read at an exact point: a temporary replication slot exports a snapshot whose
consistent point `cp` separates the transactions it contains from the later ones. The
follower has applied the log up to its own position L. They are compared when that is
meaningful, and the answer is exact either way:

* L < cp: the follower is comparable only if no captured change committed between L and cp.
  The log beyond the follower and, for what is not streamed yet, the slot itself
  (peeked, not consumed) are checked; if anything is pending the verdict is "behind"
  (exit 1). While `cdc stream`/`cdc run` is active verify waits up to --wait seconds first.
* L >= cp: keys the log shows changing at or after cp are excused (listed as such);
  every other difference is real.

Rows are compared in Spark: counts and an order-independent content hash per table first,
then a full outer join on the key for the first differing keys. The source side goes through
the same PostgreSQL-text -> Spark typing as apply, and the follower side is read as stored.
"""

from __future__ import annotations

import json
import secrets
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from psycopg2 import sql
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc.filters import CaptureFilter, select_query
from cdc.ground.config import Pipeline, pipeline_tables, sink_tables, sink_views
from cdc.ground.errors import CdcError, ExitCode
from cdc.ground.lsn import format_lsn
from cdc.ground.private import private_dir, private_open
from cdc.ground.tables import TableName
from cdc.ground.tables import spark_ident as q
from cdc.log import open_log_view
from cdc.log.base import Column, TableSchema
from cdc.log.history import History, position_in
from cdc.pgoutput import Begin, Relation, Truncate, decode
from cdc.schema import TypeCache, pgtype_to_dict
from cdc.source import connect, publication_names
from cdc.source.slots import _slot
from cdc.tablewatch import catalog_oid, check_pipeline_source
from pipelines.apply.readers import ChangeReader, change_reader
from pipelines.checkpoints import load_checkpoint
from pipelines.faults import out_of_memory_point
from pipelines.stages import stage
from pipelines.verify_views import ViewCheck, view_columns, view_plans, view_schema
from sinks.changes import typed_columns
from sinks.registry import make_sink
from sinks.shaping import Shape, shape_of, shape_rows
from snapshot.slots import slot_with_snapshot

SAMPLE_KEYS = 10


@dataclass
class TableVerdict:
    table: str
    source_rows: int = 0
    follower_rows: int = 0
    missing: int = 0  # in the source, not in the follower
    extra: int = 0  # in the follower, not in the source
    different: int = 0
    excused: int = 0  # differ, but changed after the verification point
    samples: list[str] = field(default_factory=list)
    missing_columns: list[str] = field(default_factory=list)  # the source has them, the follower does not
    # (old name, new name): renamed in the source, the follower still has the old name (compared under it)
    renamed_columns: list[tuple[str, str]] = field(default_factory=list)
    # (old name, new name, LSN): the same, but the log has the rename (at LSN): the follower's next apply brings it
    pending_renames: list[tuple[str, str, int]] = field(default_factory=list)
    # (name, LSN): added in the source, in the log at LSN, not applied by the follower yet (not compared)
    pending_columns: list[tuple[str, int]] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)  # said on the report: columns no follower can have

    @property
    def identical(self) -> bool:
        return (
            self.missing == self.extra == self.different == 0
            and not self.missing_columns
            and not self.renamed_columns
            and not self.pending_renames
            and not self.pending_columns
        )


@dataclass
class SinkVerdict:
    sink: str
    follower_lsn: int = 0
    tables: list[TableVerdict] = field(default_factory=list)
    behind: str | None = None
    error: str | None = None
    dropped: list[str] = field(default_factory=list)  # tables gone from the source: reported, not compared

    @property
    def identical(self) -> bool:
        return self.error is None and self.behind is None and all(t.identical for t in self.tables)


# ---- source side ----------------------------------------------------------------------------------
@dataclass
class SourceCopy:
    point: int
    files: dict[TableName, Path]
    # The log's schema restricted to columns the source has, plus columns the source has that the
    # log does not know yet (added since the table's last change): a follower lacks those.
    schemas: dict[TableName, TableSchema]
    generated: dict[TableName, list[str]] = field(default_factory=dict)  # not compared (see source_columns)
    # new name -> old name of columns renamed in the source since the log last saw the table
    renamed: dict[TableName, dict[str, str]] = field(default_factory=dict)


def source_columns(
    cur, table: TableName, schema: TableSchema
) -> tuple[tuple[Column, ...], list[str], dict[str, str]]:
    """The columns to compare for `table` as the source has it now (at the verification point):
    the log's columns the source still has, then the source's columns the log does not know,
    except generated ones, which PostgreSQL before 18 does not publish (and 18 only with
    publish_generated_columns): those no follower has, and they are returned to be named. Also
    returned: new name -> old name of each log column the source has renamed since (the same
    attnum under another name): the log learns of a rename with the table's next change, so a
    follower still has the old name until then."""
    cur.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod, a.attndims, a.attgenerated <> '', a.attnum"
        " FROM pg_attribute a"
        " JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (table.schema, table.name),
    )
    rows = cur.fetchall()
    present = {r[0] for r in rows}
    known = set(schema.column_names)
    cols = [c for c in schema.columns if c.name in present]
    cols += [
        Column(name, oid, mod, dims, attnum=attnum)
        for name, oid, mod, dims, generated, attnum in rows
        if not generated and name not in known
    ]
    now = {attnum: name for name, _o, _m, _d, _g, attnum in rows}
    renamed = {
        now[c.attnum]: c.name
        for c in schema.columns
        if c.attnum and c.name not in present and now.get(c.attnum) not in (None, *known)
    }
    generated = [name for name, _o, _m, _d, gen, _a in rows if gen and name not in known]
    return tuple(cols), generated, renamed


def follower_columns(
    history: History, follower_lsn: int, columns: tuple[Column, ...]
) -> dict[str, tuple[str | None, int | None]]:
    """Source columns (at the verification point, with their attnums) that a follower having applied
    the log up to `follower_lsn` has under another name or not at all, matched by attnum against
    the schema version it applied last (the newest one from at or before its position): name ->
    (the follower's name for it, None when it has not got it; the LSN of the log's first later
    version that brings the change, None when the log has not got the change yet)."""
    if not history:
        return {}
    applied = [i for i, (_v, since, _s) in enumerate(history) if since <= follower_lsn]
    at = applied[-1] if applied else 0
    have = history[at][2]
    out: dict[str, tuple[str | None, int | None]] = {}
    for c in columns:
        i = position_in(have, c)
        old = have.columns[i].name if i >= 0 else None
        if old == c.name:
            continue
        brings = next(
            (
                since
                for _v, since, schema in history[at + 1 :]
                if (j := position_in(schema, c)) >= 0 and schema.columns[j].name != old
            ),
            None,
        )
        out[c.name] = (old, brings)
    return out


def copy_source(
    pipeline: Pipeline,
    server_version: int,
    schemas: dict[TableName, TableSchema],
    directory: Path,
    filters: dict[TableName, CaptureFilter] | None = None,
) -> SourceCopy:
    """COPY every table at one exact point (a temporary slot's exported snapshot): of a table with
    source.postgres.table_options, `SELECT <columns> FROM t WHERE <where>` (what the log captures)."""
    filters = filters or {}
    dsn = pipeline.source.postgres.dsn
    files: dict[TableName, Path] = {}
    restricted: dict[TableName, TableSchema] = {}
    generated: dict[TableName, list[str]] = {}
    renamed: dict[TableName, dict[str, str]] = {}
    types = TypeCache()
    slot = f"cdc_verify_{secrets.token_hex(4)}"
    with slot_with_snapshot(dsn, slot, temporary=True, server_version=server_version) as snap:
        conn = connect(dsn, autocommit=False, application_name="cdc verify")
        try:
            conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snap.snapshot_name,))
                for table, schema in schemas.items():
                    cols, generated[table], renamed[table] = source_columns(cur, table, schema)
                    captured = filters.get(table) or CaptureFilter(table)
                    cols = tuple(c for c in cols if captured.keeps(c.name))
                    known = {**schema.types}
                    new_oids = {c.type_oid for c in cols if c.type_oid not in known}
                    known.update({o: pgtype_to_dict(t) for o, t in types.resolve(conn, new_oids).items()})
                    restricted[table] = TableSchema(cols, schema.key, known)
                    path = directory / f"{len(files)}.copy"
                    stmt = sql.SQL("COPY ({}) TO STDOUT").format(
                        select_query(table, [c.name for c in cols], captured.where)
                    )
                    with private_open(path, "wb") as f:  # the source's rows: owner-only
                        cur.copy_expert(stmt.as_string(conn), f, size=1 << 20)
                    files[table] = path
            conn.rollback()
        finally:
            conn.close()
        return SourceCopy(snap.consistent_point, files, restricted, generated, renamed)


def unstreamed_changes(
    conn, slot: str, publication: str, upto: int, after_commit: int, tables: set[TableName]
) -> int:
    """Changes to `tables` the slot still holds below `upto` (peeked, not consumed)."""
    rels: dict[int, TableName] = {}
    count = 0
    in_log = False
    with conn.cursor() as cur:
        cur.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL,"
            " 'proto_version', '1', 'publication_names', %s)",
            (slot, format_lsn(upto), publication),
        )
        for (data,) in cur:
            payload = bytes(data)
            kind = payload[:1]
            if kind == b"B":
                begin = decode(payload)
                assert isinstance(begin, Begin)
                in_log = begin.final_lsn <= after_commit  # already in the log
            elif kind == b"R":
                rel = decode(payload)
                assert isinstance(rel, Relation)
                rels[rel.relation_id] = TableName(rel.namespace, rel.name)
            elif kind in (b"I", b"U", b"D") and not in_log:
                relid = int.from_bytes(payload[1:5], "big")
                count += rels.get(relid) in tables
            elif kind == b"T" and not in_log:
                trunc = decode(payload)
                assert isinstance(trunc, Truncate)
                count += sum(rels.get(r) in tables for r in trunc.relation_ids)
    return count


# ---- comparison -------------------------------------------------------------------------------------
def _typed_source(
    spark: SparkSession, schema: TableSchema, path: Path, shape: Shape | None = None
) -> DataFrame:
    """The source's rows typed like apply types them; shaped (columns, masks) like the sink's when given."""
    raw = shape_rows(spark.read.format("cdccopy").option("paths", json.dumps([str(path)])).load(), shape)
    schema = shape.schema if shape is not None else schema
    typed = typed_columns(schema, [F.col("vals")[i] for i in range(len(schema.columns))])
    return raw.select(*(t.alias(n) for n, t, _ in typed))


def compare(
    spark: SparkSession,
    schema: TableSchema,
    source: DataFrame,
    follower: DataFrame | None,
    excused: DataFrame | None,
    table: str,
    renamed: dict[str, str] | None = None,
    since: int | None = None,
    columns: dict[str, tuple[str | None, int | None]] | None = None,
) -> TableVerdict:
    """`renamed`: new name -> old name of source columns renamed since the log last saw the table;
    a follower that has the old name and not the new one is compared under the old name.
    `columns`: what `follower_columns` says of the follower's columns (by attnum, through the log's
    schema history): a column the log has renamed is compared under the follower's old name, one
    the log has added is not compared; both are named as not applied yet.
    `since`: a keyless table's follower rows committed at or after it are excused (past the source's
    point) when the log's changes past it are not given; with them (`excused` of a keyless table:
    typed rows with `__op`, from _keyless_after), the source at the point plus the rows inserted since
    is compared with the follower plus the rows deleted since (a multiset equation that holds
    through deletes of one of two identical rows)."""
    verdict = TableVerdict(table)
    names = [c.name for c in schema.columns]
    keys = list(schema.key)
    if follower is None:
        follower = source.limit(0)
    if not keys and excused is not None:
        verdict.excused = excused.count()
    elif not keys and since is not None and "_cdc_lsn" in follower.columns:
        later = F.col("_cdc_lsn") >= since
        verdict.excused = follower.filter(later).count()
        follower = follower.filter(~later)
    old: dict[str, str] = {}
    for n in names:
        if n in follower.columns:
            continue
        was, brings = (columns or {}).get(n, (None, None))
        if was is not None and was in follower.columns:
            old[n] = was
            if brings is None:
                verdict.renamed_columns.append((was, n))
            else:
                verdict.pending_renames.append((was, n, brings))
        elif was is None and brings is not None and n not in keys:
            verdict.pending_columns.append((n, brings))
        elif (o := (renamed or {}).get(n)) is not None and o in follower.columns:
            old[n] = o
            verdict.renamed_columns.append((o, n))
    if verdict.pending_columns:  # the follower's next apply brings them: the rest is compared
        pending = {n for n, _ in verdict.pending_columns}
        names = [n for n in names if n not in pending]
        source = source.select(*(q(n) for n in names))
    missing_cols = [n for n in names if n not in follower.columns and n not in old]
    verdict.missing_columns = missing_cols
    follower = follower.select(
        *(
            F.col(q(old.get(n, n))).cast(source.schema[n].dataType).alias(n)
            if n in follower.columns or n in old
            else F.lit(None).cast(source.schema[n].dataType).alias(n)
            for n in names
        )
    )

    if not keys and excused is not None:
        after = excused.select(*(q(n) for n in names), "__op")
        source = source.select(*(q(n) for n in names)).unionByName(
            after.where(F.col("__op") != "d").drop("__op")
        )
        follower = follower.unionByName(after.where(F.col("__op") == "d").drop("__op"))

    def fingerprint(df):
        return df.agg(
            F.count(F.lit(1)).alias("n"), F.bit_xor(F.xxhash64(*(F.col(q(n)) for n in names))).alias("h")
        ).first()

    s, f = fingerprint(source), fingerprint(follower)
    verdict.source_rows, verdict.follower_rows = s["n"], f["n"]
    if s["n"] == f["n"] and s["h"] == f["h"] and not missing_cols:
        return verdict
    if not keys:
        return _multiset_differences(verdict, source, follower, names)
    on = [F.col(f"s.{q(k)}") == F.col(f"f.{q(k)}") for k in keys]
    joined = source.alias("s").join(follower.alias("f"), on=on, how="full_outer")
    s_present = F.col(f"s.{q(keys[0])}").isNotNull()
    f_present = F.col(f"f.{q(keys[0])}").isNotNull()
    same = F.lit(True)
    for n in names:
        same = same & F.col(f"s.{q(n)}").eqNullSafe(F.col(f"f.{q(n)}"))
    kind = F.when(~f_present, "missing").when(~s_present, "extra").when(~same, "different")
    diffs = joined.select(
        *(F.coalesce(F.col(f"s.{q(k)}"), F.col(f"f.{q(k)}")).alias(k) for k in keys), kind.alias("__kind")
    ).filter(F.col("__kind").isNotNull())
    if excused is not None:
        excused_keys = diffs.join(excused, on=keys, how="left_semi")
        verdict.excused = excused_keys.count()
        diffs = diffs.join(excused, on=keys, how="left_anti")
    for row in diffs.groupBy("__kind").count().collect():
        setattr(verdict, row["__kind"], row["count"])
    for row in diffs.limit(SAMPLE_KEYS).collect():
        key = ", ".join(f"{k}={row[k]!r}" for k in keys)
        verdict.samples.append(f"{row['__kind']}: {key}")
    return verdict


def _multiset_differences(
    verdict: TableVerdict, source: DataFrame, follower: DataFrame, names: list[str]
) -> TableVerdict:
    """A keyless table: rows compared as multisets (EXCEPT ALL both ways, NULLs equal); the first
    differing rows are named by their values with how many more (missing) or fewer (extra) copies."""
    missing, extra = source.exceptAll(follower), follower.exceptAll(source)
    verdict.missing, verdict.extra = missing.count(), extra.count()
    for kind, df in (("missing", missing), ("extra", extra)):
        for row in df.groupBy(*(q(n) for n in names)).count().limit(SAMPLE_KEYS).collect():
            values = ", ".join(f"{n}={row[n]!r}" for n in names)
            verdict.samples.append(f"{kind}: {row['count']} row(s) ({values})")
    return verdict


def _keyless_after(
    spark,
    reader: ChangeReader,
    table: TableName,
    schema: TableSchema,
    point: int,
    upto: int,
    shape: Shape | None = None,
) -> DataFrame | None:
    """A keyless table's logged rows at or after `point` (up to offset `upto`), typed, with `__op`
    ('c'/'r' inserted, 'd' deleted: the whole deleted row); None if there are none."""
    first = reader.first_offset_from(spark, table, point, upto)
    if first is None:
        return None
    raw = shape_rows(reader.read_changes(spark, table, first - 1, upto, schema), shape)
    schema = shape.schema if shape is not None else schema
    typed = typed_columns(schema, [F.col("vals")[i] for i in range(len(schema.columns))])
    return raw.filter((F.col("op") != "t") & (F.col("lsn") >= point)).select(
        *(t.alias(n) for n, t, _ in typed), F.col("op").alias("__op")
    )


def _changed_after(
    spark,
    reader: ChangeReader,
    table: TableName,
    schema: TableSchema,
    point: int,
    upto: int,
    shape: Shape | None = None,
) -> DataFrame | None:
    """Typed keys the log changed at or after `point` (up to offset `upto`); None if there are none.
    With the sink's shape, keys are as the follower has them (a hashed key column)."""
    first = reader.first_offset_from(spark, table, point, upto)
    if first is None:
        return None
    raw = shape_rows(reader.read_changes(spark, table, first - 1, upto, schema), shape)
    schema = shape.schema if shape is not None else schema
    key_schema = TableSchema(
        tuple(c for c in schema.columns if c.name in schema.key), schema.key, schema.types
    )
    idx = [schema.column_names.index(c.name) for c in key_schema.columns]
    typed = typed_columns(key_schema, [F.col("vals")[i] for i in idx])
    return raw.filter(F.col("op") != "t").select(*(t.alias(n) for n, t, _ in typed)).distinct()


# ---- orchestration ----------------------------------------------------------------------------------
def run_verify(
    pipeline: Pipeline,
    spark: SparkSession,
    sink_name: str | list[str] | None,
    wait_s: float,
    say: Callable[[str], None],
) -> int:
    names = [sink_name] if isinstance(sink_name, str) else list(sink_name or [])
    sinks = [pipeline.sink(n) for n in names] if names else list(pipeline.sinks)
    if not sinks:
        from cdc.ground.errors import UsageError

        raise UsageError(f"pipeline {pipeline.name} has no sinks to verify", "add one under `sinks:`")
    conn = connect(pipeline.source.postgres.dsn, application_name="cdc verify")
    log = open_log_view(pipeline)
    reader = change_reader(log)
    workdir = Path(tempfile.mkdtemp(prefix="verify-", dir=_ensure(pipeline.state_path)))
    try:
        cut = log.latest_cut()
        if cut is None:
            from cdc.ground.errors import LogError

            raise LogError("the log is empty", f"run `{pipeline.command('snapshot')}` first")
        # followers follow the file's tables; those dropped in the source have nothing to compare with
        followed = pipeline_tables(pipeline, list(cut.tables))
        gone = gone_tables(conn, log, followed)
        report = check_pipeline_source(pipeline, conn, set(gone))
        report.raise_if_problems()
        all_tables = [t for t in followed if t not in gone]
        wanted = {t for s in sinks for t in sink_tables(s, all_tables)}
        # derived views: their base tables are read from the source too (pipelines/verify_views.py)
        plans = view_plans(pipeline, sinks, all_tables, log)
        wanted |= {t for plan in plans.values() for t in plan.tables}
        schemas = {t: log.schema(t) for t in wanted}
        for s in sinks:  # a sink's table_options naming a column the table lacks: exit 2 before reading
            for t in sink_tables(s, all_tables):
                shape_of(s, t, schemas[t])
        server = report.server
        assert server is not None  # check_pipeline_source reads it before anything else
        with stage(f"reading {len(schemas)} source table(s) at one snapshot"):
            source = copy_source(pipeline, server.version, schemas, workdir, report.filters)
        say(f"source read at {format_lsn(source.point)} ({len(source.files)} table(s))")
        out_of_memory_point("verify:compare", spark)
        views = ViewCheck(pipeline, spark, reader, plans)
        verdicts = [_verify_sink(pipeline, spark, conn, log, reader, s, source, wait_s, views) for s in sinks]
        for sink_cfg, verdict in zip(sinks, verdicts, strict=True):
            ckpt = load_checkpoint(pipeline.state_path, sink_cfg.name, pipeline.file)
            for t in sink_tables(sink_cfg, list(gone)):
                verdict.dropped.append(_dropped_line(t, gone[t], ckpt, cut.tables[t].end))
    finally:
        reader.close()
        log.close()
        conn.close()
        shutil.rmtree(workdir, ignore_errors=True)
    _print(verdicts, say, pipeline)
    return int(ExitCode.OK if all(v.identical for v in verdicts) else ExitCode.DIFFERENCE)


def gone_tables(conn, log, tables: list[TableName]) -> dict[TableName, int | None]:
    """Tables of the log that are gone from the source (marked dropped in the log, or no longer in
    the catalog) -> the LSN up to which the log has their changes (None: not marked yet)."""
    states = {s.table: s for s in log.tables()}
    out: dict[TableName, int | None] = {}
    for t in tables:
        st = states.get(t)
        if st is not None and st.state == "dropped":
            out[t] = st.dropped_lsn
        elif catalog_oid(conn, t) is None:
            out[t] = None
    return out


def _dropped_line(table: TableName, lsn: int | None, ckpt, end: int) -> str:
    applied = ckpt.tables.get(str(table))
    if lsn is None:
        state = "no longer in the source (dropped or renamed); `cdc stream` marks it dropped in the log once it has its last changes"
    else:
        state = f"dropped in the source; the log has every change it had (up to {format_lsn(lsn)})"
        state += (
            "; the follower has applied them all and keeps its rows"
            if applied and applied[1] >= end
            else "; the follower has not applied the last of them yet (run `cdc apply`)"
        )
    return f"{table}: not compared: {state}"


def _ensure(path: Path) -> Path:
    return private_dir(path)


def _verify_sink(
    pipeline,
    spark,
    conn,
    log,
    reader: ChangeReader,
    sink_cfg,
    source: SourceCopy,
    wait_s: float,
    views: ViewCheck | None = None,
) -> SinkVerdict:
    verdict = SinkVerdict(sink_cfg.name)
    tables = [t for t in sink_tables(sink_cfg, list(source.files)) if t in source.files]
    ckpt = load_checkpoint(pipeline.state_path, sink_cfg.name, pipeline.file)
    deadline = time.monotonic() + wait_s
    slot = _slot(conn, pipeline.slot)
    while (
        ckpt.lsn < source.point and slot is not None and slot[2] is not None and time.monotonic() < deadline
    ):
        time.sleep(0.5)  # a stream is running: give the follower time to pass the verification point
        ckpt = load_checkpoint(pipeline.state_path, sink_cfg.name, pipeline.file)
    verdict.follower_lsn = ckpt.lsn
    if ckpt.cut_id == 0:
        verdict.behind = "this follower has never been applied (run `cdc apply`)"
        return verdict
    if ckpt.lsn < source.point:
        pending = _pending(conn, pipeline, spark, log, reader, ckpt, tables, source.point)
        if pending:
            verdict.behind = (
                f"{pending} change(s) committed before the verification point are not applied yet"
            )
            return verdict
    view_lsn = None
    if views is not None and sink_views(sink_cfg):
        view_lsn, verdict.behind, verdict.error = views.position(sink_cfg, ckpt)
        if verdict.behind or verdict.error:
            return verdict
        base = views.base_checkpoint()
        assert view_lsn is not None
        if view_lsn < source.point:  # the view's base tables must not have changed since its cut
            pending = _pending(
                conn, pipeline, spark, log, reader, base, views.base_tables(sink_cfg), source.point
            )
            if pending:
                verdict.behind = f"{pending} change(s) of its views' base tables committed before the verification point are not in the views yet"
                return verdict
    try:
        sink = make_sink(sink_cfg, pipeline, spark)
        for table in tables:
            schema = source.schemas[table]
            # the sink's columns and masks (table_options): the source is compared shaped the same way
            shape = shape_of(sink_cfg, table, schema)
            excused = None
            if ckpt.lsn >= source.point:  # the follower is past the point: what it applied since
                end = ckpt.tables.get(str(table), [0, 0])[1]
                after = _changed_after if schema.key else _keyless_after
                excused = after(spark, reader, table, schema, source.point, end, shape)
            with stage(f"sink {sink_cfg.name}: {table}: comparing with the source"):
                current = sink.current(table)
                verdict.tables.append(
                    compare(
                        spark,
                        shape.schema if shape is not None else schema,
                        _typed_source(spark, schema, source.files[table], shape),
                        current,
                        excused,
                        str(table),
                        source.renamed.get(table),
                        source.point if ckpt.lsn >= source.point else None,
                        follower_columns(_history(log, table), ckpt.lsn, schema.columns),
                    )
                )
            verdict.tables[-1].not_compared = source.generated.get(table, [])
        if views is not None:
            for name in sink_views(sink_cfg):
                _verify_view(views, sink, name, source, view_lsn or 0, verdict)
                if verdict.behind:
                    return verdict
    except CdcError as exc:
        verdict.error = str(exc)
    return verdict


def _history(log, table: TableName) -> History:
    """The log's schema versions of `table`, oldest first (none from a log that keeps no history)."""
    history = getattr(log, "schema_history", None)
    return history(table) if history is not None else []


def _verify_view(
    views: ViewCheck, sink, name: str, source: SourceCopy, view_lsn: int, verdict: SinkVerdict
) -> None:
    """One view of the sink: its SQL over the source copy against the follower's `views.<name>`."""
    plan = views.plans[name]
    columns, key = view_columns(views.pipeline, name)
    sources = {t: _typed_source(views.spark, source.schemas[t], source.files[t]) for t in plan.tables}
    excused = None
    if view_lsn >= source.point:
        excused, told = views.excused(plan, sources, source.schemas, source.point)
        if not told:
            verdict.behind = (
                f"view {name} is maintained by full recomputation and its base tables changed after the "
                "verification point, so changed rows cannot be told apart: run `cdc verify` again when the source is quiet"
            )
            return
    with stage(f"sink {verdict.sink}: views.{name}: comparing with the view's SQL over the source"):
        verdict.tables.append(
            compare(
                views.spark,
                view_schema(columns, key),
                views.rows(plan, sources, columns),
                views.follower(sink, name, columns, key),
                excused,
                f"views.{name}",
            )
        )


def _pending(
    conn, pipeline, spark, log, reader: ChangeReader, ckpt, tables: list[TableName], point: int
) -> int:
    """Captured changes committed before `point` that the follower has not applied."""
    count = 0
    cut = log.latest_cut()
    for table in tables:
        rng = cut.tables.get(table)
        applied = ckpt.tables.get(str(table))
        if rng is None:
            continue
        after = applied[1] if applied and applied[0] == rng.base else rng.base - 1
        count += reader.count_events(spark, table, after, rng.end, point)
    position = log.stream_position()
    log_lsn = max(cut.lsn, position[1] if position else 0)
    if log_lsn < point:
        slot = _slot(conn, pipeline.slot)
        if slot is not None and slot[2] is None:
            count += unstreamed_changes(
                conn,
                pipeline.slot,
                publication_names(conn, pipeline.publication),
                point,
                position[0] if position else cut.lsn - 1,
                set(tables),
            )
        elif slot is not None:
            count += 1  # a stream holds the slot and has not reached the point yet: cannot rule anything out
    return count


def _print(verdicts: list[SinkVerdict], say: Callable[[str], None], pipeline: Pipeline | None = None) -> None:
    for v in verdicts:
        if v.error:
            say(f"sink {v.sink}: ERROR {v.error}")
            continue
        for line in v.dropped:
            say(f"sink {v.sink}: {line}")
        if v.behind:
            say(
                f"sink {v.sink}: NOT VERIFIED, follower at {format_lsn(v.follower_lsn)} is behind: {v.behind}"
            )
            continue
        for t in v.tables:
            mark = "identical" if t.identical else "DIFFERENT"
            extra = (
                f" ({t.excused} key(s) changed after the verification point, excused)" if t.excused else ""
            )
            say(
                f"sink {v.sink}: {t.table}: {mark}: source {t.source_rows:,} rows, follower {t.follower_rows:,}{extra}"
            )
            if t.not_compared:
                say(
                    f"    not compared: generated column(s) {', '.join(t.not_compared)}: PostgreSQL does not publish them "
                    "(before 18; on 18 the publication keeps publish_generated_columns = none), so followers do not have them"
                )
            if t.missing_columns:
                tables = shlex.quote(t.table)
                snap = (
                    pipeline.command("snapshot", "--tables", tables)
                    if pipeline
                    else f"cdc snapshot PIPELINE --tables {tables}"
                )
                say(
                    f"    column(s) the follower does not have: {', '.join(t.missing_columns)} (added in the source; the log "
                    f"learns of a new column with the table's next change; `{snap}` brings it at once, then "
                    f"`{pipeline.command('apply', '--once', '--sink', v.sink) if pipeline else 'cdc apply PIPELINE --once'}`)"
                )
            apply_cmd = (
                pipeline.command("apply", "--once", "--sink", v.sink)
                if pipeline
                else "cdc apply PIPELINE --once"
            )
            if t.pending_columns:
                say(
                    f"    column(s) the follower does not have: "
                    f"{', '.join(f'{n} (added in the source, in the log at {format_lsn(lsn)}, not applied yet)' for n, lsn in t.pending_columns)}; "
                    f"not compared until then. `{apply_cmd}` brings it (or wait for `cdc run`); no rebuild is needed"
                )
            if t.pending_renames:
                say(
                    f"    column(s) the follower has under their old name: "
                    f"{', '.join(f'{o} (renamed in the source: {o} -> {n}, in the log at {format_lsn(lsn)}, not applied yet)' for o, n, lsn in t.pending_renames)}; "
                    f"their values were compared under the old name. `{apply_cmd}` brings the rename "
                    "(or wait for `cdc run`); no rebuild is needed"
                )
            if t.renamed_columns:
                say(
                    f"    column(s) the follower has under their old name: "
                    f"{', '.join(f'{o} (now {n})' for o, n in t.renamed_columns)}; their values were compared "
                    "under the old name. The column was renamed in the source after the table's last change "
                    "the log has: the table's next change (at once with `cdc ddl install`, which brings a "
                    f"DDL to the log at its commit) brings the rename to the log, and `"
                    f"{pipeline.command('apply', '--once', '--sink', v.sink) if pipeline else 'cdc apply PIPELINE --once'}`"
                    " to the follower; no rebuild is needed"
                )
            if not t.identical and (t.missing or t.extra or t.different):
                say(f"    missing {t.missing:,}, extra {t.extra:,}, different {t.different:,}; first keys:")
                for s in t.samples:
                    say(f"      {s}")
                if pipeline is not None:  # rows lost or changed behind the tool's back (README Operations)
                    say(
                        f"  fix: if the follower lost or changed rows itself, rebuild it: "
                        f"`{pipeline.command('reset', '--sink', v.sink, '--rebuild', '--yes')}`, "
                        f"then `{pipeline.command('apply', '--once', '--sink', v.sink)}`"
                    )
    ok = all(v.identical for v in verdicts)
    say("verify: all followers identical to the source" if ok else "verify: differences found")


__all__ = ["Column", "compare", "run_verify"]
