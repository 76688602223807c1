"""Watermark-based chunked snapshots (DBLog, as Debezium's incremental snapshots do it), for big tables.

An exported snapshot holds one transaction (and its xmin, which stops vacuum everywhere) open for
as long as the biggest table takes to copy, and an interruption starts it over. A chunked
snapshot instead copies a table in key ranges of `chunk_rows` keys, several at once (`readers`
connections, `cdc snapshot --parallel`):

  0. the range: a cheap query walks the key's btree to the key `chunk_rows` keys further
     (snapshot/keyranges.py): the chunk is the closed range (lo, hi], the next one starts above
     hi. The table's last chunk is open-ended;
  1. low watermark: `pg_logical_emit_message(true, 'cdc_watermark', ...)` writes a logical message
     into the WAL (a small transaction of its own); its LSN is the chunk's low watermark L: the
     last watermark written before the chunk's read starts (the snapshot's first one, or the high
     watermark of a chunk read before). The first one waits until every transaction that was
     still in progress when it was written has ended, so that everything committed before it is
     visible to every chunk's read;
  2. the chunk: one short REPEATABLE READ transaction on a reader connection runs
     `COPY (SELECT ... WHERE key > lo AND key <= hi) TO STDOUT` into a segment file, and ends;
  3. high watermark H, written once the read is over. The running stream (`cdc stream`, or
     `cdc run`) receives the watermarks (pgoutput `messages 'true'`) as transactions, so its
     durable position passing H says the log holds every change committed inside (L, H);
  4. checkpoint: reads finish in any order; in chunk order, each segment goes into the log (not yet
     visible to readers) and the chunk (L, H, hi) into <state_dir>/chunked/<table>.json, so the
     checkpoint always names a prefix of the table: a killed snapshot resumes at the first chunk
     not committed (chunks read after it are read again; their files are overwritten, nothing is
     doubled). The segment's fsync runs while other chunks are read; the checkpoint follows it.

Once the stream has passed a chunk's H, the chunk is reconciled (snapshot/reconcile.py): rows whose
key has a whole-row stream event inside (L, H) are dropped, those events win. When every chunk is
in and the stream has passed every H, the log makes the chunks the table's new base at the first
low watermark L0 (LocalLog.finish_snapshot): every stream event of the table after L0 follows
them, so followers end exactly as the source (the proof is in snapshot/reconcile.py). That is also
why chunks read side by side are safe, though their windows overlap in time: each read sees
everything committed before L0, a key's last event after L0 (or, without one, its chunk row) is
its current row whichever chunk read it and when, a window only drops rows of its own chunk, and
one wider than the read (its L written long before the read started) drops only rows whose key
has a later whole-row event, which follows the base anyway. A row inserted into (or moved by a
key change into) a range already read is an event after L0: the stream delivers it. Nothing but
one transaction per reader is ever held open, and no slot or exported snapshot is created for it.

With no stream running (`cdc snapshot` on its own, or `cdc run` before it streams), the snapshot
streams itself up to the last high watermark (`cdc stream --until <H>`), as `cdc stream` would.

Here: one table's snapshot, coordinated (ChunkedSnapshot). Its parts beside it: the SQL on the
source (chunk_sql.py), the watermarks (watermarks.py), the checkpoint (chunk_checkpoint.py) and a
chunk reconciled in the log (chunk_reconcile.py, by the rule of reconcile.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import psycopg2

from cdc import metrics
from cdc.ground.lsn import format_lsn
from cdc.ground.private import private_dir, private_open
from cdc.ground.tables import TableName
from cdc.log.local import LocalLog
from cdc.source import connect
from snapshot.chunk_checkpoint import Checkpoint, ChunkMark, checkpoint_path
from snapshot.chunk_reconcile import reconcile_segment
from snapshot.chunk_sql import boundary_statement, chunk_statement, key_types, read_error
from snapshot.copier import count_lines
from snapshot.keyranges import InOrder, Key, KeyRange, range_from, throttle_delay
from snapshot.progress import RowProgress
from snapshot.watermarks import emit_watermark, stream_covers

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from cdc.ground.config import Pipeline


@dataclass
class _Read:
    """A chunk read into its segment's .part file whose fsync (`synced`) may still be running."""

    chunk: KeyRange
    tmp: Path
    path: Path
    rows: int
    nbytes: int
    synced: Future[None]


