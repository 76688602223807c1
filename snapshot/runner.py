"""`cdc snapshot`: a consistent snapshot of the pipeline's tables into the log.

First run (no slot yet): create the publication and the slot with an exported snapshot;
every table is copied at the slot's consistent point, where streaming will start.

Later runs (slot exists, e.g. `--tables` for a table added to the pipeline, or tables whose
snapshot was interrupted): the tables are added to the publication first, so the stream
captures their changes from then on; then a *temporary* slot exports a fresh snapshot whose
consistent point separates "in the snapshot" from "in the stream" exactly. The log makes the
snapshot the table's new base and keeps only stream events newer than it (LocalLog.finish_snapshot).

Here: which tables are copied and how (snapshot.mode: exported or chunked), the publication, and
the Kafka publication of a snapshot. The copies themselves: exported.py (one exported snapshot,
a pool of COPY workers) and chunked.py (watermark chunks, table by table); plan.py holds what
both read of a table and the result.
"""

from __future__ import annotations

import functools
import logging
import time

import psycopg2

from cdc import metrics
from cdc.filters import CaptureFilter, publication_drift, refused, set_filters
from cdc.ground.config import Pipeline
from cdc.ground.errors import LogError, SourceError, UsageError
from cdc.ground.logsetup import prefixed
from cdc.ground.lsn import format_lsn
from cdc.ground.tables import TableName, TableSelector
from cdc.log import open_log
from cdc.rebase import save_state
from cdc.schema import TypeCache, build_schema, with_attnums
from cdc.source import (
    Problem,
    connect,
    ensure_publication,
    insert_publication,
    publication_names,
    resolve_tables,
)
from cdc.source.slots import _slot
from cdc.tablewatch import check_pipeline_source, gone_from_source, raise_unless_captured
from snapshot.chunk_sql import orderable_key
from snapshot.chunked import ChunkedSnapshot, ChunkedTable
from snapshot.exported import copy_exported, create_slot
from snapshot.plan import SnapshotResult, connections, plan_tables, record_new_base
from snapshot.progress import RowProgress
from snapshot.reconcile import choose_mode
from snapshot.watermarks import stream_covers

logger = logging.getLogger(__name__)


def bind_log_to_source(log, system_id: str, database: str, slot: str) -> None:
    """A log belongs to one database and slot; refuse to mix histories."""
    for key, value in (("source_system_id", system_id), ("source_database", database), ("slot", slot)):
        known = log.meta(key)
        if known is None:
            log.set_meta(key, value)
        elif known != value:
            raise LogError(
                f"the log at {log.path} was written for {key.replace('_', ' ')} {known!r}, not {value!r}",
                "point the pipeline at the right source, or `cdc teardown` it and snapshot again",
            )


