"""The embedded log backend: one SQLite database (WAL mode) plus snapshot segment files.

Layout of <path>/:
  log.db                       SQLite: tables, schemas, snapshots, segments, cuts, meta, and one
                               event table ev_<id> per source table (offset = INTEGER PRIMARY KEY)
  segments/t<id>/s<snap>/c<chunk>.copy
                               snapshot rows exactly as COPY TO STDOUT (text format) printed them

Events hold what the source sent, undecoded: pgoutput TupleData bytes for stream events and
COPY text for snapshot rows. Decoding happens when the log is read (here, in `cdc log read`,
and in Spark executors), which keeps capture as fast as PostgreSQL can send.

A snapshot becomes part of a table's history through marker rows (op 'S', one per segment
file) appended when the snapshot finishes; the first marker is the table's new `base`.
Events the stream appended for the table while it was snapshotting and that are newer than
the snapshot are copied forward behind the markers in the same transaction, so offsets stay
in position order (see DESIGN notes in README "Guarantees").
"""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Collection, Container, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from cdc.ground.errors import LogError
from cdc.ground.formats import LOCAL_LOG, VERSION, check_version
from cdc.ground.private import private_dir, private_file
from cdc.ground.remedy import Command, placeholder
from cdc.ground.tables import TableName
from cdc.keys import key_from_copy_fields
from cdc.log.base import ChangeRow, Cut, LogReader, LogRecord, LogWriter, TableRange, TableSchema, TableState
from cdc.log.history import position_in
from cdc.pgoutput import UNCHANGED, decode_tuple

FORMAT_VERSION = str(LOCAL_LOG.version)  # meta `format` (cdc/ground/formats.py)

_DDL = """
CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tables(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    schema_name TEXT NOT NULL, table_name TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    base INTEGER, snapshot_lsn INTEGER,
    purged_below INTEGER NOT NULL DEFAULT 0,
    UNIQUE(schema_name, table_name));
CREATE TABLE IF NOT EXISTS schemas(
    table_id INTEGER NOT NULL, version INTEGER NOT NULL, body TEXT NOT NULL, since_lsn INTEGER NOT NULL,
    PRIMARY KEY(table_id, version));
CREATE TABLE IF NOT EXISTS snapshots(
    id INTEGER PRIMARY KEY AUTOINCREMENT, table_id INTEGER NOT NULL, lsn INTEGER NOT NULL,
    schema_version INTEGER NOT NULL, state TEXT NOT NULL, started_ms INTEGER NOT NULL,
    finished_ms INTEGER, rows INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS segments(
    id INTEGER PRIMARY KEY AUTOINCREMENT, snapshot_id INTEGER NOT NULL, chunk INTEGER NOT NULL,
    path TEXT NOT NULL, rows INTEGER NOT NULL, bytes INTEGER NOT NULL, UNIQUE(snapshot_id, chunk));
CREATE TABLE IF NOT EXISTS cuts(
    id INTEGER PRIMARY KEY AUTOINCREMENT, lsn INTEGER NOT NULL, ts_ms INTEGER NOT NULL, tables TEXT NOT NULL);
"""

