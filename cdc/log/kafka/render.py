"""Staging-log ranges rendered as Kafka record batches, in the publisher or in worker processes.

Rendering (read the staging log, fill unchanged TOAST values, build the envelope, JSON,
headers, record encoding) is nearly all of the publisher's CPU; sending is a socket write per
1 MB batch. So a large range is split into parts (LocalLog.read_parts: runs of events and
slices of snapshot segment files) that a pool of worker processes renders in parallel, and
the publisher sends the finished batches in part order: the topic gets exactly the records a
single process would have produced, in the same order. Small ranges (one part) are rendered
in the publisher itself, with no pool round trip.

A worker opens the staging log read-only and keeps it; it never writes anything.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.pool import AsyncResult

from cdc.envelope import TRUNCATE_KEY, EnvelopeRenderer, speedups
from cdc.ground.errors import LogError
from cdc.ground.tables import TableName
from cdc.log.kafka import fastpath, keychange
from cdc.log.kafka.recordbatch import RecordsBody, batched, position_headers
from cdc.log.kafka.toast import fill_unchanged
from cdc.log.local import LocalLog, ReadPart, SegmentSlice

TASK_TIMEOUT_S = 600.0  # one part renders in seconds; this only catches a worker that is gone


@dataclass(frozen=True)
class RenderTask:
    log_path: str
    table: str
    part: ReadPart
    database: str  # source.db of the envelope
    name: str  # source.name (the topic prefix, as Debezium's logical server name)
    batch_bytes: int


def render_bodies(task: RenderTask, log: LocalLog) -> Iterator[RecordsBody]:
    """The part's records as batches of at most task.batch_bytes: a tombstone after each
    delete, the position in headers, updates' unchanged TOAST values filled in."""
    records = _records(task, log)
    if isinstance(records, list):  # rendered by cdc._render: batched there too
        return fastpath.bodies(records, task.batch_bytes)
    return batched(records, task.batch_bytes)


def _records(task: RenderTask, log: LocalLog) -> Iterable[tuple[bytes, bytes | None, bytes]]:
    """The part's records: a list when the C speedup rendered them, else an iterator."""
    table = TableName.parse(task.table)
    renderer = EnvelopeRenderer(task.database, task.name)
    if speedups():  # the same records, rendered by cdc._render (C) where it can
        if isinstance(task.part, SegmentSlice):
            return fastpath.snapshot_records(renderer, log, table, task.part)
        records = fastpath.event_records(renderer, log, table, task.part)
        if records is not None:
            return records
    return python_records(renderer, log, table, task.part)


def python_records(
    renderer: EnvelopeRenderer, log: LocalLog, table: TableName, part: ReadPart
) -> Iterator[tuple[bytes, bytes | None, bytes]]:
    """The part's records rendered in Python, unchanged TOAST values filled."""
    return keychange.mark(_positioned(renderer, log, table, part))


def _positioned(
    renderer: EnvelopeRenderer, log: LocalLog, table: TableName, part: ReadPart
) -> Iterator[tuple[keychange.Position, tuple[bytes, bytes | None, bytes]]]:
    position: tuple[int, int, int, int] | None = None
    headers = b""
    # Updates go out whole: compaction may drop the record an unchanged-TOAST value was in.
    for rec, key, value in renderer.records(fill_unchanged(log, table, log.read_part(table, part))):
        here = (rec.lsn, rec.seq, rec.commit_ts or 0, rec.schema_version)
        if here != position:  # a snapshot's rows all share one position: their headers are encoded once
            position = here
            headers = position_headers(*here)
        event = (rec.op, rec.lsn, rec.seq, rec.event_lsn)
        yield event, (key if key is not None else TRUNCATE_KEY, value, headers)


_WORKER_LOGS: dict[str, LocalLog] = {}


def _render_in_worker(task: RenderTask) -> list[RecordsBody]:
    log = _WORKER_LOGS.get(task.log_path)
    if log is None:
        from pathlib import Path

        log = _WORKER_LOGS[task.log_path] = LocalLog(Path(task.log_path), readonly=True)
    return list(render_bodies(task, log))


class RenderPool:
    """`workers` spawned processes; bodies() yields the tasks' batches in task order, with at
    most two tasks per worker rendered ahead (bounded memory when Kafka is slower)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = multiprocessing.get_context("spawn").Pool(workers)

    def bodies(self, tasks: Iterable[RenderTask]) -> Iterator[RecordsBody]:
        todo = iter(tasks)
        ahead: deque[AsyncResult[list[RecordsBody]]] = deque()
        for task in todo:
            ahead.append(self._pool.apply_async(_render_in_worker, (task,)))
            if len(ahead) >= 2 * self.workers:
                break
        while ahead:
            try:
                bodies = ahead.popleft().get(timeout=TASK_TIMEOUT_S)
            except multiprocessing.TimeoutError:  # a worker that died (e.g. killed) never answers
                raise LogError(
                    f"a Kafka render worker gave no result within {TASK_TIMEOUT_S:.0f}s",
                    "restart the stream (what was not published is still in the staging log); "
                    "`log.kafka.publisher_workers: 0` renders in the publisher itself",
                ) from None
            more = next(todo, None)
            if more is not None:
                ahead.append(self._pool.apply_async(_render_in_worker, (more,)))
            yield from bodies

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()