def run_snapshot(
    pipeline: Pipeline,
    only: list[str] | None = None,
    parallel: int | None = None,
    *,
    progress: bool = True,
    mode: str | None = None,
) -> SnapshotResult:
    """`mode` overrides the pipeline's snapshot.mode (a re-base inside a stream takes "exported")."""
    started = time.monotonic()
    pg = pipeline.source.postgres
    conn = connect(pg.dsn, application_name="cdc snapshot")
    try:
        gone = gone_from_source(pipeline, conn)  # dropped tables the file still names: not a problem
        report = check_pipeline_source(pipeline, conn, gone)
        # a keyless table switched to REPLICA IDENTITY DEFAULT while followed: its `--tables` snapshot is
        # the fix (ensure_publication moves it to the insert-only publication); other snapshots warn
        report.problems = [p for p in report.problems if not _snapshot_fixes(p, only)]
        raise_unless_captured(report)
        server = report.server
        assert server is not None  # known once the checks passed
        info = {t.table: t for t in report.tables}
        all_tables = [t.table for t in report.tables]
        log = open_log(pipeline)
        try:
            bind_log_to_source(log, server.system_id, server.database, pipeline.slot)
            slot_exists = _slot(conn, pipeline.slot) is not None
            targets = _targets(conn, pipeline, log, all_tables, only, slot_exists)
            try:  # column lists / row filters changed since the publication got them: those tables need a new base
                drift = publication_drift(conn, pipeline.publication, report.filters)
            except psycopg2.Error as exc:
                raise refused(exc, pipeline.publication) from None
            for table, reason in drift.items():
                logger.info(
                    f"{table}: source.postgres.table_options changed ({reason}): the publication is set again and {table} snapshotted again"
                )
                if table not in targets:
                    targets.append(table)
            result = SnapshotResult()
            if not targets:
                logger.info(
                    "nothing to snapshot: every table of the pipeline is already in the log (use --tables to snapshot again)"
                )
                result.skipped = True
                if pipeline.log_config.kafka is not None:
                    _publish(pipeline, log, result, progress)  # finish an earlier, interrupted publication
                return result
            for table in targets:
                log.ensure_table(table)  # before the publication: a running stream must know the table
            _no_unread_publication(conn, pipeline, [info[t] for t in targets])
            try:
                added = ensure_publication(
                    conn, pipeline.publication, [info[t] for t in all_tables], report.filters, set(targets)
                )
                if drift:
                    for table, reason in drift.items():  # a crash from here on: the next stream re-bases them
                        save_state(
                            pipeline.state_path,
                            table,
                            state="needed",
                            reason=f"table_options changed ({reason})",
                        )
                    set_filters(conn, pipeline.publication, [report.filters[t] for t in drift])
            except psycopg2.Error as exc:
                raise refused(exc, pipeline.publication) from None
            if added:
                logger.info(f"publication {pipeline.publication}: added {', '.join(map(str, added))}")
            chunked = _chunked_tables(conn, pipeline, targets, info, mode)
            exported = [t for t in targets if t not in chunked]
            for snapshot_id, table_id, _lsn, _v in log.running_snapshots():
                if any(log.table_id(t) == table_id for t in exported):
                    log.abandon_snapshot(snapshot_id)  # its exported snapshot died with its process
            if exported:
                result = copy_exported(
                    pipeline,
                    log,
                    conn,
                    server.version,
                    exported,
                    info,
                    slot_exists,
                    parallel,
                    progress,
                    report.filters,
                )
            elif not slot_exists:  # chunked tables only: the slot must exist before their first watermark
                result = create_slot(pipeline, server.version)
            if chunked:
                _copy_chunked(
                    pipeline,
                    log,
                    conn,
                    chunked,
                    info,
                    report.filters,
                    slot_exists,
                    result,
                    progress,
                    parallel,
                )
            if pipeline.log_config.kafka is not None:
                _publish(pipeline, log, result, progress)
            result.seconds = time.monotonic() - started
            metrics.SNAP_SUCCESS.labels(pipeline.name).set(time.time())
            return result
        finally:
            log.close()
    finally:
        conn.close()


def _snapshot_fixes(problem: Problem, only: list[str] | None) -> bool:
    """Whether this snapshot is the problem's fix: it copies again the table the problem moves."""
    moved = problem.moved_by_snapshot
    for text in only or ():
        try:
            if moved is not None and TableSelector.parse(text).matches(moved):
                return True
        except ValueError:
            continue  # named again by _targets, with its message
    return False


def _targets(
    conn, pipeline: Pipeline, log, all_tables: list[TableName], only: list[str] | None, slot_exists: bool
) -> list[TableName]:
    if only:
        try:
            selectors = [TableSelector.parse(t) for t in only]
        except ValueError as exc:
            raise UsageError(f"--tables: {exc}") from None
        wanted, missing = resolve_tables(conn, selectors)
        if missing:
            raise SourceError(f"--tables: {', '.join(missing)} not found in the source database")
        outside = [t for t in wanted if t not in all_tables]
        if outside:
            raise UsageError(
                f"--tables: {', '.join(map(str, outside))} not in source.postgres.tables of {pipeline.name}",
                "add the table to the pipeline file first, then run `cdc snapshot --tables` for it",
            )
    else:
        wanted = list(all_tables)
    if not slot_exists:
        live = [t.table for t in log.tables() if t.state == "live"]
        if live:
            logger.info(
                f"replication slot {pipeline.slot} does not exist: the log's history has a gap; snapshotting every table again"
            )
        return list(all_tables)
    if only:
        return wanted
    states = {t.table: t.state for t in log.tables()}
    return [t for t in wanted if states.get(t) != "live"]


def _no_unread_publication(conn, pipeline: Pipeline, tables: list) -> None:
    """A keyless table's first snapshot creates the insert-only publication; a `cdc stream` already
    running does not read it (its publication_names are fixed when it starts) and would acknowledge
    the table's inserts unseen: refused while the slot is in use."""
    inserts = insert_publication(pipeline.publication)
    if (
        not any(t.insert_only for t in tables)
        or publication_names(conn, pipeline.publication) != pipeline.publication
    ):
        return
    slot = _slot(conn, pipeline.slot)
    if slot is not None and slot[2] is not None:
        raise SourceError(
            f"{', '.join(str(t.table) for t in tables if t.insert_only)} has no primary key and goes into the new "
            f"publication {inserts}, which the `cdc stream` running now does not read",
            "stop the running `cdc stream` / `cdc run`, run this snapshot, then start it again",
        )


