"""Whole updates for compacted topics: unchanged-TOAST values filled from the staging log.

An update that left a TOASTed column alone carries UNCHANGED for it, which the envelope renders
as Debezium's placeholder ("keep the value you have"). Kafka compaction eventually drops the
record that held the value (the snapshot row, an earlier insert or update), and a follower
bootstrapping from the topic would then keep the placeholder. So the publisher sends such
updates whole, rendered exactly as if the source had sent every value.

A value comes from the newest older event of the same key that has it, walking back through
updates to the insert or snapshot row, never past a delete, a truncate, the table's base or a
schema version change (as `cdc log compact` merges them, see compact._merge_unchanged). A value
not found (e.g. in a compacted staging log) stays a placeholder.

Cost: a record without UNCHANGED passes with an op test. The first update needing a lookup
opens a window of records; at its end, one backward scan of the table's events and at most one
pass over the base's segment files resolve every key of the window. The rows then stay
remembered for the rest of the run, so later updates of those keys need no query.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cdc.ground.tables import TableName
from cdc.log.base import LogRecord
from cdc.log.local import LocalLog, decode_text_tuple
from cdc.pgoutput import UNCHANGED

# Records held back at most before a batched lookup; also bounds the keys of one lookup, each a
# bound parameter of one statement (SQLite allows 32766). Larger: fewer scans, more memory.
WINDOW = 5000
MAX_ROWS = 10000  # rows remembered per run (TOAST values can be large)

Row = list[Any]
State = tuple[int, Row | None]  # (schema version, newest known row of a key; None: no row)
NOTHING: State = (-1, None)


def fill_unchanged(log: LocalLog, table: TableName, records: Iterable[LogRecord]) -> Iterator[LogRecord]:
    """The records in order, updates' unchanged-TOAST values filled where the log has them."""
    return ToastFiller(log, table).fill(records)


def _merge(newer: Row, older: Row) -> Row:
    """`newer` with its UNCHANGED values taken from `older` (same schema version, same length)."""
    return [o if v is UNCHANGED else v for v, o in zip(newer, older, strict=True)]


def _same_layout(state: State, sv: int, values: Row) -> bool:
    return state[0] == sv and state[1] is not None and len(state[1]) == len(values)


@dataclass
class _Window:
    """Records held back until the lookups their updates need are done, in one batch."""

    records: list[LogRecord] = field(default_factory=list)
    seen: set[bytes] = field(default_factory=set)
    wanted: set[bytes] = field(default_factory=set)  # keys of updates to fill, not remembered yet
    lookup: set[bytes] = field(default_factory=set)  # ... whose row before the window matters

    def add(self, rec: LogRecord, remembered: dict[bytes, State]) -> None:
        self.records.append(rec)
        key = rec.key
        if key is None:
            return
        needs = rec.op == "u" and UNCHANGED in (rec.values or ())
        if needs and key not in remembered and key not in self.wanted:
            self.wanted.add(key)
            if key not in self.seen:  # else an earlier record of the window tells the row
                self.lookup.add(key)
        self.seen.add(key)

    def full(self) -> bool:
        return len(self.records) >= WINDOW


class _Walk:
    """Newest-first events of some keys merged into each key's row as of a position."""

    def __init__(self, keys: set[bytes]) -> None:
        self.open = set(keys)  # keys whose row may still take values from older events
        self.states: dict[bytes, State] = {}
        self.segments: list[int] = []  # the base's snapshot segments, once the walk reaches them
        self.segment_version = 0
        self._marker: int | None = None

    def step(self, off: int, key: bytes | None, op: str, payload: bytes | None, sv: int) -> bool:
        """Take one event; False once nothing older can matter."""
        if op == "S":
            if self._marker is not None and off != self._marker - 1:
                return False  # an older snapshot's markers: below the base
            self._marker, self.segment_version = off, sv
            if payload:
                self.segments.append(int(payload))
            return True
        if self._marker is not None or op == "t":
            return False  # below the base, or before a truncate: another history
        if key is not None and key in self.open:
            self.take(key, op, decode_text_tuple(payload), sv)
        return bool(self.open)

    def take(self, key: bytes, op: str, values: Row | None, sv: int) -> None:
        state = self.states.get(key)
        if op == "d" or values is None or (state is not None and not _same_layout(state, sv, values)):
            self.open.discard(key)  # a delete or a schema change: older values do not apply
            return
        row = values if state is None else _merge(state[1] or [], values)
        self.states[key] = (sv, row)
        if op != "u" or UNCHANGED not in row:
            self.open.discard(key)


class ToastFiller:
    """Fills updates of one table during one publishing run, remembering rows it resolved."""

    def __init__(self, log: LocalLog, table: TableName) -> None:
        self.log = log
        self.table = table
        self.rows: dict[bytes, State] = {}  # once a key is here, every record of it updates it

    def fill(self, records: Iterable[LogRecord]) -> Iterator[LogRecord]:
        rows = self.rows
        window: _Window | None = None
        for rec in records:
            if window is not None:
                window.add(rec, rows)
                if window.full():
                    yield from self._flush(window)
                    window = None
            elif rows and (rec.key in rows or rec.op == "t"):
                self._track(rec)
                yield rec
            elif rec.op == "u" and UNCHANGED in (rec.values or ()):
                window = _Window()
                window.add(rec, rows)
            else:
                yield rec
        if window is not None:
            yield from self._flush(window)

    def _flush(self, window: _Window) -> list[LogRecord]:
        found = self._history(window.lookup, window.records[0].offset) if window.lookup else {}
        for key in window.wanted:
            self.rows[key] = found.get(key, NOTHING)
        for rec in window.records:
            if rec.key in self.rows or rec.op == "t":
                self._track(rec)
        if len(self.rows) > MAX_ROWS:
            self.rows.clear()  # forgetting is safe: a key not remembered is looked up again
        return window.records

    def _track(self, rec: LogRecord) -> None:
        """Apply a record of a remembered key (or a truncate) in order, filling it if need be."""
        if rec.op == "t":
            for key in self.rows:
                self.rows[key] = NOTHING
            return
        assert rec.key is not None
        if rec.op == "d" or rec.values is None:
            self.rows[rec.key] = NOTHING
            return
        if rec.op == "u" and UNCHANGED in rec.values:
            known = self.rows[rec.key]
            if _same_layout(known, rec.schema_version, rec.values):
                rec.values = _merge(rec.values, known[1] or [])
        self.rows[rec.key] = (rec.schema_version, rec.values)

    def _history(self, keys: set[bytes], below: int) -> dict[bytes, State]:
        """Each key's row as of just below offset `below`: one backward scan, then one pass over
        the base's snapshot segments for keys whose history reaches back that far."""
        walk = _Walk(keys)
        with contextlib.closing(self.log.key_events_before(self.table, keys, below)) as events:
            for off, key, op, payload, sv in events:
                if not walk.step(off, key, op, payload, sv):
                    break
        if walk.segments and walk.open:
            rows = self.log.snapshot_rows(self.table, walk.segments, set(walk.open), walk.segment_version)
            with contextlib.closing(rows):
                for key, values in rows:
                    if key in walk.open:
                        walk.take(key, "r", values, walk.segment_version)
                    if not walk.open:
                        break
        return walk.states