@dataclass
class _Copied:
    """A read chunk between its watermarks, waiting for its turn to join the log."""

    mark: ChunkMark
    read: _Read


def _sync_and_close(sink: IO[bytes]) -> None:
    try:
        os.fsync(sink.fileno())
    finally:
        sink.close()


@dataclass
class ChunkedTable:
    """What the runner knows about a table to copy in chunks (from its plan)."""

    table: TableName
    table_id: int
    relid: int
    columns: tuple[str, ...]
    key: tuple[str, ...]
    where: str | None
    estimated_rows: int
    schema_version: Callable[[int], int]  # the log's schema version of the table as of an LSN


@dataclass
class ChunkedResult:
    rows: int = 0
    chunks: int = 0
    dropped: int = 0
    resumed_at: int | None = None  # the chunk a resumed snapshot went on with
    first_low: int = 0  # the first low watermark: the position of the table's new base
    readers: int = 0  # reader connections that read chunks side by side


class ChunkedSnapshot:
    """One table's chunked snapshot. The coordinating thread plans ranges, writes the watermarks
    (one control connection) and commits chunks in order; `readers` threads, each with its own
    connection, only read chunks (COPY into segment files). The log is only touched by the
    coordinating thread."""

    def __init__(
        self,
        pipeline: Pipeline,
        log: LocalLog,
        target: ChunkedTable,
        *,
        resume: bool,
        progress: bool,
        catch_up: Callable[[int], None],
        readers: int = 1,
    ) -> None:
        self.pipeline = pipeline
        self.log = log
        self.t = target
        self.progress = progress
        self.catch_up = catch_up  # streams the log up to an LSN when no stream is running
        self.options = pipeline.snapshot
        self.cp_path = checkpoint_path(pipeline.state_path, target.table)
        self.resume = resume
        self.readers = max(1, readers)
        self.key_idx = tuple(target.columns.index(k) for k in target.key)
        self._latest: tuple[int, int] | None = None  # (lsn, log offset before it) of the last watermark
        self._local = threading.local()  # a reader thread's own connection
        self._conns: list = []  # every reader connection (cancelled on failure, closed at the end)
        self._conns_lock = threading.Lock()

    def run(self) -> ChunkedResult:
        dsn = self.pipeline.source.postgres.dsn
        t = self.t
        control = connect(
            dsn, application_name="cdc snapshot watermarks"
        )  # autocommit: one watermark (or range bound), one transaction
        result = ChunkedResult()
        try:
            types = key_types(control, t.table, t.key)
            cp = self._checkpoint(control, result)
            bar = RowProgress(f"snapshot {t.table}", t.estimated_rows or None, enabled=self.progress)
            bar.advance(cp.rows)
            metrics.SNAP_ESTIMATED.labels(self.pipeline.name, str(t.table)).set(max(t.estimated_rows, 0))
            metrics.SNAP_DONE.labels(self.pipeline.name, str(t.table)).set(0)
            try:
                self._copy_chunks(control, cp, types, bar, result)
            finally:
                bar.close()
            last_high = max((c.high for c in cp.chunks), default=None)
            if last_high is not None and not stream_covers(self.log, last_high):
                logger.info(
                    f"{t.table}: waiting for the stream to pass the last high watermark {format_lsn(last_high)}"
                )
                self.catch_up(last_high)
            self._reconcile_ready(cp, result)
            self.log.finish_snapshot(cp.snapshot_id, t.relid)
            # chunks a killed run read past the first one not committed, which this run's ranges
            # (bounded again from the table as it is now) may no longer number the same way
            for stray in self.log.segment_path(t.table_id, cp.snapshot_id, 0).parent.glob("*.part"):
                stray.unlink(missing_ok=True)
            metrics.SNAP_DONE.labels(self.pipeline.name, str(t.table)).set(1)
            self.cp_path.unlink(missing_ok=True)
            result.rows = cp.rows
            result.first_low = cp.first_low
            result.chunks = len(cp.chunks)
            result.readers = len(self._conns)  # the reader connections this run opened
            return result
        finally:
            control.close()
            for conn in self._conns:
                conn.close()

    def _copy_chunks(
        self, control, cp: Checkpoint, types: list[str], bar: RowProgress, result: ChunkedResult
    ) -> None:
        """Every chunk left: up to `readers` chunks read at once, at most 2 x `readers` read and not
        yet in the log (what a kill can cost), each joining the log and the checkpoint (_commit) in
        chunk order once its read is over."""
        name = (self.pipeline.name, str(self.t.table))
        started, planned = time.monotonic(), 0
        number, lo, planned_all = len(cp.chunks), cp.last_key, cp.complete
        order: InOrder[_Copied] = InOrder(number)
        reading: dict[Future[_Read], tuple[int, int, int]] = {}  # a read: (chunk, low, after of its window)
        window = 2 * self.readers
        with (
            ThreadPoolExecutor(self.readers, thread_name_prefix="cdc-chunk-read") as pool,
            ThreadPoolExecutor(1, thread_name_prefix="cdc-chunk-fsync") as syncer,
        ):
            upcoming: KeyRange | None = None  # the next range, bounded while chunks are read

            def bound_next() -> None:
                nonlocal upcoming, number, lo, planned_all
                if upcoming is None and not planned_all:
                    upcoming = self._next_range(control, types, number, lo)
                    number, lo, planned_all = number + 1, upcoming.hi, upcoming.last

            def fill() -> float:
                """Start reads while readers are free; the throttle's pause when it holds one back."""
                nonlocal upcoming, planned
                while len(reading) < self.readers and len(reading) + order.waiting < window:
                    bound_next()
                    if upcoming is None:
                        break
                    pause = throttle_delay(planned, self.options.max_rows_per_s, time.monotonic() - started)
                    if pause > 0:
                        return pause
                    low, after = self._latest or self._watermark(control, upcoming.number, "low")
                    reading[pool.submit(self._read, cp.snapshot_id, upcoming, types, syncer)] = (
                        upcoming.number,
                        low,
                        after,
                    )
                    upcoming, planned = None, planned + self.options.chunk_rows
                return 0.0

            try:
                while True:
                    pause = fill()
                    if not reading:
                        if upcoming is None and planned_all:
                            break
                        time.sleep(pause)
                        continue
                    bound_next()  # its index walk runs while the chunks are read
                    finished, _ = wait(reading, timeout=pause or None, return_when=FIRST_COMPLETED)
                    if not finished:
                        continue
                    done = [(reading[f], f.result()) for f in sorted(finished, key=lambda f: reading[f])]
                    for future in finished:
                        del reading[future]
                    fill()  # free readers go on before the bookkeeping of the chunks they read
                    # one high watermark after every read that finished: it closes all their windows
                    high, _ = self._watermark(control, done[-1][1].chunk.number, "high")
                    for (_, low, after), read in done:
                        chunk = read.chunk
                        mark = ChunkMark(
                            chunk.number, low, high, after, read.rows, chunk.hi, final=chunk.last
                        )
                        for ready in order.add(chunk.number, _Copied(mark, read)):
                            self._commit(cp, ready)
                            bar.detail = self._detail(len(cp.chunks))
                            bar.advance(ready.mark.rows)
                            metrics.SNAP_ROWS.labels(*name).inc(ready.mark.rows)
                    self._reconcile_ready(cp, result)
            except BaseException:
                self._cancel()  # the chunks in the log and the checkpoint stay: a restart goes on after them
                raise

    def _next_range(self, control, types: list[str], number: int, lo: Key | None) -> KeyRange:
        t = self.t
        statement = boundary_statement(t.table, t.key, types, lo, self.options.chunk_rows)
        try:
            with control.cursor() as cur:
                cur.execute(statement)
                found = [list(row) for row in cur.fetchall()]
        except psycopg2.Error as exc:
            raise read_error(t.table, exc) from None
        return range_from(number, lo, found)

    def _watermark(self, control, number: int, mark: str) -> tuple[int, int]:
        """Write a watermark; it opens the window of every chunk whose read starts after it."""
        after = self.log.end_offset_by_id(self.t.table_id)
        self._latest = (emit_watermark(control, self.t.table, number, mark), after)
        return self._latest

    def _reader(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(
                self.pipeline.source.postgres.dsn, autocommit=False, application_name="cdc snapshot chunk"
            )
            conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
            with self._conns_lock:
                self._conns.append(conn)
            self._local.conn = conn
        return conn

    def _cancel(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(psycopg2.Error):
                conn.cancel()

    def _detail(self, chunks: int) -> str:
        per_chunk = self.options.chunk_rows
        expected = max(chunks, -(-max(self.t.estimated_rows, 1) // per_chunk))
        return f"chunk {chunks}/~{expected}"

    def _checkpoint(self, control, result: ChunkedResult) -> Checkpoint:
        t = self.t
        cp = Checkpoint.load(self.cp_path)
        running = {sid for sid, tid, _lsn, _v in self.log.running_snapshots() if tid == t.table_id}
        if cp is not None and self.resume and cp.snapshot_id in running and cp.table == str(t.table):
            result.resumed_at = len(cp.chunks)
            logger.info(
                f"{t.table}: resuming the chunked snapshot at chunk {len(cp.chunks)} ({cp.rows:,} rows copied before)"
            )
            return cp
        for sid in running:
            self.log.abandon_snapshot(sid)
        after = self.log.end_offset_by_id(t.table_id)
        first_low = emit_watermark(control, t.table, 0, "low", first=True)
        snapshot_id = self.log.begin_snapshot(t.table_id, first_low, t.schema_version(first_low))
        cp = Checkpoint(self.cp_path, str(t.table), snapshot_id, first_low)
        cp.chunks = []
        cp.save()
        self._latest = (first_low, after)  # the first chunk's low watermark
        logger.info(
            f"{t.table}: chunked snapshot from {format_lsn(first_low)}, {self.options.chunk_rows:,} rows a chunk"
            f" (~{t.estimated_rows:,} rows)"
        )
        return cp

    def _read(self, snapshot_id: int, chunk: KeyRange, types: list[str], syncer: ThreadPoolExecutor) -> _Read:
        """Read one chunk (on a reader thread) into its segment's .part file, in one short
        transaction; its fsync starts on `syncer`."""
        t = self.t
        reader = self._reader()
        path = self.log.segment_path(t.table_id, snapshot_id, chunk.number)  # a path only: no log access here
        private_dir(path.parent)
        tmp = path.with_suffix(".part")
        statement = chunk_statement(t.table, t.columns, t.key, types, t.where, chunk)
        sink = private_open(tmp, "wb", buffering=4 << 20)
        try:
            with reader.cursor() as cur:
                cur.copy_expert(statement.as_string(reader), sink, size=1 << 20)
                rows = cur.rowcount  # COPY's own count ("COPY n"): no second pass over the file
            reader.rollback()  # the chunk's transaction ends here: nothing is held between chunks
            sink.flush()
            nbytes = sink.tell()
        except psycopg2.Error as exc:
            sink.close()
            reader.rollback()
            raise read_error(t.table, exc) from None
        except BaseException:
            sink.close()
            raise
        synced = syncer.submit(_sync_and_close, sink)  # runs while other chunks are read
        if rows < 0:
            rows = count_lines(tmp)
        return _Read(chunk, tmp, path, rows, nbytes, synced)

    def _commit(self, cp: Checkpoint, copied: _Copied) -> None:
        """A read chunk, once its segment is durable, joins the log and then the checkpoint: a restart
        goes on with the next chunk."""
        read, mark = copied.read, copied.mark
        read.synced.result()
        os.replace(read.tmp, read.path)
        self.log.add_segment(cp.snapshot_id, mark.number, read.path, mark.rows, read.nbytes)
        cp.chunks.append(mark)
        cp.complete = mark.final
        cp.save()

    def _reconcile_ready(self, cp: Checkpoint, result: ChunkedResult) -> None:
        changed = False
        for mark in cp.chunks:
            if mark.reconciled or not stream_covers(self.log, mark.high):
                continue
            counts = reconcile_segment(self.log, self.t.table_id, cp.snapshot_id, mark, self.key_idx)
            result.dropped += counts.dropped
            mark.rows = counts.kept
            mark.reconciled = changed = True
        if changed:
            cp.save()
