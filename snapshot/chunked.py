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
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

import psycopg2
from psycopg2 import sql

from cdc import metrics
from cdc.filters import select_query
from cdc.ground.errors import SourceError
from cdc.ground.lsn import format_lsn, parse_lsn
from cdc.ground.private import private_dir, private_open
from cdc.ground.tables import TableName
from cdc.keys import key_from_copy_fields
from cdc.log.local import LocalLog, iter_segment_lines
from cdc.pgoutput import UNCHANGED, decode_tuple
from cdc.source import connect
from snapshot.copier import count_lines
from snapshot.keyranges import InOrder, Key, KeyRange, range_from, throttle_delay
from snapshot.progress import RowProgress
from snapshot.reconcile import Reconciled, WindowEvent, reconcile

if TYPE_CHECKING:
    from cdc.ground.config import Pipeline

WATERMARK_PREFIX = "cdc_watermark"
EMIT_SQL = "SELECT pg_logical_emit_message(true, %s, %s)"


# ---- checkpoints -------------------------------------------------------------------------------------
@dataclass
class ChunkMark:
    number: int
    low: int  # LSN of the low watermark message
    high: int  # LSN of the high watermark message
    after: int  # the table's last log offset before the low watermark: window events come after it
    rows: int
    # the chunk's upper key bound (key values as text; checkpoints written before chunks were key
    # ranges hold the chunk's last row); None: the open-ended last chunk, or an empty one
    last: list[str | None] | None
    reconciled: bool = False
    final: bool = False  # the table's last chunk: every row has been read


