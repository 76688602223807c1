"""`cdc stream`: the WAL change stream (pgoutput) into the log, in commit order.

Per change the hot loop does only what the log needs: find the table, number the event
inside its transaction, cut out the key and keep the raw tuple bytes. Decoding values is
left to readers of the log, which keeps this loop as fast as the walsender.

Durability and acknowledgement:
  * events go into the log inside an open batch; a batch only ends at a transaction boundary
    (every `batch_max_events` events or `batch_max_seconds`), with one durable commit that
    also records a cut and the (commit LSN, end LSN) of the last transaction;
  * the flush LSN acknowledged to PostgreSQL is that end LSN, so the slot never moves past
    anything not durable in the log;
  * after a crash PostgreSQL resends from the acknowledged position; transactions whose commit
    LSN the log already recorded are skipped, so the log holds each position exactly once;
  * with nothing in flight, the slot follows the server's keepalives, so WAL is released on
    idle or filtered traffic too.
"""

from __future__ import annotations

import contextlib
import select
import shlex
import signal
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import psycopg2
from psycopg2 import sql
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from cdc import ddl, health
from cdc.filters import publication_drift, refused
from cdc.ground.errors import CdcError, LogError, SourceError
from cdc.ground.lsn import format_lsn
from cdc.ground.tables import TableName, TableSelector
from cdc.keys import key_from_values
from cdc.log.base import ChangeRow, LogWriter, TableSchema
from cdc.metrics import StreamMetrics
from cdc.metrics import error as count_error
from cdc.pgoutput import UNCHANGED, Message, Relation, Truncate, decode, decode_tuple, tuple_end, tuple_prefix
from cdc.pgoutput_encode import encode_tuple
from cdc.rebase import Rebaser, RewriteWatch
from cdc.schema import TypeCache, build_schema, column_extras, relation_attnums, table_catalog, with_attnums
from cdc.source import (
    connect,
    flushed_wal_lsn,
    insert_publication,
    make_failover_slot,
    publication_names,
    replica_index_without_key,
    slot_holder,
    slot_state,
    stream_application_name,
    table_info,
)
from cdc.source.slots import _slot
from cdc.tablewatch import TableWatch, check_pipeline_source

PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in µs since the Unix epoch
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")
_RELID = struct.Struct(">I")
_FLUSH_ROWS = 5000  # rows buffered per table before they go to the (still open) log batch
DDL_CHECK_S = 30.0  # how often an idle stream looks whether the DDL trigger is still there
# /healthz: the read loop moves at least every second while idle, per batch while busy; a loop
# still for this long is hung (a slow Kafka commit or a catalog query stays well below it)
STREAM_LIVE_S = 120.0


def _same_columns(a: TableSchema, b: TableSchema) -> bool:
    return a.key == b.key and [(c.name, c.type_oid, c.typmod) for c in a.columns] == [
        (c.name, c.type_oid, c.typmod) for c in b.columns
    ]


@dataclass
class _Rel:
    table: TableName
    table_id: int
    schema_version: int
    key_idx: tuple[int, ...]
    key_len: int  # columns to decode to reach every key column
    positional: bool = False  # keyless, insert-only: each row keyed by its position "<commit lsn>\t<seq>"


@dataclass
class StreamStats:
    events: int = 0
    transactions: int = 0
    skipped_transactions: int = 0
    batches: int = 0
    started: float = field(default_factory=time.monotonic)
    start_lsn: int = 0
    flushed_lsn: int = 0  # durable in the log
    acked_lsn: int = 0  # acknowledged to PostgreSQL
    target_lsn: int | None = None

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


class StopRequested(Exception):
    pass


class _Stopped(Exception):
    """A stop was requested while waiting to reconnect."""


class _SlotBusy(SourceError):
    """The slot is active on the server (another stream, or our old walsender still exiting)."""


class _Unreachable(Exception):
    """connect() could not reach the server (its SourceError, retried while reconnecting)."""


