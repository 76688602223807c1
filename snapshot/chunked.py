"""Watermark-based chunked snapshots (DBLog, as Debezium's incremental snapshots do it), for big tables.

An exported snapshot holds one transaction (and its xmin, which stops vacuum everywhere) open for
as long as the biggest table takes to copy, and an interruption starts it over. A chunked
snapshot instead copies a table in key order, `chunk_rows` rows at a time:

  1. low watermark: `pg_logical_emit_message(true, 'cdc_watermark', ...)` writes a logical message
     into the WAL (a small transaction of its own); its LSN is the chunk's low watermark L. Then
     wait until every transaction that was still in progress when L was written has ended, so that
     everything committed before L is visible to the chunk's read;
  2. the chunk: one short REPEATABLE READ transaction runs `COPY (SELECT ... WHERE key > <last key>
     ORDER BY key LIMIT chunk_rows) TO STDOUT` into a segment file, and ends;
  3. high watermark H, the same way (it is also the next chunk's low watermark). The running
     stream (`cdc stream`, or `cdc run`) receives both messages (pgoutput `messages 'true'`) as
     transactions, so its durable position passing H says the log holds every change committed
     inside the window (L, H);
  4. checkpoint: the segment goes into the log (not yet visible to readers) and the chunk (L, H,
     last key) into <state_dir>/chunked/<table>.json, so a killed snapshot resumes at the next chunk.
     The segment's fsync runs while the next chunk is read; the checkpoint follows it.

Once the stream has passed a chunk's H, the chunk is reconciled (snapshot/reconcile.py): rows whose
key has a whole-row stream event inside (L, H) are dropped, those events win. When every chunk is
in and the stream has passed the last H, the log makes the chunks the table's new base at the first
low watermark L0 (LocalLog.finish_snapshot): every stream event of the table after L0 follows
them, so followers end exactly as the source (the proof is in snapshot/reconcile.py). Nothing but
one chunk's transaction is ever held open, and no slot or exported snapshot is created for it.

With no stream running (`cdc snapshot` on its own, or `cdc run` before it streams), the snapshot
streams itself up to the last high watermark (`cdc stream --until <H>`), as `cdc stream` would.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import psycopg2
from psycopg2 import sql

from cdc import metrics
from cdc.copytext import copy_text_unescape
from cdc.filters import select_query
from cdc.ground.errors import CdcError, SourceError
from cdc.ground.lsn import format_lsn, parse_lsn
from cdc.ground.private import private_dir, private_open
from cdc.ground.tables import TableName
from cdc.keys import key_from_copy_fields
from cdc.log.local import LocalLog, iter_segment_lines
from cdc.pgoutput import UNCHANGED, decode_tuple
from cdc.source import connect
from snapshot.copier import count_lines
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
    last: list[str | None] | None  # key values (text) of the chunk's last row; None: empty chunk
    reconciled: bool = False


@dataclass
class Checkpoint:
    """A chunked snapshot in progress, in <state_dir>/chunked/<schema>.<table>.json."""

    path: Path
    table: str
    snapshot_id: int
    first_low: int
    chunks: list[ChunkMark] = field(default_factory=list)
    complete: bool = False  # the last chunk was short: every row has been read

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


def chunk_statement(
    table: TableName,
    columns: tuple[str, ...],
    key: tuple[str, ...],
    types: list[str],
    where: str | None,
    last: list[str | None] | None,
    limit: int,
) -> sql.Composed:
    """COPY of the next chunk: the captured columns and rows (cdc.filters.select_query, as the
    publication sends them) with a key above the last chunk's, in key order."""
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    extra: list[sql.Composable] = []
    if last is not None:
        bound = sql.SQL(", ").join(
            sql.SQL("CAST({} AS {})").format(sql.Literal(v), sql.SQL(t))
            for v, t in zip(last, types, strict=True)
        )
        extra.append(sql.SQL("({}) > ({})").format(keys, bound))
    select = select_query(table, columns, where, extra)
    return sql.SQL("COPY ({} ORDER BY {} LIMIT {}) TO STDOUT").format(select, keys, sql.Literal(limit))