def _chunked_tables(
    conn, pipeline: Pipeline, targets: list[TableName], info, forced: str | None
) -> list[TableName]:
    """The targets a chunked snapshot copies (snapshot.mode, per table; docs/snapshot-big-tables.md)."""
    chunked = []
    for table in targets:
        mode = forced or pipeline.snapshot.mode_for(table)
        if mode == "exported":
            continue
        with conn.cursor() as cur:
            cur.execute(
                "SELECT greatest(reltuples, 0)::bigint, relkind FROM pg_class WHERE oid = %s",
                (info[table].oid,),
            )
            reltuples, relkind = cur.fetchone()
        ordered = relkind in ("r", "p") and orderable_key(conn, table, info[table].key_columns)
        if choose_mode(mode, ordered, reltuples, pipeline.snapshot.auto_min_rows) == "chunked":
            chunked.append(table)
        elif mode == "chunked":
            logger.info(
                f"{table}: no orderable key (a primary key or a unique btree index on its key): exported snapshot instead of chunks"
            )
    return chunked


def _copy_chunked(
    pipeline,
    log,
    conn,
    tables,
    info,
    filters,
    resume: bool,
    result: SnapshotResult,
    progress,
    parallel=None,
) -> None:
    """Each table in watermark chunks (snapshot/chunked.py), one table after the other, each read by
    `parallel` reader connections side by side (default: as many as the exported snapshot's
    workers). `resume`: chunk checkpoints of an earlier run stay valid (not after the slot was
    created again: a gap)."""
    readers = connections(parallel)
    dsn = pipeline.source.postgres.dsn
    filters = filters or {}
    plans = plan_tables(dsn, None, tables, {t: info[t].key_columns for t in tables}, filters)
    types = TypeCache()
    for plan in plans:
        table_id = log.ensure_table(plan.table)
        schema = with_attnums(build_schema(conn, plan.columns, plan.key, types, plan.extras), plan.attnums)
        target = ChunkedTable(
            plan.table,
            table_id,
            info[plan.table].oid,
            tuple(c[0] for c in plan.columns),
            plan.key,
            (filters.get(plan.table) or CaptureFilter(plan.table)).where,
            plan.reltuples,
            functools.partial(log.schema_version, table_id, schema),
        )
        started = time.monotonic()
        done = ChunkedSnapshot(
            pipeline,
            log,
            target,
            resume=resume,
            progress=progress,
            catch_up=lambda lsn: _catch_up(pipeline, conn, log, lsn),
            readers=readers,
        ).run()
        result.rows[plan.table] = done.rows
        record_new_base(pipeline, log, plans, plan.table, done.first_low, done.rows)
        logger.info(
            f"{plan.table}: {done.rows:,} rows in {done.chunks} chunk(s) in {time.monotonic() - started:.1f}s"
            f" ({done.readers} reader(s); {done.dropped:,} chunk rows superseded by changes inside their window"
            + (f"; resumed at chunk {done.resumed_at}" if done.resumed_at is not None else "")
            + ")"
        )


def _catch_up(pipeline: Pipeline, conn, log, lsn: int) -> None:
    """Wait until the log holds the stream up to `lsn`: a running `cdc stream` gets there by
    itself; with none running, stream here up to it (as `cdc stream --until` would)."""
    from cdc.reader import run_stream

    while not stream_covers(log, lsn):
        slot = _slot(conn, pipeline.slot)
        if slot is not None and slot[2] is not None:
            time.sleep(0.2)  # a running stream holds the slot
            continue
        logger.info(f"no stream is running: streaming up to {format_lsn(lsn)}")
        try:
            with prefixed("catch-up: "):
                run_stream(pipeline, until=lsn + 1)
        except SourceError:
            slot = _slot(conn, pipeline.slot)
            if slot is None or slot[2] is None:
                raise
            # a `cdc stream` took the slot meanwhile: it gets there


def _publish(pipeline, log, result: SnapshotResult, progress: bool) -> None:
    """With `log: kafka`: publish the snapshot to the topics now, unless a running stream's
    publisher holds the pipeline (it publishes the snapshot as part of its next cut)."""
    from cdc.log.kafka.publisher import Publisher, publisher_lock

    with publisher_lock(log, wait=False) as held:
        if not held:
            logger.info("a running `cdc stream` publishes the snapshot to Kafka")
            return
        bar = RowProgress(f"publish {pipeline.name} to Kafka", result.total_rows or None, enabled=progress)
        publisher = Publisher(pipeline, log)
        try:
            started = time.monotonic()
            n = publisher.publish_once(bar.advance)
            logger.info(f"published {n:,} records to Kafka in {time.monotonic() - started:.1f}s")
        finally:
            bar.close()
            publisher.close()
