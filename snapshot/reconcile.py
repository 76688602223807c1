"""Reconciling a watermark chunk with the stream (pure: no I/O, unit-tested on its own).

A chunked snapshot (snapshot/chunked.py) copies a table in key-ordered chunks, each read in its
own short transaction between a low and a high watermark written into the WAL. While the chunk
is read, the source keeps changing, so a chunk row may be older or newer than a change event of
the same key that commits inside the window (low, high). Every chunk of a table goes into the log
as snapshot rows at the table's first low watermark, and every stream event committed after it
follows them, so followers end exactly as the source whatever the chunk saw (the last event of a
key is its current row; a key without events since the first watermark still has the row the
chunk read). Reconciling removes the chunk rows the stream's own events inside the window
supersede, DBLog's rule "events inside the window win over the chunk's rows", with one
refinement: a row is only dropped when one of those events carries the whole row. An update
that left a TOASTed value unchanged says "keep the value you have" and needs the chunk's row
underneath it, so such a key keeps its row. A truncate inside the window wipes the chunk (rows
read after it were inserted after it, and those inserts are events inside the window).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class WindowEvent:
    """A stream event of the chunk's table committed between the chunk's watermarks."""

    key: bytes | None  # canonical key (cdc/keys.py); None for a truncate
    op: str  # 'c' insert, 'u' update, 'd' delete, 't' truncate
    whole: bool = True  # the event needs no earlier value of its row (no unchanged TOAST value)


@dataclass
class Window:
    """What the events inside one chunk's window say about the chunk's rows."""

    superseded: set[bytes] = field(default_factory=set)  # keys whose chunk row the stream replaces
    truncated: bool = False  # a truncate inside the window: no chunk row survives

    def supersedes(self, key: bytes) -> bool:
        return self.truncated or key in self.superseded


def window_of(events: Iterable[WindowEvent]) -> Window:
    window = Window()
    for event in events:
        if event.op == "t":
            window.truncated = True
        elif event.key is not None and (event.op in ("c", "d") or event.whole):
            window.superseded.add(event.key)
    return window


@dataclass
class Reconciled:
    kept: int = 0
    dropped: int = 0


def reconcile(
    rows: Iterable[tuple[bytes, T]], events: Iterable[WindowEvent], counts: Reconciled | None = None
) -> Iterator[T]:
    """The chunk's rows (key, row) that stay, in their order; `counts` (if given) tallies them."""
    window = window_of(events)
    tally = counts if counts is not None else Reconciled()
    for key, row in rows:
        if window.supersedes(key):
            tally.dropped += 1
        else:
            tally.kept += 1
            yield row


def choose_mode(mode: str, orderable_key: bool, estimated_rows: int, auto_min_rows: int) -> str:
    """'exported' or 'chunked' for one table. `auto`: chunked for a table with an orderable key
    and at least `auto_min_rows` rows (pg_class.reltuples), where one long transaction would
    hold back vacuum; smaller tables copy faster in one exported snapshot. A table without an
    orderable key always takes the exported snapshot (chunks need a key order to resume at)."""
    if not orderable_key:
        return "exported"
    if mode == "auto":
        return "chunked" if estimated_rows >= auto_min_rows else "exported"
    return mode


__all__ = ["Reconciled", "Window", "WindowEvent", "choose_mode", "reconcile", "window_of"]
