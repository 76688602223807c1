"""The key ranges a chunked snapshot reads side by side (pure: no I/O; unit-tested on its own).

A chunked snapshot (snapshot/chunked.py) splits a table into closed key ranges (lo, hi] of
`chunk_rows` keys each. The upper bound of a range comes from a cheap query that walks the key's
btree (`... WHERE key > lo ORDER BY key OFFSET chunk_rows - 1 LIMIT 2`) before the range is read,
so the next range is known while this one is still being read, and several connections can read
ranges at once. Reads finish in any order; they join the log and the checkpoint in range order
(InOrder), so the checkpoint always names a prefix of the table and a restart goes on after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

Key = list[str | None]  # the key columns' values as text (their types' output), in key order


@dataclass(frozen=True)
class KeyRange:
    number: int  # the chunk's number (its segment's), in key order
    lo: Key | None  # exclusive lower bound; None: from the table's first key
    hi: Key | None  # inclusive upper bound; None: open-ended, the table's last chunk

    @property
    def last(self) -> bool:
        return self.hi is None


def range_from(number: int, lo: Key | None, found: list[Key]) -> KeyRange:
    """The chunk after `lo` from what the boundary query found: the keys at positions chunk_rows and
    chunk_rows + 1 after `lo` (at most two). Two: the first bounds the chunk and more keys follow.
    One or none: at most chunk_rows keys are left, so this chunk is the table's last, open-ended
    (it also reads rows inserted above it meanwhile), and a table of exactly n * chunk_rows rows
    is read in n chunks, not n + 1 with an empty one."""
    if len(found) >= 2:
        return KeyRange(number, lo, list(found[0]))
    return KeyRange(number, lo, None)


def throttle_delay(planned_rows: int, max_rows_per_s: float | None, elapsed_s: float) -> float:
    """Seconds to wait before starting a read so that the rows planned so far (chunk_rows per range
    already started) are read at no more than max_rows_per_s; 0: start now."""
    if not max_rows_per_s:
        return 0.0
    return max(0.0, planned_rows / max_rows_per_s - elapsed_s)


class InOrder(Generic[T]):
    """Chunks finish in any order and come out in chunk order: `add` returns the chunks that are
    now next in line (none while an earlier chunk is still being read)."""

    def __init__(self, first: int) -> None:
        self.next = first
        self._ready: dict[int, T] = {}

    def add(self, number: int, item: T) -> list[T]:
        if number < self.next or number in self._ready:
            raise ValueError(f"chunk {number} finished twice")
        self._ready[number] = item
        out = []
        while self.next in self._ready:
            out.append(self._ready.pop(self.next))
            self.next += 1
        return out

    @property
    def waiting(self) -> int:
        """Chunks read but held back behind an earlier one still being read."""
        return len(self._ready)


__all__ = ["InOrder", "Key", "KeyRange", "range_from", "throttle_delay"]
