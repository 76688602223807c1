"""The exported snapshot's copy: a replication slot (the pipeline's own, or a temporary one when
it exists already) exports a snapshot at its consistent point, and a pool of workers COPY every
table's ctid chunks inside it (snapshot/copier.py) into the log, biggest tables first."""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading

import psycopg2

from cdc import metrics
from cdc.filters import CaptureFilter
from cdc.ground.config import Pipeline
from cdc.ground.errors import CdcError, SourceError
from cdc.ground.lsn import format_lsn
from cdc.ground.tables import TableName
from cdc.schema import TypeCache, build_schema, with_attnums
from snapshot.chunks import plan_chunks
from snapshot.copier import CopyDone, CopyJob, CopyPool
from snapshot.plan import SnapshotResult, connections, plan_tables, record_new_base
from snapshot.progress import RowProgress
from snapshot.slots import slot_with_snapshot

logger = logging.getLogger(__name__)


def copy_exported(
    pipeline, log, conn, server_version, targets, info, slot_exists, parallel, progress, filters=None
) -> SnapshotResult:
    dsn = pipeline.source.postgres.dsn
    slot = pipeline.slot if not slot_exists else f"cdc_tmp_{secrets.token_hex(4)}"
    workers = connections(parallel)
    types = TypeCache()
    logger.info(
        f"creating {'temporary ' if slot_exists else ''}replication slot {slot} with an exported snapshot "
        "(waits for transactions open right now to finish)"
    )
    with slot_with_snapshot(
        dsn,
        slot,
        temporary=slot_exists,
        server_version=server_version,
        failover=pipeline.source.postgres.failover,
    ) as snap:
        filters = filters or {}
        plans = plan_tables(
            dsn, snap.snapshot_name, targets, {t: info[t].key_columns for t in targets}, filters
        )
        jobs_by_table: dict[TableName, list[CopyJob]] = {}
        snapshot_ids: dict[TableName, int] = {}
        for plan in plans:
            table_id = log.ensure_table(plan.table)
            schema = with_attnums(
                build_schema(conn, plan.columns, plan.key, types, plan.extras), plan.attnums
            )
            version = log.schema_version(table_id, schema, snap.consistent_point)
            snapshot_id = snapshot_ids[plan.table] = log.begin_snapshot(
                table_id, snap.consistent_point, version
            )
            columns = tuple(c[0] for c in plan.columns)
            jobs_by_table[plan.table] = [
                CopyJob(
                    plan.table,
                    columns,
                    snapshot_id,
                    chunk,
                    log.segment_path(table_id, snapshot_id, chunk.number),
                    (filters.get(plan.table) or CaptureFilter(plan.table)).where,
                )
                for chunk in plan_chunks(plan.relpages, plan.relkind)
            ]
        n_jobs = sum(len(j) for j in jobs_by_table.values())
        for plan in plans:  # progress per table (docs/monitoring.md), by finished chunk
            metrics.SNAP_ESTIMATED.labels(pipeline.name, str(plan.table)).set(max(plan.reltuples, 0))
            metrics.SNAP_DONE.labels(pipeline.name, str(plan.table)).set(0)
        estimate = sum(p.reltuples for p in plans)
        bar = RowProgress(f"snapshot {pipeline.name}", estimate or None, enabled=progress)
        pool = CopyPool(dsn, snap.snapshot_name, min(workers, n_jobs), bar.advance)
        with contextlib.suppress(threading.BrokenBarrierError):
            pool.wait_imported()  # if a worker failed to import, its error is waiting on pool.results
    # The exported snapshot is now held by the workers' transactions; a temporary slot is gone.
    result = SnapshotResult(consistent_point=snap.consistent_point, created_slot=not slot_exists)
    logger.info(
        f"consistent point {format_lsn(snap.consistent_point)}: copying {len(plans)} table(s) in {n_jobs} chunk(s) with {pool.ready.parties - 1} worker(s)"
    )
    # Biggest tables first so workers finish together.
    order = sorted(plans, key=lambda p: -p.relpages)
    for plan in order:
        for job in jobs_by_table[plan.table]:
            pool.submit(job)
    pool.close()
    remaining = {t: len(j) for t, j in jobs_by_table.items()}
    rows = {t: 0 for t in jobs_by_table}
    try:
        while any(remaining.values()):
            item = pool.results.get()
            if isinstance(item, BaseException):
                raise _copy_error(item)
            assert isinstance(item, CopyDone)
            log.add_segment(
                item.job.snapshot_id, item.job.chunk.number, item.job.path, item.rows, item.nbytes
            )
            rows[item.job.table] += item.rows
            metrics.SNAP_ROWS.labels(pipeline.name, str(item.job.table)).inc(item.rows)
            remaining[item.job.table] -= 1
            if remaining[item.job.table] == 0:
                log.finish_snapshot(
                    snapshot_ids[item.job.table], info[item.job.table].oid
                )  # OID: followed across renames
                metrics.SNAP_DONE.labels(pipeline.name, str(item.job.table)).set(1)
                record_new_base(
                    pipeline, log, plans, item.job.table, snap.consistent_point, rows[item.job.table]
                )
    except BaseException:
        pool.cancel()
        raise
    finally:
        bar.close()
        pool.join()
    result.rows = rows
    return result


def create_slot(pipeline: Pipeline, server_version: int) -> SnapshotResult:
    pg = pipeline.source.postgres
    with slot_with_snapshot(
        pg.dsn, pipeline.slot, temporary=False, server_version=server_version, failover=pg.failover
    ) as snap:
        logger.info(f"created replication slot {pipeline.slot} at {format_lsn(snap.consistent_point)}")
    return SnapshotResult(consistent_point=snap.consistent_point, created_slot=True)


def _copy_error(exc: BaseException) -> BaseException:
    if isinstance(exc, CdcError):
        return exc
    if isinstance(exc, psycopg2.Error):
        message = (exc.pgerror or str(exc)).strip()
        if "permission denied" in message:
            return SourceError(
                f"snapshot copy failed: {message}", "GRANT SELECT on the table to the pipeline's role"
            )
        return SourceError(f"snapshot copy failed: {message}")
    return exc
