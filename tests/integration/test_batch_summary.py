"""A batch's summary pass (sinks/changes.py TableBatch._summary: the last truncate, unchanged TOAST
values, row, delete and non-insert counts, values that cannot be stored) gives the same answer for
events already in the driver (summed up there, with no Spark job) as for events read in executors
(one aggregate over the cached events); both stop the batch on the same unstorable values."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cdc.ground.errors import SinkError
from cdc.ground.tables import TableName
from cdc.log.base import Column, TableSchema
from pipelines.apply.readers.base import SCHEMA as EVENT_SCHEMA
from sinks.changes import TableBatch

pytestmark = pytest.mark.integration

TABLE = TableName("public", "t")
TYPES = {
    23: {"oid": 23, "name": "int4", "kind": "base"},
    1082: {"oid": 1082, "name": "date", "kind": "base"},
    25: {"oid": 25, "name": "text", "kind": "base"},
}
SCHEMA = TableSchema(
    (Column("id", 23, -1, attnum=1), Column("d", 1082, -1, attnum=2), Column("note", 25, -1, attnum=3)),
    ("id",),
    TYPES,
)
NONE3: list[str | None] = [None, None, None]
STORABLE = [  # (lsn, seq, op, key, vals, unch)
    (10, 0, "c", b"1", ["1", "2024-01-01", "a"], []),
    (11, 0, "u", b"1", ["1", "2024-01-02", None], [2]),  # note: unchanged TOAST
    (12, 0, "t", b"", NONE3, []),
    (13, 0, "d", b"3", ["3", None, None], []),
    (14, 0, "t", b"", NONE3, []),  # the last truncate
    (15, 0, "c", b"4", ["4", "2024-01-03", "z"], []),
]
UNSTORABLE = [
    (16, 0, "u", b"2", ["2", "infinity", "b"], []),  # no Spark date for it
    (17, 0, "c", b"5", ["x", "2024-01-01", "c"], []),  # not an int4
]


_ARROW_EVENTS = pa.schema(
    [
        ("off", pa.int64()),
        ("lsn", pa.int64()),
        ("seq", pa.int64()),
        ("op", pa.string()),
        ("key", pa.binary()),
        ("vals", pa.list_(pa.string())),
        ("unch", pa.list_(pa.int32())),
        ("ts", pa.int64()),
    ]
)


def _batch(spark, rows: list[tuple], where: str) -> TableBatch:
    """The events held as pyarrow in the driver ("held", as the embedded log's reader hands a small
    range over), in the driver as Spark data only ("driver"), or spread over executors ("spread")."""
    events = [
        (i + 1, lsn, seq, op, key, vals, unch, 1_700_000_000_000_000 + i)
        for i, (lsn, seq, op, key, vals, unch) in enumerate(rows)
    ]
    columns = list(zip(*events, strict=True)) or [()] * len(_ARROW_EVENTS)  # an empty range too
    held = pa.table(dict(zip(_ARROW_EVENTS.names, columns, strict=True)), schema=_ARROW_EVENTS)
    frame = spark.createDataFrame(held, schema=EVENT_SCHEMA)
    if where == "spread":
        frame = frame.repartition(2)  # not folded away: read like an executor's range
    batch = TableBatch(TABLE, SCHEMA, frame, False, None, 0, len(rows), "pgtext")
    batch.held = held if where == "held" else None
    return batch


def _last_job(spark) -> int:
    return max(spark.sparkContext.statusTracker().getJobIdsForGroup(None), default=-1)


def test_driver_summary_matches_the_aggregate_and_runs_no_job(spark) -> None:
    held, local, spread = (_batch(spark, STORABLE, w) for w in ("held", "driver", "spread"))
    assert local.in_driver and not spread.in_driver
    assert held.typed_in_driver is not None and local.typed_in_driver is None
    before = _last_job(spark)
    held.check()
    local.check()
    assert _last_job(spark) == before, "the summary of events in the driver started a Spark job"
    spread.check()
    assert _last_job(spark) > before
    assert (
        held._summary
        == local._summary
        == spread._summary
        == {
            "truncate": (14, 0),
            "unchanged": True,
            "rows": 6,
            "deletes": 1,
            "not_inserts": 4,
        }
    )
    # the net change is the same rows either way (the local one is never cached)
    assert sorted(local.net().df.collect()) == sorted(spread.net().df.collect())
    spread.release()


def test_driver_summary_stops_on_the_same_unstorable_values(spark) -> None:
    errors = []
    for where in ("held", "driver", "spread"):
        batch = _batch(spark, STORABLE + UNSTORABLE, where)
        assert batch.typed_in_driver is None  # pyarrow parses neither value: Spark decides
        with pytest.raises(SinkError) as raised:
            batch.check()
        errors.append(str(raised.value))
        batch.release()
    assert errors[0] == errors[1] == errors[2]
    assert "2 column(s) affected: id, d" in errors[0], errors[0]
    assert "first at key 5" in errors[0], errors[0]


INSERTS = [
    (20, 0, "c", b"7", ["7", "2024-02-01", "p"], []),
    (20, 1, "c", b"8", ["8", "2024-02-02", "q"], []),
    (21, 0, "c", b"9", ["9", "2024-02-03", "r"], []),
]


def test_a_range_of_new_keys_is_its_own_net_change(spark) -> None:
    """Inserts alone, of keys the log promises are new (`inserts_new`): each key occurs once, so the
    net change is the typed events themselves, with no grouping; read in the driver it stays there
    (no Spark job to net it). The same range without that promise is grouped, with the same rows."""
    promised, grouped, held = (
        _batch(spark, INSERTS, "driver"),
        _batch(spark, INSERTS, "driver"),
        _batch(spark, INSERTS, "held"),
    )
    promised.inserts_new = held.inserts_new = True
    assert promised.inserts_only and grouped.inserts_only and held.inserts_only
    before = _last_job(spark)
    net = promised.net().df.collect()
    assert _last_job(spark) == before, "netting a range of new keys in the driver started a Spark job"
    assert sorted(net) == sorted(grouped.net().df.collect())
    # held as pyarrow: the same rows, typed there, ride along for a writer in this process
    before = _last_job(spark)
    typed = held.net()
    assert _last_job(spark) == before, "typing a range held in the driver started a Spark job"
    assert promised.net().arrow is None
    assert typed.arrow.to_pylist() == typed.df.toArrow().cast(typed.arrow.schema).to_pylist()
    assert typed.arrow.num_rows == len(net) == 3
    assert [(r["id"], r["note"], r["_cdc_op"]) for r in sorted(net)] == [
        (7, "p", "c"),
        (8, "q", "c"),
        (9, "r", "c"),
    ]
    # a delete in the range: keys may repeat, so the range is netted as before
    mixed = _batch(spark, [*INSERTS, (22, 0, "d", b"7", ["7", None, None], [])], "driver")
    mixed.inserts_new = True
    assert not mixed.inserts_only
    assert sorted((r["id"], r["_cdc_op"]) for r in mixed.net().df.collect()) == [(7, "d"), (8, "c"), (9, "c")]


MIXED = [  # (lsn, seq, op, key, vals, unch): repeats, deletes, truncates and re-inserts of keys
    (30, 0, "c", b"1", ["1", "2024-01-01", "a"], []),
    (30, 1, "u", b"1", ["1", "2024-01-02", "a2"], []),  # same transaction, later seq wins
    (30, 2, "c", b"2", ["2", "2024-01-01", "b"], []),
    (31, 0, "t", b"", NONE3, []),  # everything before it goes
    (32, 0, "c", b"3", ["3", "2024-01-03", "c"], []),
    (32, 1, "d", b"3", ["3", None, None], []),  # inserted then deleted: a delete row
    (33, 0, "c", b"4", ["4", "2024-01-04", "d"], []),
    (34, 1, "d", b"4", ["4", None, None], []),
    (35, 0, "c", b"4", ["4", "2024-01-05", "e"], []),  # deleted then inserted again: the insert
    (36, 3, "u", b"5", ["5", "2024-01-06", "f"], []),
    (36, 2, "u", b"5", ["5", "2024-01-07", "g"], []),  # read later, committed earlier: seq 3 wins
    (37, 0, "c", b"10", ["10", None, "\u00fc\u2713"], []),
    (37, 1, "c", b"1", ["1", "2024-02-01", "after the truncate"], []),
]


TOASTED = [  # note (text) may be left unchanged by an update: a TOASTed value PostgreSQL did not send
    (40, 0, "u", b"1", ["1", "2024-03-01", None], [2]),  # nothing known in the cut: keep the follower's
    (41, 0, "c", b"2", ["2", "2024-03-01", "known"], []),
    (42, 0, "u", b"2", ["2", "2024-03-02", None], [2]),  # the insert's value
    (42, 1, "u", b"2", ["2", "2024-03-03", None], [2]),
    (43, 0, "u", b"3", ["3", "2024-03-01", "old"], []),
    (44, 0, "u", b"3", ["3", "2024-03-01", None], [2]),
    (45, 0, "u", b"3", ["3", "2024-03-02", "new"], []),  # sent again: the newest value
    (46, 0, "u", b"4", ["4", None, None], [2]),
    (46, 1, "d", b"4", ["4", None, None], []),  # a delete knows the column (NULL)
    (47, 0, "u", b"5", ["5", "2024-03-01", "before"], []),
]
TRUNCATED = [
    *TOASTED,
    (48, 0, "t", b"", NONE3, []),  # hides what came before it: key 5's value is not known
    (49, 0, "u", b"5", ["5", "2024-03-09", None], [2]),
]


@pytest.mark.parametrize(
    "rows",
    [MIXED, MIXED[:3], MIXED[3:4], [], TOASTED, TRUNCATED, STORABLE],
    ids=["mixed", "no-truncate", "truncate-only", "empty", "toasted", "toasted-truncated", "summary-rows"],
)
def test_a_range_held_in_the_driver_is_netted_there_as_spark_nets_it(spark, rows) -> None:
    """A range held as pyarrow whose columns pyarrow types is netted by pyarrow too
    (sinks/arrownet.py): per key the newest event after the last truncate, an unchanged TOAST
    value taken from the newest event that knows it (flagged when none does), the same rows and
    flags Spark's netting gives, with no Spark job; a delta-rs MERGE takes them as they are."""
    held, spread = _batch(spark, rows, "held"), _batch(spark, rows, "spread")
    before = _last_job(spark)
    ours = held.net()
    assert _last_job(spark) == before, "netting a range held in the driver started a Spark job"
    theirs = spread.net()
    assert theirs.arrow is None
    assert ours.arrow is not None
    key = lambda r: (r["id"], r["_cdc_lsn"], r["_cdc_seq"])  # noqa: E731
    expected = sorted(theirs.df.toArrow().cast(ours.arrow.schema).to_pylist(), key=key)
    assert sorted(ours.arrow.to_pylist(), key=key) == expected
    assert (
        ours.unchanged
        == theirs.unchanged
        == ({"note": "__cdc_u_2"} if rows in (TOASTED, TRUNCATED, STORABLE) else {})
    )
    if rows is TOASTED:
        assert [(r["id"], r["note"], r["__cdc_u_2"]) for r in expected] == [
            (1, None, True),
            (2, "known", False),
            (3, "new", False),
            (4, None, False),
            (5, "before", False),
        ]
    if rows is TRUNCATED:
        assert [(r["id"], r["note"], r["__cdc_u_2"]) for r in expected] == [(5, None, True)]
    if rows is MIXED:
        assert [(r["id"], r["_cdc_op"], r["note"]) for r in expected] == [
            (1, "c", "after the truncate"),
            (3, "d", None),
            (4, "c", "e"),
            (5, "u", "f"),
            (10, "c", "\u00fc\u2713"),
        ]
