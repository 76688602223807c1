"""`StreamReader`: one `cdc stream` run from the pipeline's slot into its log.

The reader is assembled from parts with one job each: the receive loop (cdc/stream/loop.py), the
rows of updates and deletes (changes.py), the tables and schema versions (relations.py); the slot
checks and reconnecting are in slot.py, unchanged-TOAST filling in toast.py. This module holds the
set-up, the run with its reconnects, acknowledgements to PostgreSQL, health and progress.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg2

from cdc import ddl, health
from cdc.filters import publication_drift, refused
from cdc.ground.errors import SourceError
from cdc.ground.lsn import format_lsn
from cdc.ground.tables import TableName, TableSelector
from cdc.log.local import LocalLog
from cdc.metrics import StreamMetrics
from cdc.metrics import error as count_error
from cdc.rebase import Rebaser, RewriteWatch
from cdc.schema import TypeCache
from cdc.source import flushed_wal_lsn, make_failover_slot
from cdc.stream.changes import ChangeRows
from cdc.stream.loop import ReceiveLoop
from cdc.stream.relations import Rel, RelationTracking
from cdc.stream.slot import (
    Stopped,
    check_slot,
    close_quietly,
    confirmed_position,
    connect_catalog,
    is_disconnected,
    one_line,
    retry_connecting,
    start_replication,
)
from cdc.tablewatch import TableWatch, check_pipeline_source, raise_unless_captured

logger = logging.getLogger(__name__)

# /healthz: the read loop moves at least every second while idle, per batch while busy; a loop
# still for this long is hung (a slow Kafka commit or a catalog query stays well below it)
STREAM_LIVE_S = 120.0


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


class StreamReader(ReceiveLoop, ChangeRows, RelationTracking):
    """`cdc stream` into `log`: set-up, the run with its reconnects, acknowledgements, health and progress."""

    def __init__(
        self,
        pipeline,
        log: LocalLog,
        *,
        until: str | int | None = None,
        progress_every_s: float = 10.0,
        install_signal_handlers: bool = True,
        ack_limit: Callable[[], int] | None = None,
        check_publisher: Callable[[], None] | None = None,
        rebaser: Rebaser | None = None,
    ):
        self.pipeline = pipeline
        self.log = log
        self.until = until
        self.progress_every_s = progress_every_s
        self.cfg = pipeline.stream
        self.selectors = [TableSelector.parse(t) for t in pipeline.source.postgres.tables]
        self.stats = StreamStats()
        self._stop = False
        self._install = install_signal_handlers
        self._types = TypeCache()
        self._rels: dict[int, Rel | None] = {}
        self._keys: dict[TableName, tuple[str, ...]] = {}
        self._keyless: set[TableName] = set()
        self.identity_warned: set[TableName] = set()
        self.ack_limit = ack_limit
        self.check_publisher = check_publisher  # raises if the Kafka publisher child stopped
        # captured tables renamed or dropped in the source; remedies name the pipeline file as given
        self._watch = TableWatch(log, pipeline.command)
        self._rebaser = rebaser
        # tables changed without change events
        self._rewrites = RewriteWatch(log, pipeline.state_path, rebaser, pipeline.command)
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
        conn = self._conn = connect_catalog(self.pipeline)
        gone = self._watch.start(conn)  # a dropped table still in the file must not stop the stream
        report = check_pipeline_source(self.pipeline, conn, gone)
        self.identity_warned |= raise_unless_captured(report)
        check_slot(conn, self.pipeline, self.log)
        if pg.failover and make_failover_slot(pg.dsn, self.pipeline.slot):
            logger.info(
                f"replication slot {self.pipeline.slot} is now a failover slot (source.postgres.failover)"
            )
        for t in report.tables:
            self._keys[t.table] = t.key_columns
        self._keyless = {t.table for t in report.tables if t.insert_only or t.multiset}
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
                    if not is_disconnected(exc, self._rconn, getattr(self, "_conn", None)):
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
            raise SourceError(f"the change stream failed: {one_line(exc)}") from None
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

    # ---- connections and reconnecting (cdc/stream/slot.py) ------------------------------------------
    def _skip_upto(self) -> int:
        position = self.log.stream_position()
        return position[0] if position else -1

    def _start_replication(self):
        self._rconn, cur = start_replication(self.pipeline, self._conn)
        self._connected = True
        self._beat.beat()
        return cur

    def _close_connections(self) -> None:
        close_quietly(self._rconn, getattr(self, "_conn", None))
        self._rconn = None

    def _reconnect(self, exc: BaseException):
        """Reconnect with bounded exponential backoff for up to stream.reconnect_timeout_s, then
        resume from the slot. Nothing is lost: the slot is only ever acknowledged up to what is
        durable in the log, the open (uncommitted) batch is dropped here, and the server resends
        from the slot's position; transactions already in the log are skipped by commit LSN.
        Returns the new replication cursor, or None when a stop was requested meanwhile."""
        limit = self.cfg.reconnect_timeout_s
        lost = one_line(exc)
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
        logger.info(
            f"lost the connection to the source ({lost}); reconnecting for up to {limit:g}s "
            "(stream.reconnect_timeout_s); the slot keeps the WAL, nothing is lost"
        )
        started = time.monotonic()

        def attempt():
            self._close_connections()
            self._conn = connect_catalog(self.pipeline)
            check_slot(self._conn, self.pipeline, self.log)  # gone: SourceError, not retried; busy: retried
            return self._start_replication()

        try:
            cur, attempts = retry_connecting(attempt, limit, self._pause)
        except Stopped:
            return None
        self._rels.clear()  # the new walsender sends every relation again before its first change
        self._acked = 0  # acknowledge again on the new connection
        self._limit_checked = 0.0
        at = confirmed_position(self._conn, self.pipeline.slot)
        logger.info(
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
        raise Stopped

    def _report(self, final: bool = False) -> None:
        s = self.stats
        rate = s.events / max(s.seconds, 1e-6)
        target = f" of {format_lsn(s.target_lsn)}" if s.target_lsn else ""
        prefix = "streamed" if final else "streaming:"
        logger.info(
            f"{prefix} {s.events:,} events in {s.transactions:,} transactions ({rate:,.0f} events/s), "
            f"log durable at {format_lsn(s.flushed_lsn)}{target}"
        )
