"""The read side of the embedded log: a table's events and snapshot rows between two offsets,
as parts other processes (Spark executors) can read on their own, plus the counts and lookups
followers, `cdc status` and the Kafka publisher ask for.

Events hold what the source sent, undecoded: pgoutput TupleData bytes for stream events and
COPY text for snapshot rows. Decoding happens when the log is read (here, in `cdc log read`,
and in Spark executors), which keeps capture as fast as PostgreSQL can send.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Container, Generator, Iterator, Sequence

from cdc.ground.errors import LogError
from cdc.ground.tables import TableName
from cdc.keys import key_from_copy_fields
from cdc.log.base import LogReader, LogRecord
from cdc.log.local.cuts import CutStore
from cdc.log.local.records import (
    EventRun,
    ReadPart,
    SegmentSlice,
    copy_fields_to_values,
    event_record,
    snapshot_record,
)
from cdc.log.local.segments import iter_segment, iter_segment_lines, iter_segment_lines_at
from cdc.log.local.store import EV_COLUMNS


class LocalReader(CutStore, LogReader):
    """Followers' reads; they never write (a read-only open is enough)."""

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
            f"SELECT off, lsn, sv, payload FROM ev_{tid} WHERE op = 'S' AND off > ? AND off <= ? ORDER BY off",
            (after, upto),
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
                parts.append(
                    SegmentSlice(off, lsn, sv, seg[0], start, min(start + segment_bytes, size), seg[1])
                )
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
        return (
            op1 == "d"
            and op2 == "c"
            and lsn1 == lsn2
            and seq2 == seq1 + 1
            and elsn1 is not None
            and elsn1 == elsn2
        )

    def read_part(self, table: TableName, part: ReadPart) -> Iterator[LogRecord]:
        tid = self.require_table(table)
        if isinstance(part, SegmentSlice):
            schema = self.schema_by_version(tid, part.version)
            for at, line in self.segment_lines_at(part):
                yield snapshot_record(table, part, schema, line, at)
            return
        for row in self.event_rows(table, part):
            yield event_record(table, row, self.schema_by_version(tid, row[8]))

    def segment_lines(self, part: SegmentSlice) -> Iterator[bytes]:
        """The slice's COPY text lines, newline removed (read_part's rows, not yet decoded)."""
        for line in iter_segment_lines(self.path / part.path, part.start, part.end):
            yield line.rstrip(b"\n")

    def segment_lines_at(self, part: SegmentSlice) -> Iterator[tuple[int, bytes]]:
        """segment_lines, each with the byte offset it starts at (a keyless row's position)."""
        return iter_segment_lines_at(self.path / part.path, part.start, part.end)

    def event_rows(self, table: TableName, part: EventRun) -> sqlite3.Cursor:
        """The run's stored rows (columns EV_COLUMNS), not yet decoded: see event_record."""
        tid = self.require_table(table)
        return self.db.execute(
            f"SELECT {EV_COLUMNS} FROM ev_{tid} WHERE off > ? AND off <= ? AND op != 'S' ORDER BY off",
            (part.after, part.upto),
        )

    # ---- key history (read-only; the Kafka publisher fills unchanged TOAST values from it) ---------
    def key_events_before(
        self, table: TableName, keys: Collection[bytes], below: int
    ) -> Generator[tuple[int, bytes | None, str, bytes | None, int]]:
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
    ) -> Generator[tuple[bytes, list[str | None]]]:
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
    # An insert ('c') is of a key the table did not hold just before it: the log holds every change
    # of the table in position order (sinks.changes.TableBatch.inserts_new)
    inserts_are_new = True

    def count_events(self, table: TableName, after: int, upto: int, below_lsn: int) -> int:
        """Events (snapshot markers included) in (after, upto] committed before `below_lsn`."""
        tid = self.require_table(table)
        n: int = self.db.execute(
            f"SELECT count(*) FROM ev_{tid} WHERE off > ? AND off <= ? AND lsn < ?", (after, upto, below_lsn)
        ).fetchone()[0]
        return n

    def first_offset_from(self, table: TableName, lsn: int, upto: int) -> int | None:
        """The first change event at or after commit LSN `lsn` (up to offset `upto`)."""
        tid = self.require_table(table)
        first: int | None = self.db.execute(
            f"SELECT min(off) FROM ev_{tid} WHERE lsn >= ? AND off <= ? AND op != 'S'", (lsn, upto)
        ).fetchone()[0]
        return first

    def end_offset_by_id(self, table_id: int) -> int:
        end: int = self.db.execute(f"SELECT coalesce(max(off), 0) FROM ev_{table_id}").fetchone()[0]
        return end

    def events_after(
        self, table_id: int, after: int
    ) -> Iterator[tuple[int, str, bytes | None, bytes | None]]:
        """(commit lsn, op, key, payload) of the table's events at offsets above `after`, in offset
        order (a chunked snapshot reads the stream's events inside a chunk's window from here)."""
        cur = self.db.execute(
            f"SELECT lsn, op, key, payload FROM ev_{table_id} WHERE off > ? AND op != 'S' ORDER BY off",
            (after,),
        )
        try:
            yield from cur
        finally:
            cur.close()  # an unfinished statement would pin the WAL snapshot

    def end_offset(self, table: TableName) -> int:
        tid = self.require_table(table)
        end: int = self.db.execute(f"SELECT coalesce(max(off), 0) FROM ev_{tid}").fetchone()[0]
        return end

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
        counts = dict(
            self.db.execute(
                f"SELECT op, count(*) FROM ev_{tid} WHERE off >= ? AND op != 'S' GROUP BY op", (base,)
            ).fetchall()
        )
        snap = self.db.execute(
            f"SELECT coalesce(sum(s.rows), 0) FROM ev_{tid} e JOIN segments s ON e.op = 'S' AND e.payload != x'' AND s.id = CAST(e.payload AS INTEGER)"
            " WHERE e.off >= ?",
            (base,),
        ).fetchone()[0]
        if snap:
            counts["r"] = snap
        return counts