def _unreachable_as_retryable(fn: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        try:
            return fn()
        except SourceError as exc:
            if exc.problem.startswith("cannot connect to the source database"):
                raise _Unreachable(exc.problem) from None
            raise

    return call


def _one_line(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    text = getattr(exc, "pgerror", None) or str(exc) or type(exc).__name__
    return " ".join(text.split())


class StreamReader:
    def __init__(
        self,
        pipeline,
        log: LogWriter,
        *,
        until: str | int | None = None,
        say: Callable[[str], None] = print,
        progress_every_s: float = 10.0,
        install_signal_handlers: bool = True,
        ack_limit: Callable[[], int] | None = None,
        check_publisher: Callable[[], None] | None = None,
        rebaser: Rebaser | None = None,
    ):
        self.pipeline = pipeline
        self.log = log
        self.until = until
        self.say = say
        self.progress_every_s = progress_every_s
        self.cfg = pipeline.stream
        self.selectors = [TableSelector.parse(t) for t in pipeline.source.postgres.tables]
        self.stats = StreamStats()
        self._stop = False
        self._install = install_signal_handlers
        self._types = TypeCache()
        self._rels: dict[int, _Rel | None] = {}
        self._keys: dict[TableName, tuple[str, ...]] = {}
        self._insert_only: set[TableName] = set()
        self.ack_limit = ack_limit
        self.check_publisher = check_publisher  # raises if the Kafka publisher child stopped
        # captured tables renamed or dropped in the source; remedies name the pipeline file as given
        self._watch = TableWatch(log, say, pipeline.command)
        self._rebaser = rebaser
        # tables changed without change events
        self._rewrites = RewriteWatch(log, pipeline.state_path, rebaser, say, pipeline.command)
        self._filter_drift: dict[TableName, str] = {}
        self._acked = 0
        self._beat = health.Heartbeat(STREAM_LIVE_S)  # /healthz and /readyz (cdc/health.py)
        self._connected = False
        self._why = "starting: connecting to the source"
        self._limit = 0
        self._limit_checked = 0.0
        self._durable_counts = (0, 0)  # (events, transactions) durable in the log, for reconnects
        self.metrics = StreamMetrics(pipeline.name)
        # DDL capture (cdc/ddl.py): the event trigger's messages carry schema changes at their commit
        self._ddl_prefix = ddl.prefix(pipeline.name)
        self._ddl_on = False
        self._ddl_checked = 0.0
        self._idle_checked = time.monotonic()  # the idle-table schema check (no DDL capture)

    def _snapshot_cmd(self, table: TableName) -> str:
        return self.pipeline.command("snapshot", "--tables", shlex.quote(str(table)))

    def request_stop(self, *_args) -> None:
        self._stop = True

    def _ack(self, cur, durable: int) -> None:
        """Acknowledge to PostgreSQL: what is durable in the log, and with a Kafka log no more
        than what Kafka has acknowledged (the publisher's position)."""
        target = durable
        if self.ack_limit is not None:
            now = time.monotonic()
            if now - self._limit_checked >= 0.2:
                self._limit, self._limit_checked = self.ack_limit(), now
            target = min(durable, self._limit)
        if target > self._acked:
            cur.send_feedback(write_lsn=target, flush_lsn=target, force=True)
            self._acked = target
            self.stats.acked_lsn = target
            self.metrics.acked.set(target)

    # ---- set-up ----------------------------------------------------------------------------------
    def _prepare(self):
        pg = self.pipeline.source.postgres
        conn = self._conn = connect(pg.dsn, application_name="cdc stream catalog")
        gone = self._watch.start(conn)  # a dropped table still in the file must not stop the stream
        report = check_pipeline_source(self.pipeline, conn, gone)
        report.raise_if_problems()
        self._check_slot(conn)
        if pg.failover and make_failover_slot(pg.dsn, self.pipeline.slot):
            self.say(f"replication slot {self.pipeline.slot} is now a failover slot (source.postgres.failover)")
        for t in report.tables:
            self._keys[t.table] = t.key_columns
        self._insert_only = {t.table for t in report.tables if t.insert_only}
        self._check_ddl(conn, start=True)
        try:  # table_options changed since the publication got them: re-based once streaming (run)
            self._filter_drift = publication_drift(conn, self.pipeline.publication, report.filters)
        except psycopg2.Error as exc:
            raise refused(exc, self.pipeline.publication) from None
        if self.until == "current":
            self.stats.target_lsn = flushed_wal_lsn(conn)
        elif isinstance(self.until, int):
            self.stats.target_lsn = self.until
        return conn

    def _check_slot(self, conn) -> None:
        """The slot exists and nobody streams from it (slot problems are exit 3, README "Exit codes")."""
        slot = _slot(conn, self.pipeline.slot)
        if slot is None:
            if self.log.latest_cut() is None:
                raise SourceError(
                    f"replication slot {self.pipeline.slot} does not exist yet",
                    f"run `{self.pipeline.command('snapshot')}` first (it creates the slot at a consistent point)",
                )
            raise SourceError(
                f"replication slot {self.pipeline.slot} no longer exists (dropped, or invalidated and removed, or the "
                "source failed over to a standby without a copy of it: only failover slots of PostgreSQL 17 or later, "
                "source.postgres.failover: true, survive a failover); changes made since it went are not in the log",
                f"run `{self.pipeline.command('snapshot')}`: it creates the slot again and re-copies every table, "
                "then `cdc stream` continues from there",
            )
        state = slot_state(conn, self.pipeline.slot)
        if state is not None and state["wal_status"] == "lost":
            raise SourceError(
                f"replication slot {self.pipeline.slot} was invalidated (the server removed WAL it still needed, "
                "max_slot_wal_keep_size); changes since are not in the log",
                f"drop it (SELECT pg_drop_replication_slot('{self.pipeline.slot}');), then run "
                f"`{self.pipeline.command('snapshot')}` to re-copy every table",
            )
        if slot[2] is not None:
            raise _SlotBusy(*slot_holder(conn, self.pipeline.slot, slot[2]))

    def _relation(self, conn, msg: Relation, lsn: int, replay: bool = False) -> None:
        table = TableName(msg.namespace, msg.name)
        selected = any(s.matches(table) for s in self.selectors)
        # A captured table renamed in the source is followed by OID (or stops the stream): cdc/tablewatch.py
        table = self._watch.resolve(msg.relation_id, table, lsn, selected, replay)
        # Tables `cdc snapshot --tables` added while we run are registered in the log before
        # they join the publication, so the log knows them by the time their first change comes.
        if not selected and self.log.table_id(table) is None:
            self._rels[msg.relation_id] = None  # published but not part of this pipeline
            return
        key = self._keys.get(table)
        names = [c.name for c in msg.columns]
        if key is None or any(k not in names for k in key):
            key = self._keys[table] = self._watch.key_of(
                conn, table
            )  # new table or key changed (or gone since)
        missing = [k for k in key if k not in names]
        # a keyless table followed insert-only from the start (a table that loses its key still stops here)
        positional = not key and (table in self._insert_only or self._new_insert_only(conn, table))
        if (not key and not positional) or missing:
            raise SourceError(
                f"table {table} has no usable key in the change stream (key columns {list(key)}, stream columns {names})",
                f"give the table a primary key again, then run `{self._snapshot_cmd(table)}`",
            )
        columns = [(c.name, c.type_oid, c.typmod) for c in msg.columns]
        catalog = table_catalog(conn, table)  # fast defaults of every leaf partition, relfilenodes
        extras = self._watch.extras(
            conn, table, lambda: catalog.extras if catalog else column_extras(conn, table)
        )
        schema = build_schema(conn, columns, key, self._types, extras)
        table_id = self.log.ensure_table(table)
        # Column identity (attnum), so followers can tell a rename from a drop + add.
        schema = with_attnums(schema, relation_attnums(conn, table, names, self._previous_schema(table)))
        previous = self._previous_schema(table)
        if not replay:  # rows changed without change events (a rewrite, partitions): re-base (cdc/rebase.py)
            self._rewrites.check(conn, table, table_id, previous, schema, catalog, lsn)
        if self._ddl_on and previous is not None and _same_columns(previous, schema):
            # the trigger's message recorded this version at the DDL's commit, with the fast defaults
            # as of then: the catalog read now may have lost them to a later rewrite
            schema = previous
        version = self.log.schema_version(table_id, schema, lsn)
        idx = schema.key_indexes
        self._rels[msg.relation_id] = _Rel(table, table_id, version, idx, max(idx, default=-1) + 1, positional)

    def _new_insert_only(self, conn, table: TableName) -> bool:
        """A keyless table that joined while streaming (`cdc snapshot --tables`): insert-only when the
        log never had it with a key (rows keyed by content before cannot continue by position)."""
        previous = self._previous_schema(table)
        if (previous is not None and previous.key) or not table_info(conn, table).insert_only:
            return False
        self._insert_only.add(table)
        return True

    # ---- DDL capture (cdc/ddl.py) -------------------------------------------------------------------
    def _check_ddl(self, conn, start: bool = False) -> None:
        """Whether the event trigger is there: said at start, and when it goes or comes back."""
        self._ddl_checked = time.monotonic()
        try:
            state = ddl.trigger_state(conn, self.pipeline.name)
        except psycopg2.Error:
            return  # the catalog connection is gone: the next check tells
        on = state.complete
        installed = ddl.load_installed(self.pipeline.state_path) is not None
        if start or on != self._ddl_on:
            line, fix = ddl.mode_line(
                state,
                installed,
                self.pipeline.command("ddl install"),
                self.pipeline.command("ddl remove"),
            )
            if fix:
                self.say(f"warning: {line}\n  fix: {fix}")
            elif start or on:
                self.say(line)
        self._ddl_on = on

    def _ddl_message(self, conn, content: bytes, commit_lsn: int, flush: Callable[[], None]) -> None:
        """A schema change of a captured table, in its transaction's place among the rows."""
        try:
            event = ddl.parse(content)
        except ddl.DdlMessageError as exc:
            self.say(f"warning: a DDL capture message at commit {format_lsn(commit_lsn)} was not read ({exc})")
            return
        owner = next((s for s in self.log.tables() if s.relid == event.oid and s.state in ("live", "snapshotting")), None)
        if owner is None:
            return  # not a table this log captures
        if event.event == "drop":
            return  # the table watch marks it dropped once the log is durable past this point
        if event.event == "rewrite":
            self._rewrites.rewritten(
                conn, owner.table, owner.id, commit_lsn, "its rows were rewritten by DDL (a type change or a volatile default)"
            )
            return
        table = TableName(event.schema, event.table)
        if table != owner.table:  # RENAME TO / SET SCHEMA: followed by OID, or the stream stops (tablewatch)
            selected = any(s.matches(table) for s in self.selectors)
            table = self._watch.resolve(event.oid, table, commit_lsn, selected, False)
        self._new_version(conn, event, owner.id, table, commit_lsn, flush)

    def _new_version(
        self, conn, event: ddl.DdlEvent, table_id: int, table: TableName, lsn: int, flush: Callable[[], None]
    ) -> None:
        """Record the event's columns as the table's schema version at `lsn`."""
        if not event.columns:
            return
        key = event.key or self._keys.get(table) or ()
        if not key or any(k not in [c.name for c in event.columns] for k in key):
            return  # no usable key: the Relation message with the next change says so
        self._keys[table] = key
        schema = build_schema(
            conn,
            [(c.name, c.type_oid, c.typmod) for c in event.columns],
            key,
            self._types,
            {c.name: (c.ndims, c.missing) for c in event.columns},
        )
        schema = with_attnums(schema, {c.name: c.attnum for c in event.columns})
        flush()  # rows already buffered keep their old schema version
        version = self.log.schema_version(table_id, schema, lsn)
        if event.oid in self._rels:  # pgoutput sends a Relation message before the next row anyway
            idx = schema.key_indexes
            self._rels[event.oid] = _Rel(table, table_id, version, idx, max(idx) + 1)

    def _idle_schema_check(self, conn, flushed: int) -> bool:
        """Without DDL capture: tables whose catalog columns differ from the log's latest schema get
        the catalog's columns as a new version at `flushed`, but only when the stream has decoded
        every transaction committed before the catalog was read (nothing of any table is pending,
        so no row still to come predates the catalog's state). Column changes only: a renamed
        table still waits for its next change. Returns whether a version was recorded."""
        self._idle_checked = time.monotonic()
        if self._ddl_on:
            return False
        found: list[tuple[ddl.DdlEvent, int, TableName]] = []
        try:
            for st in self.log.tables():
                if st.state != "live" or st.relid is None:
                    continue
                previous = self._previous_schema(st.table)
                event = ddl.catalog_event(conn, st.relid)
                if event is None or previous is None:
                    continue
                now = [(c.name, c.type_oid, c.typmod) for c in event.columns]
                if now != [(c.name, c.type_oid, c.typmod) for c in previous.columns]:
                    found.append((event, st.id, st.table))
            if not found:
                return False
            with conn.cursor() as cur:
                cur.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint")
                after = int(cur.fetchone()[0])
        except psycopg2.Error:
            return False  # the catalog connection is gone: the next check tells
        if after > flushed:
            return False  # WAL written since may hold rows with the old columns: not safe now
        for event, table_id, table in found:
            previous = self._previous_schema(table)
            self._new_version(conn, event, table_id, table, flushed, lambda: None)
            catalog = table_catalog(conn, table)
            new = self._previous_schema(table)
            if new is not None and previous is not None:
                self._rewrites.check(conn, table, table_id, previous, new, catalog, flushed)
            self.say(
                f"{table}: its columns changed in the source with no change since (no DDL capture): the log has them "
                f"at {format_lsn(flushed)} ({', '.join(c.name for c in event.columns)})"
            )
        return True

    def _previous_schema(self, table: TableName) -> TableSchema | None:
        """The log's newest schema of `table` (None for a table it has none for yet)."""
        schema = getattr(self.log, "schema", None)  # the local (staging) log; other writers have no history
        try:
            return schema(table) if schema else None
        except LogError:
            return None

    # ---- main loop -------------------------------------------------------------------------------
    def run(self) -> StreamStats:
        self._prepare()
        self._rewrites.resume()  # re-bases an earlier stream did not see finished
        for table, reason in self._filter_drift.items():
            # the re-base sets the publication's column list / row filter, then snapshots the table
            self._rewrites.request(table, f"source.postgres.table_options changed ({reason})")
        old_handlers = {}
        if self._install:
            for sig in (signal.SIGINT, signal.SIGTERM):
                old_handlers[sig] = signal.signal(sig, self.request_stop)
        self._rconn = None
        health.register("stream", self._health)
        try:
            cur = self._start_replication()
            while True:
                try:
                    self._loop(self._conn, cur, self._skip_upto())
                    break
                except psycopg2.Error as exc:
                    if not self._disconnected(exc):
                        raise
                    cur = self._reconnect(exc)
                    if cur is None:  # stopped (Ctrl-C/SIGTERM) while waiting for the server
                        self._report(final=True)
                        break
            if self.until is not None and not self._stop:
                self._rewrites.settle()
                if self._rebaser is not None:
                    self._rebaser.wait()  # --until: the re-bases it started belong to what it made durable
        except psycopg2.Error as exc:
            raise SourceError(f"the change stream failed: {_one_line(exc)}") from None
        finally:
            self.log.rollback()  # nothing half-written survives (no-op after a clean commit)
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            self._close_connections()
            health.unregister("stream")
        return self.stats

    def _health(self) -> dict:
        """This stream's part of /healthz and /readyz (cdc/health.py)."""
        age, live = self._beat.age(), self._beat.alive()
        if not live:
            reason = f"the read loop has not moved for {age:.0f}s (more than {self._beat.within_s:g}s): hung"
        elif not self._connected:
            reason = self._why
        else:
            reason = f"streaming from slot {self.pipeline.slot}"
        return {
            "live": live,
            "ready": live and self._connected,
            "reason": reason,
            "connected": self._connected,
            "last_progress_s": round(age, 1),
            "durable_lsn": format_lsn(self.stats.flushed_lsn or 0),
        }

    # ---- connections and reconnecting ---------------------------------------------------------------
    def _skip_upto(self) -> int:
        position = self.log.stream_position()
        return position[0] if position else -1

    def _start_replication(self):
        self._rconn = connect(
            self.pipeline.source.postgres.dsn,
            replication=True,
            application_name=stream_application_name(self.pipeline.name),
        )
        cur = self._rconn.cursor()
        cur.start_replication(
            slot_name=self.pipeline.slot,
            decode=False,
            options={
                "proto_version": "1",
                "publication_names": publication_names(self._conn, self.pipeline.publication),
                "messages": "true",
            },
            status_interval=self.cfg.status_interval_s,
        )
        self._connected = True
        self._beat.beat()
        return cur

    def _close_connections(self) -> None:
        for conn in (self._rconn, getattr(self, "_conn", None)):
            if conn is not None:
                with contextlib.suppress(psycopg2.Error):
                    conn.close()
        self._rconn = None

    def _disconnected(self, exc: BaseException) -> bool:
        """A lost connection (server restart, terminated walsender, network) rather than an error
        that would happen again the same way."""
        if isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError):
            return True
        code = getattr(exc, "pgcode", None)
        if code is None or code[:2] in ("08", "57"):  # client-side (e.g. "no COPY in progress" after a
            return True  # server shutdown ended the stream), connection exception, operator intervention
        return any(c is not None and c.closed for c in (self._rconn, getattr(self, "_conn", None)))

    def _reconnect(self, exc: BaseException):
        """Reconnect with bounded exponential backoff for up to stream.reconnect_timeout_s, then
        resume from the slot. Nothing is lost: the slot is only ever acknowledged up to what is
        durable in the log, the open (uncommitted) batch is dropped here, and the server resends
        from the slot's position; transactions already in the log are skipped by commit LSN.
        Returns the new replication cursor, or None when a stop was requested meanwhile."""
        limit = self.cfg.reconnect_timeout_s
        lost = _one_line(exc)
        self._connected, self._why = False, f"reconnecting to the source (lost: {lost})"
        count_error(self.pipeline.name, "stream", "source_disconnected")
        self.log.rollback()
        # the dropped batch's transactions come again: count them once
        self.stats.events, self.stats.transactions = self._durable_counts
        self._close_connections()
        if limit <= 0:
            raise SourceError(
                f"lost the connection to the source: {lost}",
                "run `cdc stream` again once the server is reachable: it resumes from the slot (nothing is lost); "
                "set stream.reconnect_timeout_s in the pipeline file to reconnect by itself",
            )
        self.say(
            f"lost the connection to the source ({lost}); reconnecting for up to {limit:g}s "
            "(stream.reconnect_timeout_s); the slot keeps the WAL, nothing is lost"
        )
        started = time.monotonic()
        attempts = 0

        def attempt():
            nonlocal attempts
            attempts += 1
            self._close_connections()
            self._conn = connect(self.pipeline.source.postgres.dsn, application_name="cdc stream catalog")
            self._check_slot(self._conn)  # gone: SourceError, not retried; busy: retried
            return self._start_replication()

        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            self.say(
                f"  reconnect attempt {state.attempt_number} failed ({_one_line(error)}); next in {state.upcoming_sleep:.1f}s"
            )

        retrying = Retrying(
            retry=retry_if_exception_type(
                (psycopg2.OperationalError, psycopg2.InterfaceError, _SlotBusy, _Unreachable)
            ),
            wait=wait_exponential(multiplier=0.5, min=0.5, max=15),
            stop=stop_after_delay(limit),
            sleep=self._pause,
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            cur = retrying(_unreachable_as_retryable(attempt))
        except _Stopped:
            return None
        except _SlotBusy as busy:
            raise SourceError(
                f"could not resume the stream within {limit:g}s: {busy.problem}", busy.fix
            ) from None
        except (psycopg2.Error, _Unreachable) as last:
            raise SourceError(
                f"lost the connection to the source and could not reconnect within {limit:g}s "
                f"({attempts} attempts; last error: {_one_line(last)})",
                "check that the server is up and reachable, then run `cdc stream` again: it resumes from the slot "
                "(nothing is lost); raise stream.reconnect_timeout_s to wait longer",
            ) from None
        self._rels.clear()  # the new walsender sends every relation again before its first change
        self._acked = 0  # acknowledge again on the new connection
        self._limit_checked = 0.0
        slot = slot_state(self._conn, self.pipeline.slot)
        at = (
            format_lsn(slot["confirmed_flush_lsn"])
            if slot and slot["confirmed_flush_lsn"] is not None
            else "?"
        )
        self.say(
            f"reconnected after {time.monotonic() - started:.1f}s ({attempts} attempt(s)); resuming from the slot at {at}"
        )
        return cur

    def _pause(self, seconds: float) -> None:
        """tenacity's sleep, cut short by Ctrl-C/SIGTERM."""
        deadline = time.monotonic() + seconds
        self._beat.beat()  # alive while it waits to reconnect (not ready: _connected is False)
        while not self._stop:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.1))
        raise _Stopped

    def _loop(self, conn, cur, skip_upto: int) -> None:  # one flat loop on purpose: it is the hot path
        stats = self.stats
        log = self.log
        rels = self._rels
        read = cur.read_message
        unpack_relid = _RELID.unpack_from
        unpack_begin = _BEGIN.unpack_from
        unpack_commit = _COMMIT.unpack_from
        buffers: dict[int, list[ChangeRow]] = {}
        max_events, max_seconds = self.cfg.batch_max_events, self.cfg.batch_max_seconds
        target = stats.target_lsn
        beat = self._beat.beat

        in_txn = skip = False
        commit_lsn = xid = ts = seq = 0
        batch_events = 0
        batch_started = 0.0
        last_txn: tuple[int, int] | None = None  # (commit_lsn, end_lsn) written but not yet durable
        flushed = 0
        last_cut_time = 0.0
        next_report = time.monotonic() + self.progress_every_s

        def flush_buffers() -> None:
            for table_id, rows in buffers.items():
                if rows:
                    log.append(table_id, rows)
            buffers.clear()

        cut_lsn = 0

        def commit_batch() -> None:
            nonlocal batch_events, last_txn, flushed, cut_lsn
            flush_buffers()
            log.commit(last_txn[1], last_txn)
            flushed = cut_lsn = last_txn[1]
            stats.flushed_lsn = flushed
            self._ack(cur, flushed)
            self._watch.poll(self._conn, flushed)  # tables gone from the source: marked once passed
            stats.batches += 1
            events, txns = self._durable_counts
            self.metrics.committed(stats.events - events, stats.transactions - txns, flushed)
            beat()
            self._durable_counts = (stats.events, stats.transactions)  # what a reconnect keeps
            batch_events = 0
            last_txn = None

        while True:
            msg = read()
            if msg is None:
                if not in_txn and last_txn is not None:
                    commit_batch()
                if self._stop and not in_txn:
                    break
                if self._stop and in_txn:
                    break  # abandon the open transaction; it is resent after restart
                if not in_txn and last_txn is None:
                    wal_end = cur.wal_end
                    if wal_end > flushed:
                        # Nothing in flight: everything before the server's position is in the log.
                        flushed = wal_end
                        stats.flushed_lsn = flushed
                    now = time.monotonic()
                    if flushed > cut_lsn and now - last_cut_time >= 1.0:
                        log.commit(
                            flushed, None
                        )  # a cut at the new position (no events): followers see progress
                        cut_lsn, last_cut_time = flushed, now
                    self._ack(cur, flushed)
                    self.metrics.progress(flushed)  # idle but healthy: the position is confirmed
                    beat()
                    self._watch.poll(self._conn, flushed)
                    if time.monotonic() - self._ddl_checked >= DDL_CHECK_S:
                        self._check_ddl(self._conn)
                    reached = target is not None and self._acked >= target
                    due = reached or time.monotonic() - self._idle_checked >= DDL_CHECK_S
                    if due and self._idle_schema_check(self._conn, flushed):
                        log.commit(flushed, None)  # a cut, so followers apply the versions
                        cut_lsn, last_cut_time = flushed, time.monotonic()
                    if self._rewrites.suspects:
                        self._rewrites.due(flushed)
                    if self.check_publisher is not None:
                        self.check_publisher()
                    if target is not None:
                        if self._acked >= target:
                            break
                        cur.send_feedback(reply=True)  # ask for a keepalive carrying the server's position
                now = time.monotonic()
                if now >= next_report:
                    next_report = now + self.progress_every_s
                    self._report()
                select.select([cur], [], [], 0.2 if target is not None else 1.0)
                continue

            p = msg.payload
            kind = p[0]
            if kind == 73:  # 'I' insert
                if skip:
                    continue
                rel = rels.get(unpack_relid(p, 1)[0])
                if rel is None:
                    continue
                seq += 1
                vals = tuple_prefix(p, 6, rel.key_len)
                rows = buffers.get(rel.table_id)
                if rows is None:
                    rows = buffers[rel.table_id] = []
                rows.append(
                    (
                        commit_lsn,
                        seq,
                        "c",
                        b"%d\t%d" % (commit_lsn, seq) if rel.positional else key_from_values(vals, rel.key_idx),
                        p[6:],
                        None,
                        None,
                        rel.schema_version,
                        xid,
                        ts,
                        msg.data_start,
                    )
                )
                if len(rows) >= _FLUSH_ROWS:
                    log.append(rel.table_id, rows)
                    buffers[rel.table_id] = []
                    beat()  # a huge transaction is progress too
                batch_events += 1
            elif kind == 85 or kind == 68:  # 'U' update, 'D' delete
                if skip:
                    continue
                rel = rels.get(unpack_relid(p, 1)[0])
                if rel is None:
                    continue
                rows = buffers.get(rel.table_id)
                if rows is None:
                    rows = buffers[rel.table_id] = []
                seq, n = self._update_or_delete(p, kind, rel, rows, commit_lsn, seq, xid, ts, msg.data_start)
                batch_events += n
                if len(rows) >= _FLUSH_ROWS:
                    log.append(rel.table_id, rows)
                    buffers[rel.table_id] = []
                    beat()  # a huge transaction is progress too
            elif kind == 66:  # 'B' begin
                commit_lsn, ts, xid = unpack_begin(p, 1)
                ts += PG_EPOCH_US
                seq = 0
                in_txn = True
                skip = commit_lsn <= skip_upto
                if not skip and last_txn is None and batch_events == 0:
                    batch_started = time.monotonic()
            elif kind == 67:  # 'C' commit
                _flags, c_lsn, end_lsn, _ts = unpack_commit(p, 1)
                in_txn = False
                if skip:
                    stats.skipped_transactions += 1
                    skip = False
                    continue
                if seq:
                    stats.transactions += 1  # transactions without captured changes are not counted
                stats.events += seq
                last_txn = (c_lsn, end_lsn)
                if self._rewrites.suspects:
                    self._rewrites.due(end_lsn)  # storage changes no TRUNCATE explained: rewrites
                reached = target is not None and end_lsn >= target
                if reached or batch_events >= max_events or time.monotonic() - batch_started >= max_seconds:
                    commit_batch()
                    batch_started = time.monotonic()
                if reached and self._acked >= target:
                    if self._idle_schema_check(self._conn, flushed):  # `--until`: idle tables too
                        log.commit(flushed, None)
                    break
                if self._stop:
                    if last_txn is not None:
                        commit_batch()
                    break
            elif kind == 82:  # 'R' relation
                msg_rel = decode(p)
                assert isinstance(msg_rel, Relation)
                flush_buffers()  # rows already buffered keep their old schema version
                self._relation(conn, msg_rel, commit_lsn, skip)  # skip: a transaction the log has already
            elif kind == 84:  # 'T' truncate
                if skip:
                    continue
                trunc = decode(p)
                assert isinstance(trunc, Truncate)
                for relid in trunc.relation_ids:
                    rel = rels.get(relid)
                    if rel is None:
                        continue
                    seq += 1
                    self._rewrites.truncate(rel.table_id)  # explains the table's new relfilenode
                    buffers.setdefault(rel.table_id, []).append(
                        (
                            commit_lsn,
                            seq,
                            "t",
                            None,
                            None,
                            None,
                            None,
                            rel.schema_version,
                            xid,
                            ts,
                            msg.data_start,
                        )
                    )
                    batch_events += 1
            elif kind == 77:  # 'M' logical message: the DDL trigger's (cdc/ddl.py); watermarks and others pass
                if skip or not in_txn:
                    continue
                message = decode(p)
                assert isinstance(message, Message)
                if message.transactional and message.prefix == self._ddl_prefix:
                    self._ddl_message(conn, message.content, commit_lsn, flush_buffers)
            # 'Y' type, 'O' origin: nothing to log (types are resolved from the catalog).
            # Memory stays flat in huge transactions: per-table buffers go to the open batch every _FLUSH_ROWS.

        if last_txn is not None and not in_txn:
            commit_batch()
        self._report(final=True)

    def _update_or_delete(
        self, p, kind, rel: _Rel, rows: list, commit_lsn, seq, xid, ts, elsn
    ) -> tuple[int, int]:
        """Append the log rows for an Update or Delete; returns (new seq, rows added)."""
        if rel.positional:  # its publication publishes inserts only: someone widened it
            raise SourceError(
                f"an update or delete of keyless table {rel.table} arrived, which is followed insert-only",
                f"run ALTER PUBLICATION {insert_publication(self.pipeline.publication)} SET (publish = 'insert, truncate');"
                f" then `{self._snapshot_cmd(rel.table)}`",
            )
        marker = p[5]
        old = old_key = None
        old_kind = None
        offset = 6
        if marker in (75, 79):  # 'K' key-only old tuple / 'O' full old row
            old_kind = "K" if marker == 75 else "O"
            end = tuple_end(p, 6)
            old = p[6:end]
            old_vals = tuple_prefix(old, 0, rel.key_len)
            if old_kind == "K" and any(old_vals[i] is None for i in rel.key_idx):
                self._short_old_row(rel)  # key columns are NOT NULL: a None here was left out by PostgreSQL
            old_key = key_from_values(old_vals, rel.key_idx)
            offset = end + 1  # skip the 'N' of the new tuple
        if kind == 68:  # delete
            seq += 1
            rows.append(
                (commit_lsn, seq, "d", old_key, None, old, old_kind, rel.schema_version, xid, ts, elsn)
            )
            return seq, 1
        new = p[offset:]
        key_vals = tuple_prefix(new, 0, rel.key_len)
        if any(key_vals[i] is UNCHANGED or key_vals[i] is None for i in rel.key_idx):
            if old_key is None:
                raise SourceError(
                    f"an update of {rel.table} arrived without its key (a key column is an unchanged TOAST value)",
                    f"run ALTER TABLE {rel.table} REPLICA IDENTITY FULL; then `{self._snapshot_cmd(rel.table)}`",
                )
            new_key = old_key
        else:
            new_key = key_from_values(key_vals, rel.key_idx)
        if old_key is not None and old_key != new_key:
            # The key changed: the old row goes away and a new one appears (as Debezium does it).
            if self._has_unchanged(new):
                new = self._fill_unchanged(rel, new, old if old_kind == "O" else None)
            seq += 1
            rows.append(
                (commit_lsn, seq, "d", old_key, None, old, old_kind, rel.schema_version, xid, ts, elsn)
            )
            seq += 1
            rows.append((commit_lsn, seq, "c", new_key, new, None, None, rel.schema_version, xid, ts, elsn))
            return seq, 2
        seq += 1
        rows.append((commit_lsn, seq, "u", new_key, new, old, old_kind, rel.schema_version, xid, ts, elsn))
        return seq, 1

    def _short_old_row(self, rel: _Rel) -> NoReturn:
        """REPLICA IDENTITY USING INDEX on an index without the primary key: the old row has no key.
        Stop before this transaction's batch commits, so nothing past it is acknowledged."""
        try:
            index = replica_index_without_key(self._conn, rel.table) or "an index"
        except psycopg2.Error:
            index = "an index"  # the catalog connection is gone: the message still holds
        raise SourceError(
            f"table {rel.table} has REPLICA IDENTITY USING INDEX {index}, without the primary key columns: PostgreSQL "
            "sent a deleted (or key-changed) row's old values without the primary key the log keys rows by; "
            "the stream stopped there and acknowledged nothing past it",
            f"run ALTER TABLE {rel.table} REPLICA IDENTITY DEFAULT (or FULL); then start the pipeline over, as the WAL "
            f"already written keeps the short old rows: `{self.pipeline.command('teardown', '--drop-slot', '--yes')}` "
            f"and `{self.pipeline.command('snapshot')}`",
        )

    @staticmethod
    def _has_unchanged(tuple_bytes: bytes) -> bool:
        return any(v is UNCHANGED for v in decode_tuple(tuple_bytes, 0)[0])

    def _fill_unchanged(self, rel: _Rel, new: bytes, old_full: bytes | None) -> bytes:
        """A row whose key changed is a new row to followers, so it cannot say "keep the TOAST value
        you have": take the values from the full old row (REPLICA IDENTITY FULL), else read them
        back from the source by the new key. A value read back may be newer than this event; any
        later change of it arrives as its own, newer event, so followers still end identical."""
        values = list(decode_tuple(new, 0)[0])
        missing = [i for i, v in enumerate(values) if v is UNCHANGED]
        if old_full is not None:
            old_values = decode_tuple(old_full, 0)[0]
            for i in list(missing):
                if old_values[i] is not UNCHANGED:
                    values[i] = old_values[i]
                    missing.remove(i)
        if missing:
            schema = self.log.schema_by_version(rel.table_id, rel.schema_version)
            names = [schema.columns[i].name for i in missing]
            keys = [schema.columns[i].name for i in rel.key_idx]
            query = sql.SQL("SELECT {} FROM {} WHERE {}").format(
                sql.SQL(", ").join(
                    sql.SQL("CASE WHEN {c} IS NULL THEN NULL ELSE format('%%s', {c}) END").format(
                        c=sql.Identifier(n)
                    )
                    for n in names
                ),
                sql.Identifier(rel.table.schema, rel.table.name),
                sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in keys),
            )
            with self._conn.cursor() as cur:
                cur.execute(query, [values[i].decode() for i in rel.key_idx])
                row = cur.fetchone()
            if row is not None:  # gone already: a later event in the stream deletes it anyway
                for i, v in zip(missing, row, strict=True):
                    values[i] = None if v is None else v.encode()
        return encode_tuple(values)

    def _report(self, final: bool = False) -> None:
        s = self.stats
        rate = s.events / max(s.seconds, 1e-6)
        target = f" of {format_lsn(s.target_lsn)}" if s.target_lsn else ""
        prefix = "streamed" if final else "streaming:"
        self.say(
            f"{prefix} {s.events:,} events in {s.transactions:,} transactions ({rate:,.0f} events/s), "
            f"log durable at {format_lsn(s.flushed_lsn)}{target}"
        )