@dataclass
class Checkpoint:
    """A chunked snapshot in progress, in <state_dir>/chunked/<schema>.<table>.json."""

    path: Path
    table: str
    snapshot_id: int
    first_low: int
    chunks: list[ChunkMark] = field(default_factory=list)
    complete: bool = False  # the table's last chunk is in: every row has been read

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        chunks = [ChunkMark(**c) for c in data.pop("chunks")]
        return cls(path=path, chunks=chunks, **data)

    def save(self) -> None:
        private_dir(self.path.parent)
        body = asdict(self)
        body.pop("path")
        tmp = self.path.with_suffix(".tmp")
        with private_open(tmp, "w") as f:
            f.write(json.dumps(body, indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks)

    @property
    def last_key(self) -> list[str | None] | None:
        keys = [c.last for c in self.chunks if c.last is not None]
        return keys[-1] if keys else None


def checkpoint_path(state_dir: Path, table: TableName) -> Path:
    return Path(state_dir) / "chunked" / f"{table.schema}.{table.name}.json"


def discard_checkpoint(state_dir: Path, table: TableName) -> None:
    checkpoint_path(state_dir, table).unlink(missing_ok=True)


# ---- the source side ----------------------------------------------------------------------------------
def emit_watermark(conn, table: TableName, chunk: int, mark: str, *, first: bool = False) -> int:
    """Write a watermark into the WAL (autocommit: its own transaction); returns its LSN. `first`:
    the snapshot's first low watermark, the position of the table's new base: wait until what
    committed before it is visible (later chunks need no wait: a change committed before their
    low watermark but not visible to their read comes after that base in the log anyway)."""
    body = json.dumps({"table": str(table), "chunk": chunk, "mark": mark})
    try:
        with conn.cursor() as cur:
            cur.execute(EMIT_SQL, (WATERMARK_PREFIX, body))
            lsn = parse_lsn(cur.fetchone()[0])
    except psycopg2.errors.InsufficientPrivilege:
        conn.rollback()
        problem = watermark_right(conn) or (
            "the pipeline's role may not write WAL watermarks",
            "snapshot.mode: exported",
        )
        raise SourceError(f"chunked snapshot of {table}: {problem[0]}", problem[1]) from None
    if first:
        _wait_for_older_transactions(conn)
    return lsn


def _wait_for_older_transactions(conn) -> None:
    """Block until every transaction in progress now has ended. A transaction's commit record can
    be in the WAL before the transaction is visible to new snapshots; after this wait, everything
    that committed before the watermark is visible to the next chunk's read."""
    with conn.cursor() as cur:
        cur.execute("SELECT array_agg(x::text) FROM pg_snapshot_xip(pg_current_snapshot()) x")
        running = cur.fetchone()[0] or []
        while running:
            cur.execute(
                "SELECT array_agg(x) FROM unnest(%s::xid8[]) x WHERE pg_xact_status(x) = 'in progress'",
                (running,),
            )
            running = [str(x) for x in cur.fetchone()[0] or []]
            if running:
                time.sleep(0.02)


def watermark_right(conn) -> tuple[str, str] | None:
    """(problem, fix) when the connected role may not write watermarks (EXECUTE on
    pg_logical_emit_message, which PostgreSQL grants to PUBLIC unless an administrator revoked it)."""
    with conn.cursor() as cur:
        # the text variant by its arguments, not a fixed signature: PostgreSQL 17 added a 4th (flush)
        cur.execute(
            "SELECT current_user, p.oid::regprocedure::text, has_function_privilege(p.oid, 'EXECUTE')"
            " FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message'"
            " AND p.pronamespace = 'pg_catalog'::regnamespace AND p.proargtypes[2] = 'text'::regtype"
        )
        user, signature, allowed = cur.fetchone()
    if allowed:
        return None
    return (
        f"role {user} may not execute pg_logical_emit_message, which chunked snapshots write their WAL watermarks with",
        f"GRANT EXECUTE ON FUNCTION {signature} TO {user}; (or snapshot.mode: exported)",
    )


def key_types(conn, table: TableName, key: tuple[str, ...]) -> list[str]:
    """SQL type names of the key columns (the chunk query casts the last key's text back with them)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass"
            " AND attnum > 0 AND NOT attisdropped",
            (str(table),),
        )
        types = dict(cur.fetchall())
    return [types[k] for k in key]


def orderable_key(conn, table: TableName, key: tuple[str, ...]) -> bool:
    """Whether the key is exactly the columns of a valid unique btree index (a primary key is one):
    then `ORDER BY key` and `key > last` walk the table in one well-defined order."""
    if not key:
        return False
    with conn.cursor() as cur:
        cur.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam"
            " WHERE i.indrelid = %s::regclass AND i.indisunique AND i.indisvalid AND a.amname = 'btree'"
            " AND i.indnkeyatts = %s AND i.indexprs IS NULL AND i.indpred IS NULL"
            " AND (SELECT array_agg(attname::text ORDER BY attname) FROM pg_attribute WHERE attrelid = i.indrelid"
            "      AND attnum = ANY(i.indkey::int2[])) = (SELECT array_agg(k ORDER BY k) FROM unnest(%s::text[]) k))",
            (str(table), len(key), list(key)),
        )
        return bool(cur.fetchone()[0])


def _key_list(key: tuple[str, ...]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(k) for k in key)


def _key_bound(key: tuple[str, ...], types: list[str], op: str, bound: Key) -> sql.Composed:
    """`(k1, k2) > (CAST('v1' AS t1), ...)`: a row comparison the key's btree index answers."""
    values = sql.SQL(", ").join(
        sql.SQL("CAST({} AS {})").format(sql.Literal(v), sql.SQL(t))
        for v, t in zip(bound, types, strict=True)
    )
    return sql.SQL("({}) {} ({})").format(_key_list(key), sql.SQL(op), values)


def boundary_statement(
    table: TableName, key: tuple[str, ...], types: list[str], lo: Key | None, chunk_rows: int
) -> sql.Composed:
    """The keys at positions chunk_rows and chunk_rows + 1 above `lo`, in key order, as text
    (snapshot/keyranges.range_from reads them): a walk over the key's index, no rows read. It
    ignores the row filter, so every chunk spans the same share of the index."""
    keys = _key_list(key)
    walk = sql.SQL("SELECT {} FROM {}").format(keys, sql.Identifier(table.schema, table.name))
    if lo is not None:
        walk += sql.SQL(" WHERE {}").format(_key_bound(key, types, ">", lo))
    walk += sql.SQL(" ORDER BY {} OFFSET {} LIMIT 2").format(keys, sql.Literal(chunk_rows - 1))
    # the two keys found as text (cast outside: not for every key walked over); qualified names:
    # a bare ORDER BY "id" would sort by the output column "id", the text
    texts = sql.SQL(", ").join(sql.SQL("b.{}::text").format(sql.Identifier(k)) for k in key)
    ordered = sql.SQL(", ").join(sql.SQL("b.{}").format(sql.Identifier(k)) for k in key)
    return sql.SQL("SELECT {} FROM ({}) b ORDER BY {}").format(texts, walk, ordered)


def chunk_statement(
    table: TableName,
    columns: tuple[str, ...],
    key: tuple[str, ...],
    types: list[str],
    where: str | None,
    chunk: KeyRange,
) -> sql.Composed:
    """COPY of one chunk: the captured columns and rows (cdc.filters.select_query, as the
    publication sends them) with a key in (lo, hi]. No ORDER BY: a bounded range needs none, and
    the planner may pick any scan (the last, open-ended chunk of a small table: a plain seq scan)."""
    bounds: list[sql.Composable] = []
    if chunk.lo is not None:
        bounds.append(_key_bound(key, types, ">", chunk.lo))
    if chunk.hi is not None:
        bounds.append(_key_bound(key, types, "<=", chunk.hi))
    return sql.SQL("COPY ({}) TO STDOUT").format(select_query(table, columns, where, bounds))


def _read_error(table: TableName, exc: psycopg2.Error) -> SourceError:
    message = (exc.pgerror or str(exc)).strip()
    fix = "GRANT SELECT on the table to the pipeline's role" if "permission denied" in message else None
    return SourceError(f"chunked snapshot of {table}: {message}", fix)


# ---- the log side -------------------------------------------------------------------------------------
def window_events(log: LocalLog, table_id: int, mark: ChunkMark) -> Iterator[WindowEvent]:
    """The table's stream events committed inside the chunk's window (low, high)."""
    for lsn, op, key, payload in log.events_after(table_id, mark.after):
        if lsn <= mark.low:
            continue  # committed before the window (the stream appends in commit order)
        if lsn >= mark.high:
            return
        whole = op != "u" or payload is None or not any(v is UNCHANGED for v in decode_tuple(payload, 0)[0])
        yield WindowEvent(key, op, whole)


def reconcile_segment(
    log: LocalLog, table_id: int, snapshot_id: int, mark: ChunkMark, key_idx: tuple[int, ...]
) -> Reconciled:
    """Drop the chunk rows the window's events supersede, rewriting the segment file in place."""
    counts = Reconciled()
    path = log.segment_path(table_id, snapshot_id, mark.number)
    events = list(window_events(log, table_id, mark))
    if not events:
        counts.kept = mark.rows
        return counts
    tmp = path.with_suffix(".reconcile")
    rows = (
        (key_from_copy_fields(line.rstrip(b"\n").split(b"\t"), key_idx), line)
        for line in iter_segment_lines(path)
    )
    with private_open(tmp, "wb", buffering=1 << 20) as out:
        for line in reconcile(rows, events, counts):
            out.write(line)
        out.flush()
        os.fsync(out.fileno())
        nbytes = out.tell()
    os.replace(tmp, path)
    log.add_segment(snapshot_id, mark.number, path, counts.kept, nbytes)
    return counts


def stream_covers(log: LocalLog, lsn: int) -> bool:
    """Whether the log holds every transaction of the source committed up to watermark `lsn`.
    pg_logical_emit_message returns the end of the message's record, which is where its own
    transaction's commit record starts: the watermark transaction commits exactly at `lsn`."""
    position = log.stream_position()
    return position is not None and position[0] >= lsn


# ---- one table ------------------------------------------------------------------------------------------
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
        say: Callable[[str], None],
        catch_up: Callable[[int], None],
        readers: int = 1,
    ) -> None:
        self.pipeline = pipeline
        self.log = log
        self.t = target
        self.say = say
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
                self.say(
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
            raise _read_error(t.table, exc) from None
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
            self.say(
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
        self.say(
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
            raise _read_error(t.table, exc) from None
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


__all__ = [
    "WATERMARK_PREFIX",
    "Checkpoint",
    "ChunkedSnapshot",
    "ChunkedTable",
    "boundary_statement",
    "chunk_statement",
    "emit_watermark",
    "orderable_key",
    "reconcile_segment",
    "stream_covers",
    "watermark_right",
    "window_events",
]
