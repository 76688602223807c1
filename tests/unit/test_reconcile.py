"""Watermark chunk reconciliation (snapshot/reconcile.py): the rule on its own, and a seeded
randomized model of a source written to while a chunked snapshot reads it, checked by folding
the log (chunk rows at the first low watermark, then every stream event) like a follower does."""

from __future__ import annotations

import random

import pytest

from snapshot.reconcile import Reconciled, WindowEvent, choose_mode, reconcile, window_of
from tests.fixtures.chunk_model import Source, fold, k, replayed

pytestmark = pytest.mark.unit


def test_whole_events_inside_the_window_win():
    rows = [(k(1), "r1"), (k(2), "r2"), (k(3), "r3"), (k(4), "r4")]
    events = [WindowEvent(k(1), "u"), WindowEvent(k(2), "d"), WindowEvent(k(9), "c")]
    counts = Reconciled()
    assert list(reconcile(rows, events, counts)) == ["r3", "r4"]
    assert (counts.kept, counts.dropped) == (2, 2)


def test_update_that_keeps_a_toast_value_keeps_the_row_under_it():
    rows = [(k(1), "r1"), (k(2), "r2")]
    events = [WindowEvent(k(1), "u", whole=False)]
    assert list(reconcile(rows, events)) == ["r1", "r2"]
    # ... unless another event of the key inside the window carries the whole row
    events.append(WindowEvent(k(1), "u", whole=True))
    assert list(reconcile(rows, events)) == ["r2"]


def test_insert_and_delete_are_whole_even_if_marked_otherwise():
    window = window_of([WindowEvent(k(1), "c", whole=False), WindowEvent(k(2), "d", whole=False)])
    assert window.superseded == {k(1), k(2)}


def test_truncate_inside_the_window_wipes_the_chunk():
    rows = [(k(1), "r1"), (k(2), "r2")]
    assert list(reconcile(rows, [WindowEvent(None, "t")])) == []


def test_no_events_keeps_everything_in_order():
    rows = [(k(i), i) for i in range(5)]
    assert list(reconcile(rows, [])) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("mode", "key", "rows", "expected"),
    [
        ("auto", True, 5_000_000, "chunked"),
        ("auto", True, 10, "exported"),
        ("auto", False, 5_000_000, "exported"),
        ("chunked", False, 5_000_000, "exported"),
        ("chunked", True, 0, "chunked"),
        ("exported", True, 5_000_000, "exported"),
    ],
)
def test_choose_mode(mode, key, rows, expected):
    assert choose_mode(mode, key, rows, auto_min_rows=1_000_000) == expected


def chunked_snapshot(
    rng: random.Random, source: Source, chunk_rows: int, drop_all: bool = False, shared: bool = False
):
    """Returns (first low watermark, reconciled chunk rows in log order). `shared`: a chunk's high
    watermark is the next chunk's low one (snapshot/chunked.py), so writes between two chunks fall
    inside the next chunk's window."""
    first_low = source.tick()  # the first chunk's low watermark
    rows_out: list[tuple[int, tuple[str, str]]] = []
    last, high = 0, first_low
    while True:
        low = source.tick() if not shared and (rows_out or last) else high  # high: first_low at first
        for _ in range(rng.randint(0, 4)):
            source.write()
        # the chunk: keys above the last one, in key order, as of this moment
        chunk = [(key, source.rows[key]) for key in sorted(source.rows) if key > last][:chunk_rows]
        for _ in range(rng.randint(0, 4)):
            source.write()
        high = source.tick()
        window = [e for e in source.events if low < e.pos < high]
        events = [WindowEvent(None if e.key is None else k(e.key), e.op, e.whole or drop_all) for e in window]
        kept = reconcile(((k(key), (key, row)) for key, row in chunk), events)
        rows_out.extend(kept)
        for _ in range(rng.randint(0, 3)):
            source.write()
        if len(chunk) < chunk_rows:
            return first_low, rows_out
        last = chunk[-1][0]


@pytest.mark.parametrize("shared", [False, True], ids=["own-low-watermarks", "high-opens-next"])
@pytest.mark.parametrize("seed", range(200))
def test_randomized_writes_during_a_chunked_snapshot_end_exactly_as_the_source(seed, shared):
    rng = random.Random(seed)
    source = Source(rng, rows=rng.randint(0, 40))
    for _ in range(rng.randint(0, 10)):
        source.write()  # history before the snapshot (the log drops it: the chunks cover it)
    first_low, chunk_rows = chunked_snapshot(rng, source, chunk_rows=rng.randint(1, 8), shared=shared)
    for _ in range(rng.randint(0, 10)):
        source.write()  # the stream goes on after the snapshot
    assert replayed(source, first_low, chunk_rows) == source.rows


def test_dropping_rows_under_partial_updates_would_lose_a_toast_value():
    """Why the refinement: DBLog's plain rule (drop on any event) loses TOAST values."""
    losses = 0
    for seed in range(200):
        rng = random.Random(seed)
        source = Source(rng, rows=rng.randint(0, 40))
        first_low, chunk_rows = chunked_snapshot(rng, source, chunk_rows=rng.randint(1, 8), drop_all=True)
        follower = dict(chunk_rows)
        for event in source.events:
            if event.pos > first_low:
                fold(follower, event)
        losses += follower != source.rows
    assert losses > 0