def last_line(path: Path) -> bytes | None:
    """The file's last line (without its newline), reading only its tail."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None
        step = 1 << 16
        start = size
        tail = b""
        while start > 0:
            start = max(0, start - step)
            f.seek(start)
            tail = f.read(size - start)
            if tail.rstrip(b"\n").rfind(b"\n") >= 0 or start == 0:
                break
        body = tail.rstrip(b"\n")
        return body[body.rfind(b"\n") + 1 :]


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
class _Copied:
    """A chunk read into its segment's .part file whose fsync (`synced`) may still be running."""

    mark: ChunkMark
    tmp: Path
    path: Path
    nbytes: int
    synced: Future[None]
    opens: tuple[int, int]  # (low, after) of the next chunk: this chunk's high watermark opens it


def _sync_and_close(sink: BinaryIO) -> None:
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


class ChunkedSnapshot:
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
        self.key_idx = tuple(target.columns.index(k) for k in target.key)
        self._first: tuple[int, int] | None = None  # (low, after) of a new snapshot's first watermark

    def run(self) -> ChunkedResult:
        dsn = self.pipeline.source.postgres.dsn
        t = self.t
        control = connect(
            dsn, application_name="cdc snapshot watermarks"
        )  # autocommit: one watermark, one transaction
        reader = connect(dsn, autocommit=False, application_name="cdc snapshot chunk")
        reader.set_session(isolation_level="REPEATABLE READ", readonly=True)
        result = ChunkedResult()
        try:
            types = key_types(control, t.table, t.key)
            cp = self._checkpoint(control, result)
            bar = RowProgress(f"snapshot {t.table}", t.estimated_rows or None, enabled=self.progress)
            bar.advance(cp.rows)
            metrics.SNAP_ESTIMATED.labels(self.pipeline.name, str(t.table)).set(max(t.estimated_rows, 0))
            metrics.SNAP_DONE.labels(self.pipeline.name, str(t.table)).set(0)
            try:
                self._copy_chunks(control, reader, cp, types, bar, result)
            finally:
                bar.close()
            if cp.chunks and not stream_covers(self.log, cp.chunks[-1].high):
                self.say(
                    f"{t.table}: waiting for the stream to pass the last high watermark {format_lsn(cp.chunks[-1].high)}"
                )
                self.catch_up(cp.chunks[-1].high)
            self._reconcile_ready(cp, result)
            self.log.finish_snapshot(cp.snapshot_id, t.relid)
            metrics.SNAP_DONE.labels(self.pipeline.name, str(t.table)).set(1)
            self.cp_path.unlink(missing_ok=True)
            result.rows = cp.rows
            result.first_low = cp.first_low
            result.chunks = len(cp.chunks)
            return result
        finally:
            control.close()
            reader.close()

    def _copy_chunks(
        self, control, reader, cp: Checkpoint, types: list[str], bar: RowProgress, result: ChunkedResult
    ) -> None:
        """Every chunk left, in key order. A chunk is read while the one before it becomes durable:
        that one's segment is fsynced on `syncer` meanwhile, and joins the log and the checkpoint
        (_commit) once the read is over."""
        name = (self.pipeline.name, str(self.t.table))
        started, copied = time.monotonic(), 0
        pending: _Copied | None = None
        last, complete = cp.last_key, cp.complete
        opening = self._first  # a resumed snapshot's next chunk writes its own low watermark
        with ThreadPoolExecutor(1, thread_name_prefix="cdc-chunk-fsync") as syncer:
            try:
                while not complete:
                    number = len(cp.chunks) + (pending is not None)
                    read = self._copy_chunk(
                        control, reader, cp.snapshot_id, number, last, opening, types, syncer
                    )
                    if pending is not None:
                        self._commit(cp, pending)
                    pending, mark, opening = read, read.mark, read.opens
                    last = mark.last if mark.last is not None else last
                    complete = mark.rows < self.options.chunk_rows
                    copied += mark.rows
                    bar.detail = self._detail(number + 1)
                    bar.advance(mark.rows)
                    metrics.SNAP_ROWS.labels(*name).inc(mark.rows)
                    self._reconcile_ready(cp, result)
                    self._throttle(started, copied)
            except CdcError:  # the chunk read before a failed one still counts as done
                if pending is not None and pending.synced.exception() is None:
                    self._commit(cp, pending)
                raise
            if pending is not None:
                self._commit(cp, pending)

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
        self._first = (first_low, after)
        self.say(
            f"{t.table}: chunked snapshot from {format_lsn(first_low)}, {self.options.chunk_rows:,} rows a chunk"
            f" (~{t.estimated_rows:,} rows)"
        )
        return cp

    def _copy_chunk(
        self,
        control,
        reader,
        snapshot_id: int,
        number: int,
        last: list[str | None] | None,
        opening: tuple[int, int] | None,
        types: list[str],
        syncer: ThreadPoolExecutor,
    ) -> _Copied:
        """Read chunk `number` (the rows after key `last`) between its watermarks into its segment's
        .part file; its fsync starts on `syncer`. `opening`: (low, after) of a watermark already
        written before this chunk (the snapshot's first one, or the chunk before's high watermark),
        else it writes its own."""
        t, log = self.t, self.log
        if opening is not None:
            low, after = opening
        else:
            after = log.end_offset_by_id(t.table_id)
            low = emit_watermark(control, t.table, number, "low")
        path = log.segment_path(t.table_id, snapshot_id, number)
        private_dir(path.parent)
        tmp = path.with_suffix(".part")
        statement = chunk_statement(t.table, t.columns, t.key, types, t.where, last, self.options.chunk_rows)
        sink = private_open(tmp, "wb", buffering=4 << 20)
        try:
            with reader.cursor() as cur:
                cur.copy_expert(statement.as_string(reader), sink, size=1 << 20)
                rows = cur.rowcount  # COPY's own count ("COPY n"): no second pass over the file
            reader.rollback()  # the chunk's transaction ends here: nothing is held between chunks
            sink.flush()  # into the page cache: last_line reads it back, the fsync comes later
            nbytes = sink.tell()
        except psycopg2.Error as exc:
            sink.close()
            reader.rollback()
            message = (exc.pgerror or str(exc)).strip()
            fix = (
                "GRANT SELECT on the table to the pipeline's role" if "permission denied" in message else None
            )
            raise SourceError(f"chunked snapshot of {t.table}: {message}", fix) from None
        except BaseException:
            sink.close()
            raise
        synced = syncer.submit(_sync_and_close, sink)  # runs while the next chunk is read
        # The high watermark is also the next chunk's low one (one WAL message and commit less per
        # chunk): the windows (low, high) then follow each other with no gap. A window that starts
        # earlier is as safe: the chunks become the base at the first low watermark and every stream
        # event after it follows them, so a whole-row event there supersedes the chunk row anyway.
        next_after = log.end_offset_by_id(t.table_id)
        high = emit_watermark(control, t.table, number, "high")
        if rows < 0:
            rows = count_lines(tmp)
        line = last_line(tmp)
        key = None
        if line is not None:
            fields = line.split(b"\t")
            key = [copy_text_unescape(fields[i].decode()) for i in self.key_idx]
        mark = ChunkMark(number, low, high, after, rows, key)
        return _Copied(mark, tmp, path, nbytes, synced, (high, next_after))

    def _commit(self, cp: Checkpoint, copied: _Copied) -> None:
        """A read chunk, once its segment is durable, joins the log and then the checkpoint: a restart
        goes on with the next chunk."""
        copied.synced.result()
        os.replace(copied.tmp, copied.path)
        mark = copied.mark
        self.log.add_segment(cp.snapshot_id, mark.number, copied.path, mark.rows, copied.nbytes)
        cp.chunks.append(mark)
        cp.complete = mark.rows < self.options.chunk_rows
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

    def _throttle(self, started: float, copied: int) -> None:
        limit = self.options.max_rows_per_s
        if limit:
            ahead = copied / limit - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)


__all__ = [
    "WATERMARK_PREFIX",
    "Checkpoint",
    "ChunkedSnapshot",
    "ChunkedTable",
    "chunk_statement",
    "emit_watermark",
    "orderable_key",
    "reconcile_segment",
    "stream_covers",
    "watermark_right",
    "window_events",
]
