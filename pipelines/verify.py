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

This module runs it (each follower, its tables and views, in turn); the parts live beside it: the
source at the point (verify_source.py), the follower's position and what is excused
(verify_position.py), the rows compared in Spark (verify_compare.py), the report
(verify_report.py), derived views (verify_views.py).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession

from cdc.ground.config import Pipeline, pipeline_tables, sink_tables, sink_views
from cdc.ground.errors import CdcError, ExitCode
from cdc.ground.lsn import format_lsn
from cdc.ground.private import private_dir
from cdc.ground.tables import TableName
from cdc.log import empty_log_error, open_log_view
from cdc.source import connect
from cdc.source.slots import _slot
from cdc.tablewatch import catalog_oid, check_pipeline_source, raise_unless_captured
from pipelines.apply.readers import ChangeReader, change_reader
from pipelines.checkpoints import load_checkpoint
from pipelines.faults import out_of_memory_point
from pipelines.stages import stage
from pipelines.verify_compare import _typed_source, compare
from pipelines.verify_position import _changed_after, _history, _keyless_after, _pending, follower_columns
from pipelines.verify_report import SinkVerdict, _print
from pipelines.verify_source import SourceCopy, copy_source
from pipelines.verify_views import ViewCheck, view_columns, view_plans, view_schema
from sinks.registry import make_sink
from sinks.shaping import shape_of

logger = logging.getLogger(__name__)


def run_verify(
    pipeline: Pipeline,
    spark: SparkSession,
    sink_name: str | list[str] | None,
    wait_s: float,
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
            raise empty_log_error(pipeline)
        # followers follow the file's tables; those dropped in the source have nothing to compare with
        followed = pipeline_tables(pipeline, list(cut.tables))
        gone = gone_tables(conn, log, followed)
        report = check_pipeline_source(pipeline, conn, set(gone))
        raise_unless_captured(report)
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
        logger.info(f"source read at {format_lsn(source.point)} ({len(source.files)} table(s))")
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
    _print(verdicts, pipeline)
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
                excused = after(spark, reader, table, schema, source.point, end, shape, log.value_kind)
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


__all__ = ["run_verify"]
