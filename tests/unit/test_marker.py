"""The follower's marker (sinks/marker.py) as the self-check reads it: markers that keep their own
position (Redis, tantivy, OpenSearch, and Delta/Iceberg markers written before issue 37) are
compared by offset; Delta and Iceberg markers keep only the fixed parts and are compared by the cut
their data commits carry against the cut the checkpoint says last wrote the table. The engines'
side is tested in tests/integration/test_follower_recovery.py and test_delta_cuts.py."""

from __future__ import annotations

import json

import pytest

from sinks.marker import Marker, lost_reason

pytestmark = pytest.mark.unit


def test_fixed_marker_stores_no_position_and_reads_back_with_the_commit_cut() -> None:
    full = Marker("p", "s", "log", 10, 42, 7)
    fixed = full.fixed()
    stored = json.loads(fixed.to_json())
    assert "end" not in stored and "cut_id" not in stored
    assert stored["pipeline"] == "p" and stored["base"] == 10
    back = Marker.from_json(fixed.to_json())
    assert back == fixed and back.end is None and back.cut_id is None
    assert back.with_cut(7) == Marker("p", "s", "log", 10, None, 7)
    assert back.same_follower == full.same_follower


def test_position_from_the_commit_compared_by_cut() -> None:
    expected = Marker("p", "s", "log", 10, 42, 7)  # the checkpoint: cut 7 last wrote the table
    held = Marker("p", "s", "log", 10, None, 7)
    assert lost_reason(held, expected) is None
    assert lost_reason(held.with_cut(9), expected) is None  # ahead (a cut replayed after reset --to-cut)
    behind = lost_reason(held.with_cut(5), expected)
    assert behind is not None and "up to cut 5" in behind and "cut 7" in behind
    none = lost_reason(held.with_cut(None), expected)
    assert none is not None and "no commit of this follower" in none
    # a checkpoint that does not know the table's cut (written before it kept one): the fixed parts only
    unknown = Marker("p", "s", "log", 10, 42, None)
    assert lost_reason(held.with_cut(None), unknown) is None
    assert lost_reason(held, Marker("p", "s", "log", 11, 42, 7)) is not None  # another base
    assert lost_reason(held, Marker("q", "s", "log", 10, 42, 7)) is not None  # another pipeline
    assert lost_reason(held, Marker("p", "s", "other", 10, 42, 7)) is not None  # another log


def test_old_markers_that_keep_their_position_still_compared_by_offset() -> None:
    old = Marker.from_json(
        json.dumps({"pipeline": "p", "sink": "s", "log_id": "log", "base": 10, "end": 40, "cut_id": 5})
    )
    assert old is not None and old.end == 40
    assert lost_reason(old, Marker("p", "s", "log", 10, 40, None)) is None
    assert lost_reason(old, Marker("p", "s", "log", 10, 40, 9)) is None  # the cut is not compared then
    behind = lost_reason(old, Marker("p", "s", "log", 10, 41, None))
    assert behind is not None and "up to log offset 40" in behind
    assert lost_reason(None, Marker("p", "s", "log", 10, 40, None)) is not None
    assert Marker.from_json('{"pipeline": "p"}') is None  # not a marker of ours
