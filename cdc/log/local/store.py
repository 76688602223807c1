"""The embedded log's SQLite database: its schema, the connection, and what writer and reader share.

Layout of <path>/:
  log.db.setup                 an empty file; its flock makes opening a new log one process at a time
  log.db                       SQLite: tables, schemas, snapshots, segments, cuts, meta, and one
                               event table ev_<id> per source table (offset = INTEGER PRIMARY KEY)
  segments/t<id>/s<snap>/c<chunk>.copy
                               snapshot rows exactly as COPY TO STDOUT (text format) printed them

LocalStore holds the connection, the meta table, write transactions, and the lookups of tables
and schema versions; the writer (writer.py), the cuts (cuts.py) and the reader (reader.py) build
on it, and LocalLog (this package) is all of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

import orjson

from cdc.ground.errors import LogError
from cdc.ground.formats import LOCAL_LOG, VERSION, check_version
from cdc.ground.private import private_dir, private_file
from cdc.ground.remedy import Command, placeholder
from cdc.ground.tables import TableName
from cdc.log.base import Cut, TableSchema, TableState
from cdc.log.history import column_defaults

FORMAT_VERSION = str(LOCAL_LOG.version)  # meta `format` (cdc/ground/formats.py)

DDL = """
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

EV_DDL = (
    "CREATE TABLE IF NOT EXISTS ev_{id}("
    "off INTEGER PRIMARY KEY AUTOINCREMENT, lsn INTEGER NOT NULL, seq INTEGER NOT NULL, op TEXT NOT NULL,"
    " key BLOB, payload BLOB, before BLOB, before_kind TEXT, sv INTEGER NOT NULL,"
    " xid INTEGER, ts INTEGER, elsn INTEGER)"
)
EV_INSERT = (
    "INSERT INTO ev_{id}(lsn, seq, op, key, payload, before, before_kind, sv, xid, ts, elsn)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
EV_COLUMNS = "off, lsn, seq, op, key, payload, before, before_kind, sv, xid, ts, elsn"

# sqlite3 sends bytes and None parameters down a slow path (a failed adapter lookup that builds
# and drops an exception, ~1 µs each); explicit identity adapters skip it. bytes and NoneType are
# not "base types" to sqlite3, so ints and strs keep their fast path. Process-wide and harmless.
sqlite3.register_adapter(bytes, bytes)
sqlite3.register_adapter(type(None), lambda _none: None)


def now_ms() -> int:
    return int(time.time() * 1000)


def no_log(path: Path, command: Command) -> LogError:
    return LogError(f"no log at {path}", f"run `{command('snapshot')}` first")


def open_db(
    path: Path, synchronous: str = "full", readonly: bool = False, command: Command = placeholder
) -> sqlite3.Connection:
    """A connection to <path>/log.db; autocommit mode, explicit BEGIN IMMEDIATE for writes."""
    db_file = path / "log.db"
    if readonly:
        if not db_file.exists():
            raise no_log(path, command)
        conn = sqlite3.connect(
            f"file:{db_file}?mode=ro", uri=True, isolation_level=None, timeout=60, check_same_thread=False
        )
    else:
        private_dir(path)
        private_file(db_file)  # SQLite gives its -wal/-shm files the database file's mode
        conn = sqlite3.connect(db_file, isolation_level=None, timeout=60, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
    conn.execute("PRAGMA busy_timeout=60000")
    return conn


# Columns added to `tables` after the first format: the source relation's OID (a table is
# followed by it across renames) and the LSN the stream had passed when it saw the table gone.
TABLE_COLUMNS = {"relid": "INTEGER", "dropped_lsn": "INTEGER"}


def add_table_columns(db: sqlite3.Connection) -> None:
    have = {r[1] for r in db.execute("PRAGMA table_info(tables)")}
    for name, kind in TABLE_COLUMNS.items():
        if name not in have:
            db.execute(f"ALTER TABLE tables ADD COLUMN {name} {kind}")


@contextlib.contextmanager
def setup_lock(path: Path, readonly: bool, command: Command = placeholder) -> Iterator[None]:
    """Two processes opening one log at once (`cdc snapshot` beside `cdc stream`) must not both
    switch it to WAL, create its tables or add columns: SQLite answers such a race with "database is
    locked" or "duplicate column" rather than waiting, and a reader could find log.db without its
    tables. A writer sets the log up under an exclusive flock on <path>/log.db.setup, made before
    log.db; a reader waits for a setup in progress under a shared one."""
    lock_file = path / "log.db.setup"
    if readonly:
        try:
            fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not (path / "log.db").exists():  # decided here, once: a writer may start any moment
                raise no_log(path, command) from None
            if not lock_file.exists():  # log.db without the lock file: set up before the lock was
                yield
                return
            fd = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC)  # a writer began meanwhile
    else:
        private_dir(path)
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if readonly else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


class LocalStore:
    """The connection to one embedded log, its meta, write transactions, tables and schemas."""

    def __init__(
        self, path: Path, synchronous: str = "full", readonly: bool = False, command: Command = placeholder
    ):
        self.path = Path(path)
        self.readonly = readonly
        self._command = command  # builds the commands of fix: lines (cdc/ground/remedy.py)
        with setup_lock(self.path, readonly, command):
            self.db = open_db(self.path, synchronous, readonly, command)
            self._check_format()
            if not readonly:
                self._set_up()
        self._in_batch = False
        # called with each committed cut (cdc stream with log: kafka rings its publisher with it)
        self.on_commit: Callable[[Cut], object] | None = None
        self._snapshot_lsn: dict[int, int] = {}
        self._schemas: dict[tuple[int, int], TableSchema] = {}
        self._latest_version: dict[int, tuple[int, TableSchema]] = {}

    def _set_up(self) -> None:
        """Tables, added columns and meta of this format (idempotent; under setup_lock)."""
        self.db.executescript(DDL)
        add_table_columns(self.db)
        if self._meta("format") is None:
            self._set_meta("format", FORMAT_VERSION)
        if self._meta("cdc_version") != VERSION:  # the last release that wrote to it
            self._set_meta("cdc_version", VERSION)
        if self._meta("log_id") is None:
            self._set_meta("log_id", uuid.uuid4().hex[:12])

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
        self.db.execute(
            "INSERT INTO meta(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (key, value)
        )

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
            self._snapshot_lsn = dict(
                self.db.execute("SELECT id, snapshot_lsn FROM tables WHERE snapshot_lsn IS NOT NULL")
            )

    class _Write:
        def __init__(self, log: LocalStore):
            self.log = log
            self.owned = False

        def __enter__(self) -> LocalStore:
            self.owned = not self.log._in_batch
            self.log._begin()
            return self.log

        def __exit__(
            self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
        ) -> None:
            if not self.owned:
                return
            self.log._in_batch = False
            if not exc_type:
                self.log.db.execute("COMMIT")
            elif self.log.db.in_transaction:  # SQLite rolls back by itself after some errors
                self.log.db.execute("ROLLBACK")

    def write(self) -> LocalStore._Write:
        """`with log.write():` one SQLite write transaction (joins an open batch if any)."""
        return LocalStore._Write(self)

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
            row = self.db.execute(
                "SELECT body FROM schemas WHERE table_id = ? AND version = ?", (table_id, version)
            ).fetchone()
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
        rows = self.db.execute(
            "SELECT version, body FROM schemas WHERE table_id = ? ORDER BY version", (tid,)
        ).fetchall()
        return {v: TableSchema.from_json(orjson.loads(b)) for v, b in rows}

    def schema_history(self, table: TableName) -> list[tuple[int, int, TableSchema]]:
        """(version, since LSN, schema) of every schema version of the table, oldest first."""
        tid = self.require_table(table)
        rows = self.db.execute(
            "SELECT version, since_lsn, body FROM schemas WHERE table_id = ? ORDER BY version", (tid,)
        )
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
            self._table_columns = set(TABLE_COLUMNS) <= have
        return self._table_columns

    def tables(self) -> list[TableState]:
        extra = "t.relid, t.dropped_lsn" if self._has_table_columns() else "NULL, NULL"
        rows = self.db.execute(
            "SELECT t.id, t.schema_name, t.table_name, t.state, t.base, t.snapshot_lsn, t.purged_below,"
            f" (SELECT max(version) FROM schemas s WHERE s.table_id = t.id), {extra} FROM tables t ORDER BY t.id"
        ).fetchall()
        return [
            TableState(TableName(s, n), i, st, b, sl, p, v, d, r) for i, s, n, st, b, sl, p, v, r, d in rows
        ]

    def table_state(self, table: TableName) -> TableState | None:
        return next((t for t in self.tables() if t.table == table), None)
