"""Unchanged TOAST values in SCD2 followers (sinks/scd2.py fill_from_before), on DataFrames alone:
the value a version does not carry comes from the key's version before the cut, also when a crash
between the two commits of a cut left that version ended already (the replay must not write NULL)."""

from __future__ import annotations

from sinks.changes import NetChanges
from sinks.scd2 import fill_from_before


def test_unchanged_value_comes_from_the_version_before_the_cut_ended_or_not(spark) -> None:
    table = spark.createDataFrame(
        [
            (1, "old big", 10, 20),  # key 1: an older version
            (1, "big 1", 20, 50),  # ...and its newest before the cut, ended at 50 by a crashed run
            (2, "big 2", 15, None),  # key 2: still current
            (1, "replayed", 50, None),  # this cut's own version, found again by a replay
        ],
        "id int, big string, _cdc_start_lsn long, _cdc_end_lsn long",
    )
    cut = spark.createDataFrame(
        [(1, None, 50, True), (2, None, 60, True), (3, "new", 70, False)],
        "id int, big string, _cdc_lsn long, __cdc_unch_big boolean",
    )
    versions = NetChanges(cut, unchanged={"big": "__cdc_unch_big"})
    filled = {r["id"]: r["big"] for r in fill_from_before(versions, table, ("id",)).collect()}
    assert filled == {1: "big 1", 2: "big 2", 3: "new"}
