"""The key ranges of a chunked snapshot read side by side (snapshot/keyranges.py): bounds from the
boundary query, the in-order commit of chunks that finish in any order, the throttle, and a seeded
randomized model of ranges read side by side while the source is written to."""

from __future__ import annotations

import random

import pytest

from snapshot.keyranges import InOrder, KeyRange, range_from, throttle_delay
from snapshot.reconcile import WindowEvent, reconcile
from tests.fixtures.chunk_model import Source, k, replayed

pytestmark = pytest.mark.unit


def test_two_keys_found_bound_the_chunk_and_more_follow():
    chunk = range_from(3, ["300"], [["400"], ["401"]])
    assert chunk == KeyRange(3, ["300"], ["400"]) and not chunk.last


@pytest.mark.parametrize("found", [[], [["400"]]], ids=["fewer-left", "exactly-chunk-rows-left"])
def test_at_most_chunk_rows_left_is_the_open_ended_last_chunk(found):
    """Exactly chunk_rows keys left (the boundary query finds one key, none after it): this chunk
    is the last; no empty chunk follows a table of n * chunk_rows rows."""
    chunk = range_from(9, ["900"], found)
    assert chunk == KeyRange(9, ["900"], None) and chunk.last


def test_empty_table_is_one_open_chunk():
    assert range_from(0, None, []) == KeyRange(0, None, None)


def test_composite_keys_keep_their_columns():
    assert range_from(0, None, [["a", None], ["b", "2"]]).hi == ["a", None]


def test_chunks_finishing_out_of_order_come_out_in_order():
    order: InOrder[str] = InOrder(first=4)  # a resumed snapshot goes on at chunk 4
    assert order.add(5, "c5") == [] and order.waiting == 1  # read before chunk 4: held back
    assert order.add(7, "c7") == [] and order.waiting == 2
    assert order.add(4, "c4") == ["c4", "c5"] and order.waiting == 1
    assert order.add(6, "c6") == ["c6", "c7"] and order.waiting == 0
    with pytest.raises(ValueError, match="chunk 6 finished twice"):
        order.add(6, "again")


@pytest.mark.parametrize(
    ("planned", "limit", "elapsed", "delay"),
    [
        (0, 1000.0, 0.0, 0.0),  # the first chunk starts at once
        (4000, 16000.0, 0.1, 0.15),  # one chunk planned: the second waits until 0.25 s
        (4000, 16000.0, 0.3, 0.0),
        (10**9, None, 0.0, 0.0),  # unthrottled
    ],
)
def test_throttle_paces_chunk_starts(planned, limit, elapsed, delay):
    assert throttle_delay(planned, limit, elapsed) == pytest.approx(delay)


# ---- a model of chunks read side by side (the model of tests/unit/test_reconcile.py) ---------------
def side_by_side_snapshot(rng: random.Random, source: Source, chunk_rows: int, readers: int):
    """Returns (first low watermark, reconciled chunk rows in log order) of a snapshot whose key
    ranges are bounded before they are read (range_from over the keys at that moment) and read
    `readers` at a time, their steps (start: low = the last watermark; read: the rows of (lo, hi]
    at that moment; finish: high) interleaved at random with each other and with writes."""
    first_low = latest = source.tick()
    lo, number, planned_all = None, 0, False
    started: list[dict] = []  # chunks whose read has not finished
    done: list[tuple[int, list]] = []
    while not planned_all or started:
        step = rng.random()
        if step < 0.3:
            source.write()
        elif step < 0.5 and not planned_all and len(started) < readers:
            keys = [key for key in sorted(source.rows) if lo is None or key > int(lo[0])]
            chunk = range_from(number, lo, [[str(key)] for key in keys[chunk_rows - 1 : chunk_rows + 1]])
            started.append({"chunk": chunk, "low": latest, "rows": None})
            number, lo, planned_all = number + 1, chunk.hi, chunk.last
        elif started:
            one = rng.choice(started)
            chunk = one["chunk"]
            if one["rows"] is None:  # the read's snapshot
                lo_k = -1 if chunk.lo is None else int(chunk.lo[0])
                hi_k = None if chunk.hi is None else int(chunk.hi[0])
                one["rows"] = [
                    (key, source.rows[key])
                    for key in sorted(source.rows)
                    if key > lo_k and (hi_k is None or key <= hi_k)
                ]
            else:  # the read is over: its high watermark
                started.remove(one)
                latest = high = source.tick()
                window = [e for e in source.events if one["low"] < e.pos < high]
                events = [WindowEvent(None if e.key is None else k(e.key), e.op, e.whole) for e in window]
                kept = reconcile(((k(key), (key, row)) for key, row in one["rows"]), events)
                done.append((chunk.number, list(kept)))
    assert [n for n, _ in sorted(done)] == list(range(number))
    return first_low, [row for _, rows in sorted(done) for row in rows]


@pytest.mark.parametrize("readers", [2, 3])
@pytest.mark.parametrize("seed", range(150))
def test_randomized_writes_while_chunks_are_read_side_by_side_end_as_the_source(seed, readers):
    """Windows overlapping in time over different key ranges, rows inserted into (or moved by a key
    change into) ranges bounded or read already: the follower still ends as the source."""
    rng = random.Random(seed)
    source = Source(rng, rows=rng.randint(0, 40))
    for _ in range(rng.randint(0, 10)):
        source.write()
    first_low, chunk_rows = side_by_side_snapshot(rng, source, rng.randint(1, 8), readers)
    for _ in range(rng.randint(0, 10)):
        source.write()
    assert replayed(source, first_low, chunk_rows) == source.rows