_EV_DDL = (
    "CREATE TABLE IF NOT EXISTS ev_{id}("
    "off INTEGER PRIMARY KEY AUTOINCREMENT, lsn INTEGER NOT NULL, seq INTEGER NOT NULL, op TEXT NOT NULL,"
    " key BLOB, payload BLOB, before BLOB, before_kind TEXT, sv INTEGER NOT NULL,"
    " xid INTEGER, ts INTEGER, elsn INTEGER)"
)
_EV_INSERT = (
    "INSERT INTO ev_{id}(lsn, seq, op, key, payload, before, before_kind, sv, xid, ts, elsn)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
_EV_COLUMNS = "off, lsn, seq, op, key, payload, before, before_kind, sv, xid, ts, elsn"
KEEP_CUTS = 200

# sqlite3 sends bytes and None parameters down a slow path (a failed adapter lookup that builds
# and drops an exception, ~1 µs each); explicit identity adapters skip it. bytes and NoneType are
# not "base types" to sqlite3, so ints and strs keep their fast path. Process-wide and harmless.
sqlite3.register_adapter(bytes, bytes)
sqlite3.register_adapter(type(None), lambda _none: None)


def _now_ms() -> int:
    return int(time.time() * 1000)


def open_db(
    path: Path, synchronous: str = "full", readonly: bool = False, command: Command = placeholder
) -> sqlite3.Connection:
    """A connection to <path>/log.db; autocommit mode, explicit BEGIN IMMEDIATE for writes."""
    db_file = path / "log.db"
    if readonly:
        if not db_file.exists():
            raise LogError(f"no log at {path}", f"run `{command('snapshot')}` first")
        conn = sqlite3.connect(f"file:{db_file}?mode=ro", uri=True, isolation_level=None, timeout=60, check_same_thread=False)
    else:
        private_dir(path)
        private_file(db_file)  # SQLite gives its -wal/-shm files the database file's mode
        conn = sqlite3.connect(db_file, isolation_level=None, timeout=60, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
    conn.execute("PRAGMA busy_timeout=60000")
    return conn


# ---- decoding, usable without a LocalLog (Spark executors open the file themselves) -------------
def decode_text_tuple(payload: bytes | None) -> list | None:
    """pgoutput TupleData -> [str | None | UNCHANGED, ...]."""
    if not payload:
        return None
    values, _ = decode_tuple(payload, 0)
    return [v.decode() if isinstance(v, bytes) else v for v in values]


def iter_segment_lines(path: Path, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The lines (newline kept) of a segment file; with start/end only the lines that begin at a
    byte in [start, end) (so slices of one file split it without overlap)."""
    with open(path, "rb") as f:
        if start:
            f.seek(start - 1)
            pos = start - 1 + len(f.readline())  # the line holding byte start-1 belongs to the slice before
        else:
            pos = 0
        for line in f:
            if end is not None and pos >= end:
                return
            pos += len(line)
            yield line


def iter_segment_positions(path: Path, start: int = 0, end: int | None = None) -> Iterator[list]:
    """As iter_segment, each line's fields followed by the byte offset the line starts at (the
    position of a keyless table's snapshot row: cdc.keys.snapshot_seq)."""
    with open(path, "rb") as f:
        if start:
            f.seek(start - 1)
            pos = start - 1 + len(f.readline())
        else:
            pos = 0
        for line in f:
            if end is not None and pos >= end:
                return
            fields: list = line.rstrip(b"\n").split(b"\t")
            fields.append(pos)
            pos += len(line)
            yield fields


def iter_segment(path: Path, start: int = 0, end: int | None = None) -> Iterator[list[bytes]]:
    """Fields (still COPY-escaped) of each line of iter_segment_lines."""
    for line in iter_segment_lines(path, start, end):
        yield line.rstrip(b"\n").split(b"\t")


def snapshot_record(table: TableName, part: SegmentSlice, schema: TableSchema, line: bytes) -> LogRecord:
    """One line (newline removed) of a snapshot segment slice as the 'r' record read_part gives."""
    fields = line.split(b"\t")
    key = key_from_copy_fields(fields, schema.key_indexes)
    values = copy_fields_to_values(fields)
    commit_ts = part.ts_ms * 1000 if part.ts_ms else None  # snapshot rows: the snapshot's time
    return LogRecord(
        table, part.off, part.lsn, 0, "r", key, values, None, None, schema, None, commit_ts, part.lsn, part.version
    )


def event_record(table: TableName, row: tuple, schema: TableSchema) -> LogRecord:
    """One stored event row (columns _EV_COLUMNS) as the record read_part gives."""
    off, lsn, seq, op, key, payload, before, before_kind, sv, xid, ts, elsn = row
    values, before_values = decode_text_tuple(payload), decode_text_tuple(before)
    return LogRecord(
        table, off, lsn, seq, op, key, values, before_values, before_kind, schema, xid, ts, elsn, sv
    )


@dataclass(frozen=True)
class EventRun:
    """Event rows after < off <= upto (snapshot markers excluded: their rows are SegmentSlices)."""

    after: int
    upto: int


@dataclass(frozen=True)
class SegmentSlice:
    """The lines of a snapshot segment file (path relative to the log) starting in [start, end),
    read as the rows of the marker at offset `off`."""

    off: int
    lsn: int
    version: int
    path: str
    start: int
    end: int
    ts_ms: int = 0  # when the snapshot started (its rows' commit time; 0: not known)


ReadPart = EventRun | SegmentSlice


def copy_fields_to_values(fields: list[bytes]) -> list[str | None]:
    from cdc.keys import unescape

    # Most fields hold no backslash: decoded without a function call each.
    return [f.decode() if b"\\" not in f else None if f == b"\\N" else unescape(f).decode() for f in fields]


def column_defaults(history: list[tuple[int, TableSchema]]) -> dict[str, tuple[int, str]]:
    """From (since LSN, schema) versions, oldest first: fast-default columns of the newest schema
    -> (LSN the column appeared at, default text)."""
    if not history:
        return {}
    out = {}
    for col in history[-1][1].columns:
        if col.missing is None:
            continue
        # The newest unbroken run of versions that have the column tells when it was added.
        since = history[-1][0]
        for lsn, schema in reversed(history):
            if position_in(schema, col) < 0:  # by attnum: a rename does not make the column new
                break
            since = lsn
        out[col.name] = (since, col.missing)
    return out


# Columns added to `tables` after the first format: the source relation's OID (a table is
# followed by it across renames) and the LSN the stream had passed when it saw the table gone.
_TABLE_COLUMNS = {"relid": "INTEGER", "dropped_lsn": "INTEGER"}


def _add_table_columns(db: sqlite3.Connection) -> None:
    have = {r[1] for r in db.execute("PRAGMA table_info(tables)")}
    for name, kind in _TABLE_COLUMNS.items():
        if name not in have:
            db.execute(f"ALTER TABLE tables ADD COLUMN {name} {kind}")


class LocalLog(LogWriter, LogReader):
    def __init__(self, path: Path, synchronous: str = "full", readonly: bool = False, command: Command = placeholder):
        self.path = Path(path)
        self.readonly = readonly
        self._command = command  # builds the commands of fix: lines (cdc/ground/remedy.py)
        self.db = open_db(self.path, synchronous, readonly, command)
        self._check_format()
        if not readonly:
            self.db.executescript(_DDL)
            _add_table_columns(self.db)
            if self._meta("format") is None:
                self._set_meta("format", FORMAT_VERSION)
            if self._meta("cdc_version") != VERSION:  # the last release that wrote to it
                self._set_meta("cdc_version", VERSION)
            if self._meta("log_id") is None:
                self._set_meta("log_id", uuid.uuid4().hex[:12])
        self._in_batch = False
        # called with each committed cut (cdc stream with log: kafka rings its publisher with it)
        self.on_commit: Callable[[Cut], object] | None = None
        self._snapshot_lsn: dict[int, int] = {}
        self._schemas: dict[tuple[int, int], TableSchema] = {}
        self._latest_version: dict[int, tuple[int, TableSchema]] = {}
        self.set_retention(KEEP_CUTS, KEEP_CUTS, 0, None)  # no holds: the newest KEEP_CUTS (open_log sets the pipeline's)
        self._alarmed: dict[str, int] = {}

    def close(self) -> None:
        if self._in_batch:
            self.rollback()
        self.db.close()

    # ---- meta ------------------------------------------------------------------------------------
    def _check_format(self) -> None:
        """FormatTooNew (exit 5) when a newer cdc wrote this log in a format this one cannot read."""
        try:
            found = self._meta("format")
            writer = self._meta("cdc_version")
        except sqlite3.OperationalError:  # a new, empty database: no meta table yet
            return
        check_version(LOCAL_LOG, found, f"the log at {self.path}", writer)

    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT v FROM meta WHERE k = ?", (key,)).fetchone()
        return row[0] if row else None

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT INTO meta(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (key, value))

    def meta(self, key: str) -> str | None:
        return self._meta(key)

    @property
    def log_id(self) -> str:
        """A random id given to this log when it was created (cut ids are only unique within it)."""
        return self._meta("log_id") or ""

    def set_meta(self, key: str, value: str) -> None:
        with self.write():
            self._set_meta(key, value)

    # ---- transactions ----------------------------------------------------------------------------
    def _begin(self) -> None:
        if not self._in_batch:
            self.db.execute("BEGIN IMMEDIATE")
            self._in_batch = True
            # Read under the write lock: a snapshot finishing in another process cannot slip in.
            self._snapshot_lsn = dict(self.db.execute("SELECT id, snapshot_lsn FROM tables WHERE snapshot_lsn IS NOT NULL"))

    class _Write:
        def __init__(self, log: LocalLog):
            self.log = log
            self.owned = False

        def __enter__(self) -> LocalLog:
            self.owned = not self.log._in_batch
            self.log._begin()
            return self.log

        def __exit__(self, exc_type, exc, tb) -> None:
            if not self.owned:
                return
            self.log._in_batch = False
            if not exc_type:
                self.log.db.execute("COMMIT")
            elif self.log.db.in_transaction:  # SQLite rolls back by itself after some errors
                self.log.db.execute("ROLLBACK")

    def write(self) -> LocalLog._Write:
        """`with log.write():` one SQLite write transaction (joins an open batch if any)."""
        return LocalLog._Write(self)

    def rollback(self) -> None:
        if self._in_batch:
            if self.db.in_transaction:  # SQLite rolls back by itself after some errors (a full disk)
                self.db.execute("ROLLBACK")
            self._in_batch = False
        self._latest_version.clear()

    # ---- tables and schemas ----------------------------------------------------------------------
    def table_id(self, table: TableName) -> int | None:
        row = self.db.execute(
            "SELECT id FROM tables WHERE schema_name = ? AND table_name = ?", (table.schema, table.name)
        ).fetchone()
        return row[0] if row else None

    def ensure_table(self, table: TableName) -> int:
        tid = self.table_id(table)
        if tid is not None:
            return tid
        with self.write():
            tid = self.table_id(table)  # again under the write lock: another process may have added it
            if tid is not None:
                return tid
            cur = self.db.execute("INSERT INTO tables(schema_name, table_name) VALUES (?, ?)", (table.schema, table.name))
            tid = int(cur.lastrowid)
            self.db.execute(_EV_DDL.format(id=tid))
        return tid

    def schema_version(self, table_id: int, schema: TableSchema, since_lsn: int) -> int:
        latest = self._latest_version.get(table_id)
        if latest is not None and latest[1] == schema:
            return latest[0]
        with self.write():
            # Read again under the write lock: another process (a `cdc snapshot --tables` next to
            # `cdc stream`) may have added a version since this one cached the table's latest.
            latest = self._load_latest_version(table_id)
            if latest is not None and latest[1] == schema:
                return latest[0]
            # An equal older version (e.g. a column dropped then re-added the same way) is not reused:
            # versions only grow, which keeps "which layout does this row have" a simple lookup.
            version = (latest[0] + 1) if latest else 1
            self.db.execute(
                "INSERT INTO schemas(table_id, version, body, since_lsn) VALUES (?, ?, ?, ?)",
                (table_id, version, orjson.dumps(schema.to_json()).decode(), since_lsn),
            )
        self._latest_version[table_id] = (version, schema)
        self._schemas[(table_id, version)] = schema
        return version

    def _load_latest_version(self, table_id: int) -> tuple[int, TableSchema] | None:
        row = self.db.execute(
            "SELECT version, body FROM schemas WHERE table_id = ? ORDER BY version DESC LIMIT 1", (table_id,)
        ).fetchone()
        if row is None:
            return None
        result = (row[0], TableSchema.from_json(orjson.loads(row[1])))
        self._latest_version[table_id] = result
        return result

    def schema_by_version(self, table_id: int, version: int) -> TableSchema:
        cached = self._schemas.get((table_id, version))
        if cached is None:
            row = self.db.execute("SELECT body FROM schemas WHERE table_id = ? AND version = ?", (table_id, version)).fetchone()
            if row is None:
                raise LogError(f"log is missing schema version {version} of table id {table_id}")
            cached = self._schemas[(table_id, version)] = TableSchema.from_json(orjson.loads(row[0]))
        return cached

    def schema(self, table: TableName, version: int | None = None) -> TableSchema:
        tid = self.require_table(table)
        if version is None:
            latest = self._load_latest_version(tid)
            if latest is None:
                raise LogError(f"the log has no schema for {table} yet")
            return latest[1]
        return self.schema_by_version(tid, version)

    def schema_versions(self, table: TableName) -> dict[int, TableSchema]:
        tid = self.require_table(table)
        rows = self.db.execute("SELECT version, body FROM schemas WHERE table_id = ? ORDER BY version", (tid,)).fetchall()
        return {v: TableSchema.from_json(orjson.loads(b)) for v, b in rows}

    def schema_history(self, table: TableName) -> list[tuple[int, int, TableSchema]]:
        """(version, since LSN, schema) of every schema version of the table, oldest first."""
        tid = self.require_table(table)
        rows = self.db.execute("SELECT version, since_lsn, body FROM schemas WHERE table_id = ? ORDER BY version", (tid,))
        return [(v, since, TableSchema.from_json(orjson.loads(body))) for v, since, body in rows]

    def column_defaults(self, table: TableName) -> dict[str, tuple[int, str]]:
        """Columns of the newest schema that have a fast default: name -> (LSN of the first schema
        version holding the column, default as PostgreSQL text). Rows last written before that
        LSN hold the default without any change event saying so."""
        return column_defaults([(since, schema) for _, since, schema in self.schema_history(table)])
    def require_table(self, table: TableName) -> int:
        """The table's id; LogError (with the snapshot to run) when the log does not have it."""
        tid = self.table_id(table)
        if tid is None:
            raise LogError(
                f"table {table} is not in the log",
                f"add it to the pipeline file's tables and run `{self._command('snapshot', '--tables', shlex.quote(str(table)))}`",
            )
        return tid

    def _has_table_columns(self) -> bool:
        """Whether `tables` has relid/dropped_lsn (a read-only open of an older log may lack them)."""
        if not hasattr(self, "_table_columns"):
            have = {r[1] for r in self.db.execute("PRAGMA table_info(tables)")}
            self._table_columns = set(_TABLE_COLUMNS) <= have
        return self._table_columns

    def tables(self) -> list[TableState]:
        extra = "t.relid, t.dropped_lsn" if self._has_table_columns() else "NULL, NULL"
        rows = self.db.execute(
            "SELECT t.id, t.schema_name, t.table_name, t.state, t.base, t.snapshot_lsn, t.purged_below,"
            f" (SELECT max(version) FROM schemas s WHERE s.table_id = t.id), {extra} FROM tables t ORDER BY t.id"
        ).fetchall()
        return [TableState(TableName(s, n), i, st, b, sl, p, v, d, r) for i, s, n, st, b, sl, p, v, r, d in rows]

    # ---- source identity, dropped tables -----------------------------------------------------------
    def set_relid(self, table_id: int, relid: int) -> None:
        """Record the source relation (pg_class OID) a log table captures."""
        with self.write():
            self.db.execute("UPDATE tables SET relid = ? WHERE id = ?", (relid, table_id))

    def rename_table(self, table_id: int, table: TableName) -> None:
        """Follow a source table renamed under the same OID: its history, schemas and base stay,
        under the new name (joins the open batch, so it is durable with the changes after it)."""
        with self.write():
            self.db.execute(
                "UPDATE tables SET schema_name = ?, table_name = ? WHERE id = ?", (table.schema, table.name, table_id)
            )

    def mark_dropped(self, table_ids: Collection[int], lsn: int) -> Cut:
        """Mark tables gone from the source (dropped, or renamed away) once the stream is durable
        past `lsn`: they keep their events and stay in cuts (a follower that has not applied
        their last changes still gets them), with state 'dropped'. A cut records the change."""
        with self.write():
            for tid in table_ids:
                self.db.execute(
                    "UPDATE tables SET state = 'dropped', dropped_lsn = ? WHERE id = ? AND state = 'live'", (lsn, tid)
                )
            return self._write_cut(lsn)

    def remove_table(self, table: TableName) -> Cut:
        """Take a table out of the log: its events, schemas and snapshot files; later cuts do not
        list it. Followers keep what they have; a stream no longer captures it (unless the
        pipeline file still names it, which then needs `cdc snapshot --tables`)."""
        tid = self.require_table(table)
        with self.write():
            self.db.execute("DELETE FROM segments WHERE snapshot_id IN (SELECT id FROM snapshots WHERE table_id = ?)", (tid,))
            self.db.execute("DELETE FROM snapshots WHERE table_id = ?", (tid,))
            self.db.execute("DELETE FROM schemas WHERE table_id = ?", (tid,))
            self.db.execute("DELETE FROM tables WHERE id = ?", (tid,))
            self.db.execute(f"DROP TABLE IF EXISTS ev_{tid}")
            previous = self.db.execute("SELECT lsn FROM cuts ORDER BY id DESC LIMIT 1").fetchone()
            cut = self._write_cut(previous[0] if previous else 0)
        self._latest_version.pop(tid, None)
        shutil.rmtree(self.path / "segments" / f"t{tid}", ignore_errors=True)
        return cut

    def table_state(self, table: TableName) -> TableState | None:
        return next((t for t in self.tables() if t.table == table), None)

    # ---- stream writes ---------------------------------------------------------------------------
    def append(self, table_id: int, rows: Sequence[ChangeRow]) -> None:
        if not rows:
            return
        self._begin()
        since = self._snapshot_lsn.get(table_id)
        if since is not None and rows[0][0] < since:
            # A stream behind the table's snapshot: what committed before the snapshot's
            # consistent point is in the snapshot already; appending it after the base would
            # put offsets out of position order.
            rows = [r for r in rows if r[0] >= since]
        try:
            self.db.executemany(_EV_INSERT.format(id=table_id), rows)
        except sqlite3.OperationalError as exc:
            raise self._write_failed(exc) from None

    def _write_failed(self, exc: sqlite3.OperationalError) -> Exception:
        """A full disk (or a failing one) under the log: one clear error instead of SQLite's
        "disk I/O error"; any other SQLite error is passed on as it is."""
        if not any(text in str(exc) for text in ("disk I/O error", "database or disk is full")):
            return exc
        free = shutil.disk_usage(self.path).free
        return LogError(
            f"the local log at {self.path} could not be written ({exc}; {free / 1e6:,.0f} MB free on its filesystem)",
            "free space on that filesystem (or move log.local.path to a bigger disk) and start the command again:"
            " it goes on from the last durable cut (PostgreSQL was told nothing past it)",
        )

    def stream_position(self) -> tuple[int, int] | None:
        value = self._meta("stream_position")
        if value is None:
            return None
        commit_lsn, end_lsn = value.split(",")
        return int(commit_lsn), int(end_lsn)

    def commit(self, lsn: int, stream_position: tuple[int, int] | None = None) -> Cut:
        self._begin()
        try:
            if stream_position is not None:
                self._set_meta("stream_position", f"{stream_position[0]},{stream_position[1]}")
            cut = self._write_cut(lsn)
            self.db.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if self.db.in_transaction:  # SQLite may have rolled back by itself
                self.db.execute("ROLLBACK")
            raise self._write_failed(exc) from None
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        finally:
            self._in_batch = False
        if self.on_commit is not None:
            self.on_commit(cut)
        return cut

    def _write_cut(self, lsn: int) -> Cut:
        """Record the current end of every live (or dropped) table (inside the open write transaction)."""
        previous = self.db.execute("SELECT lsn FROM cuts ORDER BY id DESC LIMIT 1").fetchone()
        lsn = max(lsn, previous[0]) if previous else lsn  # a cut never moves back
        ranges: dict[TableName, TableRange] = {}
        body: dict[str, list[int]] = {}
        for tid, schema_name, table_name, base in self.db.execute(
            "SELECT id, schema_name, table_name, base FROM tables WHERE state IN ('live', 'dropped')"
        ).fetchall():
            end = self.db.execute(f"SELECT coalesce(max(off), 0) FROM ev_{tid}").fetchone()[0]
            ranges[TableName(schema_name, table_name)] = TableRange(base, end)
            body[str(tid)] = [base, end]
        ts = _now_ms()
        cur = self.db.execute("INSERT INTO cuts(lsn, ts_ms, tables) VALUES (?, ?, ?)", (lsn, ts, orjson.dumps(body).decode()))
        cut_id = int(cur.lastrowid)
        if cut_id % 50 == 0:
            self._prune_cuts(cut_id, ts)
        return Cut(cut_id, lsn, ts, ranges)

    # ---- cut retention (issue 33.1) --------------------------------------------------------------
    def set_retention(
        self,
        keep: int,
        held_max: int,
        held_max_age_s: float,
        holds: Callable[[], dict[str, int]] | None,
        pipeline: str = "",
    ) -> None:
        """Keep the newest `keep` cuts, and older ones from the slowest follower's position on
        (`holds`: follower -> oldest cut id it needs, cdc/log/holds.py), but never more than
        `held_max` cuts nor cuts older than `held_max_age_s`: past that bound the oldest go and
        the alarm (meta `cut_retention_alarm`, a metric, a warning on stderr) names the followers."""
        self.keep_cuts, self.held_max, self.held_max_age_s, self._holds = keep, held_max, held_max_age_s, holds
        self._pipeline = pipeline

    def _first_cut_since(self, ts_ms: int) -> int | None:
        """The oldest cut id written at or after ts_ms (ids are contiguous: cuts only go from the
        oldest on), by bisection on the primary key, not a scan of a long-held table."""
        lo, hi = self.db.execute("SELECT min(id), max(id) FROM cuts").fetchone()
        if lo is None:
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            row = self.db.execute("SELECT id, ts_ms FROM cuts WHERE id >= ? ORDER BY id LIMIT 1", (mid,)).fetchone()
            if row[1] >= ts_ms:
                hi = mid
            else:
                lo = row[0] + 1
        return lo

    def _prune_cuts(self, cut_id: int, ts_ms: int) -> None:
        """Drop the cuts no one holds (inside the open write transaction)."""
        below = cut_id - self.keep_cuts + 1  # the newest keep_cuts always stay
        holds = self._holds() if self._holds is not None else {}
        if holds and min(holds.values()) < below:
            by_age = self._first_cut_since(ts_ms - int(self.held_max_age_s * 1000)) or below
            bound = min(below, max(cut_id - self.held_max + 1, by_age))
            below = max(min(holds.values()), bound)
        overdue = {f: c for f, c in sorted(holds.items()) if c < below}
        alarm = orjson.dumps({"ts_ms": ts_ms, "below": below, "followers": overdue}).decode() if overdue else ""
        if bool(alarm) != bool(self._meta("cut_retention_alarm")) or (overdue and overdue != self._alarmed):
            self._set_meta("cut_retention_alarm", alarm)
            if overdue:
                from cdc import metrics

                metrics.CUTS_DROPPED_HELD.labels(self._pipeline).inc()
                who = ", ".join(f"{f} (at cut {c})" for f, c in overdue.items())
                print(
                    f"warning: the log dropped cuts below {below} that {who} still needed: it reached its bound"
                    f" (log.local.held_cuts_max {self.held_max:,} cuts / held_cuts_max_age_s {self.held_max_age_s:g} s);"
                    " such a follower is rebuilt by `cdc reset PIPELINE --sink NAME --rebuild`",
                    file=sys.stderr,
                    flush=True,
                )
        self._alarmed = overdue
        self.db.execute("DELETE FROM cuts WHERE id < ?", (below,))

    def retention(self) -> dict[str, Any]:
        """What `cdc status` shows of cut retention: the oldest cut kept (how far back a rewind
        reaches) and the alarm, if the bound dropped cuts a follower held."""
        row = self.db.execute("SELECT id, ts_ms FROM cuts ORDER BY id LIMIT 1").fetchone()
        alarm = self._meta("cut_retention_alarm")
        out: dict[str, Any] = {"oldest_cut": None if row is None else {"id": row[0], "ts_ms": row[1]}}
        if alarm:
            out["alarm"] = orjson.loads(alarm)
        return out

    def cut(self, cut_id: int) -> Cut | None:
        """An earlier cut by id (see set_retention for which are kept; None when it is gone or never was)."""
        row = self.db.execute("SELECT id, lsn, ts_ms, tables FROM cuts WHERE id = ?", (cut_id,)).fetchone()
        return None if row is None else self._cut_of(row)

    def latest_cut(self) -> Cut | None:
        row = self.db.execute("SELECT id, lsn, ts_ms, tables FROM cuts ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            return None
        return self._cut_of(row)

    def _cut_of(self, row: tuple) -> Cut:
        names = {t.id: t.table for t in self.tables()}
        body = orjson.loads(row[3])
        ranges = {names[int(k)]: TableRange(b, e) for k, (b, e) in body.items() if int(k) in names}
        return Cut(row[0], row[1], row[2], ranges)

    # ---- snapshots -------------------------------------------------------------------------------
    def begin_snapshot(self, table_id: int, lsn: int, schema_version: int) -> int:
        """Start a snapshot of a table at consistent point `lsn`; the table stays as it is for
        readers (invisible if new, its previous snapshot if live) until finish_snapshot()."""
        with self.write():
            self.db.execute(
                "UPDATE tables SET state = CASE WHEN state IN ('live', 'dropped') THEN state ELSE 'snapshotting' END WHERE id = ?",
                (table_id,),
            )
            cur = self.db.execute(
                "INSERT INTO snapshots(table_id, lsn, schema_version, state, started_ms) VALUES (?, ?, ?, 'running', ?)",
                (table_id, lsn, schema_version, _now_ms()),
            )
        return int(cur.lastrowid)

    def segment_path(self, table_id: int, snapshot_id: int, chunk: int) -> Path:
        return self.path / "segments" / f"t{table_id}" / f"s{snapshot_id}" / f"c{chunk:05d}.copy"

    def add_segment(self, snapshot_id: int, chunk: int, path: Path, rows: int, nbytes: int) -> None:
        rel = os.path.relpath(path, self.path)
        with self.write():
            self.db.execute(
                "INSERT INTO segments(snapshot_id, chunk, path, rows, bytes) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT(snapshot_id, chunk) DO UPDATE SET path = excluded.path, rows = excluded.rows, bytes = excluded.bytes",
                (snapshot_id, chunk, rel, rows, nbytes),
            )

    def done_chunks(self, snapshot_id: int) -> set[int]:
        return {r[0] for r in self.db.execute("SELECT chunk FROM segments WHERE snapshot_id = ?", (snapshot_id,))}

    def running_snapshots(self) -> list[tuple[int, int, int, int]]:
        """(snapshot_id, table_id, lsn, schema_version) of snapshots not finished."""
        return list(self.db.execute("SELECT id, table_id, lsn, schema_version FROM snapshots WHERE state = 'running'"))

    def abandon_snapshot(self, snapshot_id: int) -> None:
        """Forget a snapshot that cannot be finished (its exported snapshot is gone)."""
        row = self.db.execute("SELECT table_id FROM snapshots WHERE id = ?", (snapshot_id,)).fetchone()
        with self.write():
            self.db.execute("UPDATE snapshots SET state = 'abandoned', finished_ms = ? WHERE id = ?", (_now_ms(), snapshot_id))
            self.db.execute("DELETE FROM segments WHERE snapshot_id = ?", (snapshot_id,))
        if row:
            shutil.rmtree(self.path / "segments" / f"t{row[0]}" / f"s{snapshot_id}", ignore_errors=True)

    def finish_snapshot(self, snapshot_id: int, relid: int | None = None) -> Cut:
        """Make a finished snapshot the table's new base, atomically (see module docstring);
        `relid`: the source relation it was copied from, recorded with it."""
        with self.write():
            table_id, lsn, version = self.db.execute(
                "SELECT table_id, lsn, schema_version FROM snapshots WHERE id = ?", (snapshot_id,)
            ).fetchone()
            first_new = self.db.execute(f"SELECT coalesce(max(off), 0) + 1 FROM ev_{table_id}").fetchone()[0]
            segments = self.db.execute(
                "SELECT id, rows FROM segments WHERE snapshot_id = ? ORDER BY chunk", (snapshot_id,)
            ).fetchall()
            markers = [(lsn, 0, "S", None, str(seg_id).encode(), None, None, version, None, None, lsn) for seg_id, _ in segments]
            if not markers:  # an empty table still needs a base: an empty marker
                markers = [(lsn, 0, "S", None, b"", None, None, version, None, None, lsn)]
            self.db.executemany(_EV_INSERT.format(id=table_id), markers)
            base = self.db.execute(f"SELECT min(off) FROM ev_{table_id} WHERE off >= ?", (first_new,)).fetchone()[0]
            # Stream events newer than the snapshot, written while it ran, move behind the markers.
            self.db.execute(
                f"INSERT INTO ev_{table_id}(lsn, seq, op, key, payload, before, before_kind, sv, xid, ts, elsn)"
                f" SELECT lsn, seq, op, key, payload, before, before_kind, sv, xid, ts, elsn FROM ev_{table_id}"
                " WHERE off < ? AND op != 'S' AND (lsn > ? OR (lsn = ? AND seq > 0)) ORDER BY off",
                (first_new, lsn, lsn),
            )
            total = sum(r for _, r in segments)
            self.db.execute(
                "UPDATE tables SET state = 'live', base = ?, snapshot_lsn = ?, purged_below = 0, dropped_lsn = NULL,"
                " relid = coalesce(?, relid) WHERE id = ?",
                (base, lsn, relid, table_id),
            )
            self.db.execute(
                "UPDATE snapshots SET state = 'done', finished_ms = ?, rows = ? WHERE id = ?", (_now_ms(), total, snapshot_id)
            )
            stream = self._meta("stream_position")
            cut_lsn = max(lsn, int(stream.split(",")[1])) if stream else lsn
            return self._write_cut(cut_lsn)

    # ---- reading ---------------------------------------------------------------------------------
    def read(self, table: TableName, after: int, upto: int) -> Iterator[LogRecord]:
        for part in self.read_parts(table, after, upto):
            yield from self.read_part(table, part)

    def read_parts(
        self, table: TableName, after: int, upto: int, events: int = 20_000, segment_bytes: int = 8 << 20
    ) -> list[ReadPart]:
        """The range after < offset <= upto as parts that can be read independently (in other
        processes) and, read one after the other, give exactly `read(table, after, upto)`:
        runs of at most `events` event rows, and snapshot segments in slices of about
        `segment_bytes` (cut at line ends)."""
        return self.read_parts_by_id(self.require_table(table), after, upto, events, segment_bytes)

    def read_parts_by_id(
        self, tid: int, after: int, upto: int, events: int = 20_000, segment_bytes: int = 8 << 20
    ) -> list[ReadPart]:
        """read_parts for the table with id `tid` (Spark's log source knows tables by id)."""
        parts: list[ReadPart] = []

        def events_between(first: int, last: int) -> None:  # offsets first < off <= last, no markers
            while first < last:
                end = min(first + events, last)
                if end < last and self._splits_key_change(tid, end):
                    end += 1  # the two events of a key change go out together (cdc/log/kafka/keychange.py)
                parts.append(EventRun(first, end))
                first = end

        previous = after
        for off, lsn, sv, payload in self.db.execute(
            f"SELECT off, lsn, sv, payload FROM ev_{tid} WHERE op = 'S' AND off > ? AND off <= ? ORDER BY off", (after, upto)
        ).fetchall():
            events_between(previous, off - 1)
            previous = off
            if not payload:
                continue
            seg = self.db.execute(
                "SELECT s.path, coalesce(n.started_ms, 0) FROM segments s LEFT JOIN snapshots n ON n.id = s.snapshot_id"
                " WHERE s.id = ?",
                (int(payload),),
            ).fetchone()
            if seg is None:
                raise LogError(f"snapshot segment {int(payload)} of table id {tid} is missing from the log")
            size = (self.path / seg[0]).stat().st_size
            for start in range(0, max(size, 1), segment_bytes):
                parts.append(SegmentSlice(off, lsn, sv, seg[0], start, min(start + segment_bytes, size), seg[1]))
        events_between(previous, upto)
        return parts

    def _splits_key_change(self, tid: int, off: int) -> bool:
        """Whether the events at `off` and `off + 1` are the delete and create of one key-changing
        UPDATE (same commit and event LSN, consecutive seq)."""
        rows = self.db.execute(
            f"SELECT op, lsn, seq, elsn FROM ev_{tid} WHERE off IN (?, ?) ORDER BY off", (off, off + 1)
        ).fetchall()
        if len(rows) != 2:
            return False
        (op1, lsn1, seq1, elsn1), (op2, lsn2, seq2, elsn2) = rows
        return op1 == "d" and op2 == "c" and lsn1 == lsn2 and seq2 == seq1 + 1 and elsn1 is not None and elsn1 == elsn2

    def read_part(self, table: TableName, part: ReadPart) -> Iterator[LogRecord]:
        tid = self.require_table(table)
        if isinstance(part, SegmentSlice):
            schema = self.schema_by_version(tid, part.version)
            for line in self.segment_lines(part):
                yield snapshot_record(table, part, schema, line)
            return
        for row in self.event_rows(table, part):
            yield event_record(table, row, self.schema_by_version(tid, row[8]))

    def segment_lines(self, part: SegmentSlice) -> Iterator[bytes]:
        """The slice's COPY text lines, newline removed (read_part's rows, not yet decoded)."""
        for line in iter_segment_lines(self.path / part.path, part.start, part.end):
            yield line.rstrip(b"\n")

    def event_rows(self, table: TableName, part: EventRun) -> Iterator[tuple]:
        """The run's stored rows (columns _EV_COLUMNS), not yet decoded: see event_record."""
        tid = self.require_table(table)
        return self.db.execute(
            f"SELECT {_EV_COLUMNS} FROM ev_{tid} WHERE off > ? AND off <= ? AND op != 'S' ORDER BY off",
            (part.after, part.upto),
        )

    # ---- key history (read-only; the Kafka publisher fills unchanged TOAST values from it) ---------
    def key_events_before(
        self, table: TableName, keys: Collection[bytes], below: int
    ) -> Iterator[tuple[int, bytes | None, str, bytes | None, int]]:
        """(off, key, op, payload, sv) of the events of `keys` below offset `below`, newest first,
        together with every truncate and snapshot marker (they bound a key's history). One
        backward scan of the event table; close the iterator to stop it early."""
        tid = self.require_table(table)
        marks = ",".join("?" * len(keys))
        cur = self.db.execute(
            f"SELECT off, key, op, payload, sv FROM ev_{tid}"
            f" WHERE off < ? AND (op IN ('t', 'S') OR key IN ({marks})) ORDER BY off DESC",
            (below, *keys),
        )
        try:
            yield from cur
        finally:
            cur.close()  # an unfinished statement would pin the WAL snapshot

    def snapshot_rows(
        self, table: TableName, segment_ids: Sequence[int], keys: Container[bytes], version: int
    ) -> Iterator[tuple[bytes, list[str | None]]]:
        """(key, values) of the snapshot rows whose key is in `keys`, reading each of these
        segment files once; values are decoded only for matching rows. Segments gone from
        the log are skipped."""
        tid = self.require_table(table)
        key_idx = self.schema_by_version(tid, version).key_indexes
        for seg_id in segment_ids:
            seg = self.db.execute("SELECT path FROM segments WHERE id = ?", (seg_id,)).fetchone()
            if seg is None or not (self.path / seg[0]).exists():
                continue
            for fields in iter_segment(self.path / seg[0]):
                key = key_from_copy_fields(fields, key_idx)
                if key in keys:
                    yield key, copy_fields_to_values(fields)

    # ---- for followers (Spark reads the events: pipelines.apply.readers.local) --------------------
    value_kind = "pgtext"  # values are PostgreSQL text output (see sinks.sparktypes)

    def count_events(self, table: TableName, after: int, upto: int, below_lsn: int) -> int:
        """Events (snapshot markers included) in (after, upto] committed before `below_lsn`."""
        tid = self.require_table(table)
        return self.db.execute(f"SELECT count(*) FROM ev_{tid} WHERE off > ? AND off <= ? AND lsn < ?", (after, upto, below_lsn)).fetchone()[0]

    def first_offset_from(self, table: TableName, lsn: int, upto: int) -> int | None:
        """The first change event at or after commit LSN `lsn` (up to offset `upto`)."""
        tid = self.require_table(table)
        return self.db.execute(
            f"SELECT min(off) FROM ev_{tid} WHERE lsn >= ? AND off <= ? AND op != 'S'", (lsn, upto)
        ).fetchone()[0]

    def end_offset_by_id(self, table_id: int) -> int:
        return self.db.execute(f"SELECT coalesce(max(off), 0) FROM ev_{table_id}").fetchone()[0]

    def events_after(self, table_id: int, after: int) -> Iterator[tuple[int, str, bytes | None, bytes | None]]:
        """(commit lsn, op, key, payload) of the table's events at offsets above `after`, in offset
        order (a chunked snapshot reads the stream's events inside a chunk's window from here)."""
        cur = self.db.execute(f"SELECT lsn, op, key, payload FROM ev_{table_id} WHERE off > ? AND op != 'S' ORDER BY off", (after,))
        try:
            yield from cur
        finally:
            cur.close()  # an unfinished statement would pin the WAL snapshot

    def end_offset(self, table: TableName) -> int:
        tid = self.require_table(table)
        return self.db.execute(f"SELECT coalesce(max(off), 0) FROM ev_{tid}").fetchone()[0]

    def events_between(self, table: TableName, after: int, upto: int) -> int:
        """Events at offsets after < off <= upto, each snapshot row counted (a snapshot segment is
        one offset): the backlog `cdc status` shows for a follower."""
        tid = self.require_table(table)
        plain = self.db.execute(
            f"SELECT count(*) FROM ev_{tid} WHERE off > ? AND off <= ? AND op != 'S'", (after, upto)
        ).fetchone()[0]
        snap = self.db.execute(
            f"SELECT coalesce(sum(s.rows), 0) FROM ev_{tid} e JOIN segments s ON e.op = 'S' AND e.payload != x''"
            " AND s.id = CAST(e.payload AS INTEGER) WHERE e.off > ? AND e.off <= ?",
            (after, upto),
        ).fetchone()[0]
        return int(plain) + int(snap)

    def counts(self, table: TableName) -> dict[str, int]:
        """Events per op (snapshot rows counted from segment metadata) from the table's base on."""
        tid = self.require_table(table)
        state = self.table_state(table)
        base = state.base if state and state.base is not None else 0
        counts = dict(self.db.execute(f"SELECT op, count(*) FROM ev_{tid} WHERE off >= ? AND op != 'S' GROUP BY op", (base,)).fetchall())
        snap = self.db.execute(
            f"SELECT coalesce(sum(s.rows), 0) FROM ev_{tid} e JOIN segments s ON e.op = 'S' AND e.payload != x'' AND s.id = CAST(e.payload AS INTEGER)"
            " WHERE e.off >= ?",
            (base,),
        ).fetchone()[0]
        if snap:
            counts["r"] = snap
        return counts


__all__ = ["UNCHANGED", "LocalLog", "copy_fields_to_values", "decode_text_tuple", "iter_segment", "open_db"]