def run_stream(
    pipeline,
    *,
    until: str | int | None = None,
    say: Callable[[str], None] = print,
    rebaser: Rebaser | None = None,
) -> StreamStats:
    """`cdc stream`. With `log: kafka` a publisher child process turns the staging log into
    Kafka topics while we read, and acknowledgements to PostgreSQL wait for Kafka's.
    `rebaser` re-snapshots tables rewritten without change events (snapshot/rebase.py); without
    one the stream only warns about them (cdc/rebase.py)."""
    from cdc.log import open_log

    log = open_log(pipeline)
    publisher = None
    try:
        ack_limit = None
        check_publisher = None
        if pipeline.log_config.kafka is not None:
            from cdc.log.kafka.child import PublisherProcess, PublishWatch, check_broker
            from cdc.log.kafka.publisher import published_lsn

            check_broker(pipeline)
            publisher = PublisherProcess(pipeline)
            publisher.start()
            log.on_commit = publisher.wake  # each cut is published as soon as it is durable
            ack_limit = lambda: published_lsn(log)  # noqa: E731
            watch = PublishWatch(pipeline, log, say)  # says when the broker is away, and when it is back

            def check_publisher() -> None:
                publisher.check()
                watch.check()

        reader = StreamReader(
            pipeline,
            log,
            until=until,
            say=say,
            ack_limit=ack_limit,
            check_publisher=check_publisher,
            rebaser=rebaser,
        )
        return reader.run()
    finally:
        if publisher is not None:
            publisher.stop()
        log.close()


__all__ = ["CdcError", "StreamReader", "StreamStats", "run_stream"]
