"""Blocking reads of the local log for the feed (run in worker threads, one log connection each).

A position is a table's log offset (cdc/log/base.py): a client at position N holds every event of
the table at offsets <= N. Events are grouped into whole source transactions (same commit LSN;
a transaction's events of one table sit at consecutive offsets), so an event id is always the last
offset of a transaction and a resume never splits one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson

from cdc.envelope import EnvelopeRenderer
from cdc.ground.config import Pipeline
from cdc.ground.tables import TableName
from cdc.log import open_log
from cdc.log.base import Cut, LogRecord, TableState
from cdc.log.local import LocalLog
from cdc.pgoutput import UNCHANGED
from pipelines.serve.shape import TableShape

T = TypeVar("T")


@dataclass(slots=True)
class Change:
    envelope: bytes  # exactly what `cdc log read` prints for the event
    _doc: dict[str, Any] | None = None

    @property
    def doc(self) -> dict[str, Any]:  # parsed only when a subscription filters
        if self._doc is None:
            self._doc = orjson.loads(self.envelope)
        return self._doc


@dataclass(slots=True)
class Txn:
    lsn: int  # the source commit LSN
    last: int  # the last offset: the event id
    version: int  # the schema version of its first event (a change of version means: start over)
    changes: list[Change] = field(default_factory=list)
    wire: bytes | None = None  # its SSE event, encoded once for every unfiltered subscriber


@dataclass(frozen=True)
class Batch:
    txns: list[Txn]
    position: int  # where the read stopped (the last txn's offset, or `upto` when all was read)
    rebuilt: bool = False  # a new snapshot of the table was found in the range


class Access(Protocol):
    """What the feed reads of a log (blocking: called from worker threads); local or Kafka."""

    database: str

    def latest(self) -> tuple[Cut | None, dict[TableName, TableState]]: ...
    def read_txns(
        self, renderer: EnvelopeRenderer, shape: TableShape, after: int, upto: int, max_events: int
    ) -> Batch: ...
    def state_at(
        self, renderer: EnvelopeRenderer, shape: TableShape, base: int, end: int
    ) -> list[Change]: ...
    def version_at(self, table: TableName, position: int) -> int | None: ...
    def key(self, table: TableName) -> tuple[str, ...]: ...
    def purged_below(self, state: TableState) -> int: ...


class LogAccess:
    """The local log, read from worker threads: one read-only connection per thread."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self._local = threading.local()
        self.database = ""

    def log(self) -> LocalLog:
        log = getattr(self._local, "log", None)
        if log is None:
            log = self._local.log = open_log(self.pipeline, readonly=True)
            self.database = log.meta("source_database") or ""
        return log

    def call(self, fn: Callable[[LocalLog], T]) -> T:
        return fn(self.log())

    def latest(self) -> tuple[Cut | None, dict[TableName, TableState]]:
        return latest(self.log())

    def read_txns(
        self, renderer: EnvelopeRenderer, shape: TableShape, after: int, upto: int, max_events: int
    ) -> Batch:
        return read_txns(self.log(), renderer, shape, after, upto, max_events)

    def state_at(self, renderer: EnvelopeRenderer, shape: TableShape, base: int, end: int) -> list[Change]:
        return state_at(self.log(), renderer, shape, base, end)

    def version_at(self, table: TableName, position: int) -> int | None:
        return version_at(self.log(), table, position)

    def key(self, table: TableName) -> tuple[str, ...]:
        return self.log().schema(table).key

    def purged_below(self, state: TableState) -> int:
        return state.purged_below


def latest(log: LocalLog) -> tuple[Cut | None, dict[TableName, TableState]]:
    return log.latest_cut(), {s.table: s for s in log.tables()}


def read_txns(
    log: LocalLog, renderer: EnvelopeRenderer, shape: TableShape, after: int, upto: int, max_events: int
) -> Batch:
    """Whole transactions with after < offset <= upto (`upto` a cut's end), at most about max_events."""
    txns: list[Txn] = []
    for count, rec in enumerate(log.read(shape.table, after, upto)):
        if rec.op == "r":
            return Batch(txns, txns[-1].last if txns else after, rebuilt=True)
        if txns and txns[-1].lsn == rec.lsn:
            txn = txns[-1]
        else:
            if count >= max_events:
                return Batch(txns[:], txns[-1].last)
            txn = Txn(rec.lsn, rec.offset, rec.schema_version)
            txns.append(txn)
        txn.changes.append(Change(renderer.value_json(shape.apply(rec))))
        txn.last = rec.offset
    return Batch(txns, upto)


def state_at(
    log: LocalLog, renderer: EnvelopeRenderer, shape: TableShape, base: int, end: int
) -> list[Change]:
    """The table's rows as of a cut: the newest event per key from its base, deletes and truncates
    applied, unchanged TOAST values filled from older events (what a new follower bootstraps)."""
    from cdc.keys import key_texts

    rows: dict[tuple, LogRecord] = {}
    for rec in log.read(shape.table, base - 1, end):
        if rec.op == "t":
            rows.clear()
            continue
        key = tuple(key_texts(rec.key or b""))
        if rec.op == "d":
            rows.pop(key, None)
            continue
        old = rows.get(key)
        if old is not None and rec.values is not None and any(v is UNCHANGED for v in rec.values):
            names = old.schema.column_names
            prev = dict(zip(names, old.values or [], strict=False))
            rec.values = [
                prev.get(n, v) if v is UNCHANGED else v
                for n, v in zip(rec.schema.column_names, rec.values, strict=True)
            ]
        rows[key] = rec
    return [Change(renderer.value_json(shape.apply(rec))) for rec in rows.values()]


def version_at(log: LocalLog, table: TableName, position: int) -> int | None:
    """The schema version of the newest stored event at or below `position` (None: none left)."""
    tid = log.require_table(table)
    row = log.db.execute(
        f"SELECT sv FROM ev_{tid} WHERE off <= ? ORDER BY off DESC LIMIT 1", (position,)
    ).fetchone()
    return None if row is None else int(row[0])
