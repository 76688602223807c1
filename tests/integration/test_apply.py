"""The apply path end to end: log -> Spark -> Delta followers (SCD1 and SCD2), against a real
PostgreSQL 15 and the session's SparkSession, checked with `cdc verify`.

Every scenario ends with `cdc verify` exit 0 (the follower equals the source) unless it is about
a failure. Spark pays a few seconds per MERGE, so scenarios that need the same shape of pipeline
share one (each assertion still names what it checks).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.capture import (
    Pipe,
    no_traceback,
    ok,
    restart_killed,
    start_stream,
    stop_stream,
)
from tests.fixtures.lake import (
    FAST_JVM,
    HIST,
    LAKE,
    apply_fails,
    apply_ok,
    assert_delta_is_source,
    ckpt,
    ckpt_file,
    cut_operations,
    delta_commits,
    delta_df,
    delta_dir,
    delta_rows,
    delta_version,
    duplicate_events,
    lake_app_id,
    log_events,
    make_pipe,
    snapshot,
    state_dir,
    stream,
    txn_commits,
    verified,
)
from tests.fixtures.pgtypes import TYPE_COLUMNS, type_table
from tests.fixtures.readers import delta_rows as delta_rs_rows
from tests.fixtures.readers import iceberg_cut_commits, iceberg_rows
from tests.fixtures.workload import BIG_TEXT, Writer, make_table
from tests.harness import (
    REPO,
    apply_crashing,
    cdc,
    cdc_popen,
    flush_wal,
    source_rows,
    sql,
    verify,
    write_pipeline,
)

pytestmark = pytest.mark.integration

# ---- 1. the capture list, applied --------------------------------------------------------------------
# Values Spark has no type for (BC/infinite dates and timestamps, arrays with more dimensions than
# declared) are replaced by holdable ones here; test_values_spark_cannot_hold has them.
HOLDABLE = {
    "c_date": ("date", ("'2024-02-29'", "'0001-01-01'")),
    "c_date2": ("date", ("'9999-12-31'", "'1970-01-01'")),
    "c_timestamp": ("timestamp", ("'2024-01-01 00:00:01.5'", "'0001-01-01 00:00:00'")),
    "c_timestamptz": ("timestamptz", ("'2024-01-01 12:00:00.5+05:30'", "'0001-01-01 00:00:00+00'")),
    "c_timestamptz2": (
        "timestamptz",
        ("'9999-12-31 23:59:59.999999+00'", "'10000-01-01 00:00:00.123456+00'"),
    ),
    "c_int_2d": ("int4[][]", ("'{{1,2},{3,NULL}}'", "'[0:0][0:1]={{7,8}}'")),
    "c_tstz_array": ("timestamptz[]", ("ARRAY['2024-01-01 00:00:00+00'::timestamptz, NULL]", "'{}'")),
    "c_numeric_array": ("numeric[]", ("'{1.50,NaN,-0.000001}'", "'{}'")),
}
APPLY_TYPES = [(name, *HOLDABLE.get(name, (typ, values))) for name, typ, values in TYPE_COLUMNS]


def _check_typed_values(spark, pipe: Pipe) -> None:
    """Spot checks of Delta values (so that verify's shared typing cannot be equally wrong on both
    sides), and the snapshot row, the streamed insert and the streamed update are the same row."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    df = delta_df(spark, pipe, "public.ty")
    names = [n for n, _, _ in APPLY_TYPES]
    times = (T.DateType, T.TimestampType, T.TimestampNTZType)

    def timelike(t: T.DataType) -> bool:
        return isinstance(t, times) or (isinstance(t, T.ArrayType) and timelike(t.elementType))

    # Dates and times as text: Python's datetime has no year 0 (0001-01-01 in another time zone).
    cols = [F.col(n).cast("string").alias(n) if timelike(df.schema[n].dataType) else F.col(n) for n in names]
    rows = {
        r["id"]: r for r in df.select("id", *cols, F.unix_micros("c_timestamptz").alias("tz_us")).collect()
    }
    assert sorted(rows) == [1, 2, 3, 101, 102, 103], sorted(rows)
    for i in (1, 2, 3):
        a, b = rows[i].asDict(), rows[i + 100].asDict()
        differ = {k: (a[k], b[k]) for k in a if k != "id" and not _same(a[k], b[k])}
        assert not differ, f"row {i}: streamed copy differs in Delta (row, copy): {differ}"
    r1, r2 = rows[1], rows[2]
    assert r1["c_int8"] == -9223372036854775808 and r1["c_int2"] == -32768
    assert r1["c_numeric_p"] == Decimal("1.50") and r1["c_domain_num"] == Decimal("1.50")
    assert (
        r1["c_numeric"] == "123456789012345678901234567890.000000000000000000001" and r2["c_numeric"] == "NaN"
    )
    assert math.isnan(r1["c_float4"]) and r1["c_float8"] == math.inf and r2["c_float4"] == -math.inf
    assert r1["c_bytea"] == b"\x00\xff\\\n\t" and r2["c_bytea"] == b""
    assert r1["c_bool"] is True and r1["c_bpchar"] == "ab   " and r1["c_enum"] == "with space"
    assert r1["c_text"] == "tab\there\nnew line\\back\\slash \\N \"dq\" 'sq' \r cr ü € 😀 \x01"
    assert r2["c_text"] == "" and r1["c_text2"] == "\\N"
    assert r1["c_text_array"] == ["a,b", 'c"d', None, "NULL", "back\\slash", "tab\t", ""]
    assert r1["c_int_array"] == [1, None, 3] and r1["c_int_2d"] == [[1, 2], [3, None]]
    assert r2["c_int_2d"] == [[7, 8]], "the array's dimension decoration ([0:0][0:1]=) is dropped"
    assert r1["tz_us"] == 1704090600500000, "timestamptz is not the instant 2024-01-01 06:30:00.5 UTC"
    assert r1["c_date"] == "2024-02-29" and r1["c_timestamp"] == "2024-01-01 00:00:01.5"
    assert r2["c_date"] == "0001-01-01" and r2["c_timestamptz2"] == "+10000-01-01 00:00:00.123456"
    assert all(rows[3][n] is None for n in names)


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_capture_list_applied_to_delta(pg_db: str, tmp_path: Path, spark) -> None:
    """Everything the capture tests cover, applied to Delta in three batches and verified against
    the source: snapshot with concurrent writes, every holdable type, unchanged TOAST (resolved
    inside a batch and from the Delta table itself), primary-key updates, delete + reinsert and
    many updates of a row in one transaction, truncates (with inserts in the same transaction,
    at the end of a batch with the inserts in the next), columns added and dropped (a DEFAULT
    reaching rows never touched again), a 30k-row transaction (more than one log batch) and 4k tiny ones streamed by a
    `cdc stream` killed with SIGKILL twice."""
    sql(
        pg_db,
        *type_table(APPLY_TYPES),
        "CREATE TABLE t(id int PRIMARY KEY, v text, n int NOT NULL DEFAULT 0, big text, dropme text)",
        "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL",
        "INSERT INTO t(id, v, dropme) SELECT g, 'x' || g, 'd' || g FROM generate_series(1, 5000) g WHERE g != 5",
        f"UPDATE t SET big = {BIG_TEXT} WHERE id <= 4",
        "ANALYZE t",
    )
    make_table(pg_db, "tr", 50)
    assert sql(pg_db, "SELECT min(length(big)) FROM t WHERE id <= 4")[0][0] > 8192
    pipe = make_pipe(tmp_path, pg_db, ["public.t", "public.ty", "public.tr"], sinks=[LAKE])

    # Batch 1: a snapshot taken while a writer changes t (ids > 100 are the writer's).
    writer = Writer(pg_db, "t", list(range(101, 5001)), next_id=1_000_001, seed=1, pause=0.001)
    writer.start()
    try:
        writer.wait_txns(20)
        snapshot(pipe)
        writer.wait_txns(len(writer.txns) + 20)
    finally:
        writer.finish()
    names = ", ".join(n for n, _, _ in APPLY_TYPES)
    sql(
        pg_db,
        # TOAST unchanged, the value known in the same batch (from the snapshot, from the stream)
        "UPDATE t SET n = 1 WHERE id = 1",
        f"INSERT INTO t(id, v, big) VALUES (5, 'toast in stream', {BIG_TEXT})",
        "UPDATE t SET n = 1 WHERE id = 5",
        # primary-key updates; a freed key taken again in the same transaction
        "UPDATE t SET id = id + 10000 WHERE id IN (10, 11)",
        "BEGIN",
        "UPDATE t SET id = 20000, v = 'moved' WHERE id = 12",
        "UPDATE t SET id = 12 WHERE id = 13",
        "COMMIT",
        # delete + reinsert (and delete again) in one transaction
        "BEGIN",
        "DELETE FROM t WHERE id = 20",
        "INSERT INTO t(id, v) VALUES (20, 'reborn')",
        "DELETE FROM t WHERE id = 21",
        "INSERT INTO t(id, v) VALUES (21, 'reborn')",
        "DELETE FROM t WHERE id = 21",
        "COMMIT",
        # 300 updates of one row (with a TOASTed value) in one transaction
        "DO $$ BEGIN FOR i IN 1..300 LOOP UPDATE t SET n = i, v = 'u' || i WHERE id = 3; END LOOP; END $$",
        # a column added and filled
        "ALTER TABLE t ADD COLUMN c int",
        "UPDATE t SET c = id WHERE id BETWEEN 30 AND 40",
        # every type streamed as an insert
        f"INSERT INTO ty(id, {names}) SELECT id + 100, {names} FROM ty",
        # truncate, then an insert; a truncate inside a transaction between inserts
        "TRUNCATE tr",
        "INSERT INTO tr VALUES (1, 'after truncate')",
        "BEGIN",
        "INSERT INTO tr VALUES (2, 'gone')",
        "TRUNCATE tr",
        "INSERT INTO tr SELECT g, 'same txn' FROM generate_series(5, 9) g",
        "COMMIT",
    )
    stream(pipe)
    apply_ok(pipe, spark)
    assert sorted(delta_rows(spark, pipe, "public.tr", ["v"])) == [5, 6, 7, 8, 9]

    # Batch 2, streamed by a `cdc stream` killed with SIGKILL twice while 4k tiny transactions and
    # a 30k-row one (over stream.batch_max_events) are written to t.
    proc = start_stream(pipe)
    tiny = Writer(
        pg_db, "t", writer.live, next_id=writer.next_id, seed=2,
        inserts=(0, 2), updates=(0, 2), deletes=(0, 1), max_txns=4_000,
    )  # fmt: skip
    tiny.start()
    try:
        sql(
            pg_db,
            # TOAST unchanged where the follower got the value in an earlier batch: from the Delta table
            "UPDATE t SET n = 2 WHERE id IN (1, 2, 5)",
            "BEGIN",
            "UPDATE t SET n = 3 WHERE id = 4",
            "UPDATE t SET v = 'twice' WHERE id = 4",
            "COMMIT",
            # a column with a default (rows never touched again must show it), a column dropped
            "ALTER TABLE t ADD COLUMN d int DEFAULT 42",
            "INSERT INTO t(id, v, d) VALUES (50000, 'explicit d', 7)",
            "INSERT INTO t(id, v) VALUES (50001, 'default d')",
            "UPDATE t SET v = 'touched after d' WHERE id = 60",
            "ALTER TABLE t DROP COLUMN dropme",
            "UPDATE t SET v = 'after drop' WHERE id = 61",
            # the same values again, as updates
            f"UPDATE ty SET {', '.join(f'{n} = {n}' for n, _, _ in APPLY_TYPES)} WHERE id < 100",
            # truncate + inserts in one transaction, over rows the follower has
            "BEGIN",
            "UPDATE tr SET v = 'then truncated' WHERE id = 5",
            "TRUNCATE tr",
            "INSERT INTO tr SELECT g, 'refill' FROM generate_series(20, 22) g",
            "COMMIT",
            "UPDATE tr SET v = 'late' WHERE id = 20",
        )
        tiny.wait_txns(800)
        sql(
            pg_db,
            "BEGIN",
            "INSERT INTO t(id, v) SELECT g, 'bulk' FROM generate_series(2000001, 2030000) g",
            "UPDATE t SET v = 'bulk touched' WHERE id BETWEEN 2000001 AND 2000100",
            "COMMIT",
            "TRUNCATE tr",  # the last change of tr in this batch: its inserts come in the next one
        )
        for count in (1800, 3000):
            tiny.wait_txns(count)
            proc = restart_killed(proc, pipe)
        tiny.finish()
        stop_stream(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        tiny.halt.set()
    assert len(tiny.txns) == 4_000
    stream(pipe)
    apply_ok(pipe, spark)
    assert delta_df(spark, pipe, "public.tr").count() == 0, "tr was truncated at the end of batch 2"

    # Batch 3: inserts after the truncate.
    sql(pg_db, "INSERT INTO tr SELECT g, 'after truncate' FROM generate_series(100, 104) g")
    stream(pipe)
    apply_ok(pipe, spark)
    verified(pipe, spark)

    t = delta_rows(spark, pipe, "public.t", ["v", "n", "big", "d"])
    src = {r[0]: r[1:] for r in sql(pg_db, "SELECT id, v, n, big, d FROM t WHERE id <= 5")}
    for i in (1, 2, 4, 5):
        assert t[i] == src[i], f"id {i}: Delta {t[i][:2]} big {len(t[i][2] or '')} chars, source {src[i][:2]}"
        assert len(t[i][2]) > 8192
    assert t[3][:2] == ("u300", 300), t[3][:2]
    not_42 = sorted(k for k, row in t.items() if row[3] != 42)
    assert not_42 == [50000], f"rows without the column default 42 in Delta: {not_42[:10]}"
    assert sum(1 for k in t if k > 2_000_000) == 30_000
    assert "dropme" in delta_df(spark, pipe, "public.t").columns, "a dropped source column stays in Delta"
    assert sorted(delta_rows(spark, pipe, "public.tr", ["v"])) == list(range(100, 105))
    _check_typed_values(spark, pipe)


# ---- 2 + 8. replays and duplicates change nothing; verify finds differences --------------------------
def test_replays_duplicates_and_verify_differences(pg_db: str, tmp_path: Path, spark) -> None:
    """A cut applied again after its checkpoint was reset is skipped by Delta (no new data change);
    copies of log events (same positions, higher offsets) change nothing; verify reports rows
    changed by hand (missing, different, extra) and a follower behind the source (exit 1)."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    make_table(pg_db, "k", 200)
    pipe = make_pipe(tmp_path, pg_db, ["public.k"], sinks=[LAKE])
    path = delta_dir(pipe, "public.k")
    snapshot(pipe)
    sql(
        pg_db,
        "INSERT INTO k VALUES (1001, 'deleted later')",
        "UPDATE k SET v = 'old' WHERE id = 26",
        "UPDATE k SET v = 'newer' WHERE id = 26",
        "DELETE FROM k WHERE id = 1001",
        "DELETE FROM k WHERE id = 27",
        "UPDATE k SET v = 'last' WHERE id = 25",
    )
    stream(pipe)
    apply_ok(pipe, spark)

    # Batch 2 also carries copies of events the follower applied in batch 1 (same positions, higher
    # offsets): of the newest event of a key, of an older update and of a delete. (A copy of the
    # insert of a key deleted since comes last, below.)
    evs = log_events(pipe, "public.k")
    copies = [
        next(e for e in evs if e[4] == "25" and e[3] == "u"),  # newest event of 25
        next(e for e in evs if e[4] == "26" and e[3] == "u"),  # 'old', superseded by 'newer'
        next(e for e in evs if e[4] == "27" and e[3] == "d"),
    ]
    duplicate_events(pipe, "public.k", [e[0] for e in copies])
    sql(
        pg_db,
        "UPDATE k SET v = 'batch 2' WHERE id <= 20",
        "DELETE FROM k WHERE id BETWEEN 190 AND 200",
        "INSERT INTO k SELECT g, 'new' FROM generate_series(300, 310) g",
    )
    stream(pipe)
    assert len(log_events(pipe, "public.k")) == len(evs) + len(copies) + 20 + 11 + 11
    previous = ckpt_file(pipe).read_text()
    (run,) = apply_ok(pipe, spark)
    got = delta_rows(spark, pipe, "public.k", ["v"])
    assert 27 not in got and [got[i][0] for i in (25, 26, 1)] == ["last", "newer", "batch 2"]
    app = lake_app_id(pipe)
    assert len(txn_commits(path, app, run.cut_id)) == 1, delta_commits(path)

    # Replay: the same cut again after its checkpoint went back.
    commits = delta_commits(path)
    rows = sorted(delta_df(spark, pipe, "public.k").collect())
    ckpt_file(pipe).write_text(previous)
    (replay,) = apply_ok(pipe, spark)
    assert replay.cut_id == run.cut_id and not replay.up_to_date
    new = delta_commits(path)[len(commits) :]
    assert all(c["files"] == 0 for c in new), f"the replayed cut changed data: {new}"
    assert len(txn_commits(path, app, run.cut_id)) == 1
    assert sorted(delta_df(spark, pipe, "public.k").collect()) == rows
    assert ckpt(pipe)["cut_id"] == run.cut_id and ckpt(pipe)["pending"] is None
    verified(pipe, spark)

    # Rows changed by hand: verify lists them.
    clean = delta_version(path)
    table = DeltaTable.forPath(spark, str(path))
    table.delete("id = 10")
    table.update("id = 11", {"v": F.lit("tampered")})
    delta_df(spark, pipe, "public.k").filter("id = 12").withColumn("id", F.lit(99999)).write.format(
        "delta"
    ).mode("append").save(str(path))
    code, report = verify(pipe.file, spark)
    assert code == 1, report
    assert "DIFFERENT" in report and "missing 1, extra 1, different 1" in report, report
    for sample in ("missing: id=10", "different: id=11", "extra: id=99999"):
        assert sample in report, f"{sample!r} not in the report:\n{report}"
    table.restoreToVersion(clean)

    # A source change not applied yet: verify says the follower is behind, until stream + apply.
    sql(pg_db, "UPDATE k SET v = 'not applied yet' WHERE id = 40")
    flush_wal(pg_db)
    code, report = verify(pipe.file, spark)
    assert code == 1 and "behind" in report, report
    # ...with, in the same batch, a copy of the insert of key 1001, which the follower saw deleted
    # in batch 1: the follower must not go back to it.
    duplicate_events(pipe, "public.k", [next(e[0] for e in evs if e[4] == "1001" and e[3] == "c")])
    stream(pipe)
    apply_ok(pipe, spark)
    code, report = verify(pipe.file, spark)
    assert 1001 not in delta_rows(spark, pipe, "public.k", ["v"]), (
        f"a copy of an old insert brought back a row deleted since:\n{report}"
    )
    assert code == 0, report


# ---- 4 + 6. SCD2 history; one sink at a time ---------------------------------------------------------------
def test_scd2_history_and_one_sink_at_a_time(pg_db: str, tmp_path: Path, spark) -> None:
    """SCD2: a key inserted, updated three times (across two batches) and deleted has one version
    per transaction, chained by LSN and commit time, the last ended by the delete; a replayed cut
    changes nothing. `cdc apply --sink hist` moves only hist's checkpoint; lake catches up later."""
    from pyspark.sql import functions as F

    make_table(pg_db, "h", 5)
    pipe = make_pipe(tmp_path, pg_db, ["public.h"], sinks=[LAKE, HIST])
    hist_path = delta_dir(pipe, "public.h", "hist")
    snapshot(pipe)
    marks: list[tuple[int, int, int, int]] = []  # key 7's transactions: WAL position, clock (before, after)

    def txn(stmt: str) -> None:
        (lo,) = sql(pg_db, "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")[0]
        t0 = time.time_ns() // 1000
        sql(pg_db, stmt)
        t1 = time.time_ns() // 1000
        (hi,) = sql(pg_db, "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")[0]
        marks.append((lo, hi, t0, t1))

    txn("INSERT INTO h VALUES (7, 'v0')")
    txn("UPDATE h SET v = 'v1' WHERE id = 7")
    sql(pg_db, "UPDATE h SET v = 'changed' WHERE id = 1")
    stream(pipe)
    apply_ok(pipe, spark)
    lake_ckpt, hist_ckpt = ckpt_file(pipe, "lake").read_text(), ckpt_file(pipe, "hist").read_text()

    txn("UPDATE h SET v = 'v2' WHERE id = 7")
    txn("UPDATE h SET v = 'v3' WHERE id = 7")
    txn("DELETE FROM h WHERE id = 7")
    sql(pg_db, "INSERT INTO h VALUES (8, 'current')", "UPDATE h SET v = 'changed again' WHERE id = 1")
    stream(pipe)
    (run,) = apply_ok(pipe, spark, "hist")
    assert run.sink == "hist"
    assert ckpt_file(pipe, "lake").read_text() == lake_ckpt, "apply --sink hist moved lake's checkpoint"
    assert ckpt(pipe, "hist")["cut_id"] == run.cut_id > json.loads(hist_ckpt)["cut_id"]

    evs = [e for e in log_events(pipe, "public.h") if e[4] == "7"]
    assert [e[3] for e in evs] == ["c", "u", "u", "u", "d"], evs
    lsns, stamps = [e[1] for e in evs], [e[5] for e in evs]
    for (lo, hi, t0, t1), lsn, ts in zip(marks, lsns, stamps, strict=True):
        assert lo <= lsn <= hi, f"commit LSN {lsn} outside its transaction's WAL [{lo}, {hi}]"
        assert t0 - 50_000 <= ts <= t1 + 50_000, f"commit time {ts} outside [{t0}, {t1}]"

    def history(key: int) -> list[tuple]:
        df = delta_df(spark, pipe, "public.h", "hist").filter(F.col("id") == key)
        cols = [
            "v",
            "_cdc_start_lsn",
            "_cdc_end_lsn",
            F.unix_micros("_cdc_commit_ts"),
            F.unix_micros("_cdc_end_ts"),
        ]
        return [tuple(r) for r in df.select(*cols).orderBy("_cdc_start_lsn").collect()]

    assert history(7) == [
        (v, lsns[i], lsns[i + 1], stamps[i], stamps[i + 1]) for i, v in enumerate(["v0", "v1", "v2", "v3"])
    ], "SCD2 versions of key 7 (value, start LSN, end LSN, start time, end time)"
    one = history(1)
    assert [(v, end is None) for v, _s, end, _t, _e in one] == [
        ("x1", False),
        ("changed", False),
        ("changed again", True),
    ]
    assert all(a[2] == b[1] and a[4] == b[3] for a, b in itertools.pairwise(one)), one
    assert [v for v, *_ in history(8)] == ["current"] and history(8)[0][2] is None
    verified(pipe, spark, "hist")

    # Replaying the cut changes nothing in SCD2 either.
    rows = sorted(delta_df(spark, pipe, "public.h", "hist").collect())
    commits = delta_commits(hist_path)
    ckpt_file(pipe, "hist").write_text(hist_ckpt)
    (replay,) = apply_ok(pipe, spark, "hist")
    assert replay.cut_id == run.cut_id
    new = delta_commits(hist_path)[len(commits) :]
    assert all(c["files"] == 0 for c in new), f"the replayed cut changed data: {new}"
    assert sorted(delta_df(spark, pipe, "public.h", "hist").collect()) == rows

    # The other sink catches up.
    runs = apply_ok(pipe, spark)
    assert {r.sink: r.up_to_date for r in runs} == {"lake": False, "hist": True}
    assert ckpt(pipe, "lake")["cut_id"] == ckpt(pipe, "hist")["cut_id"] == run.cut_id
    verified(pipe, spark)


# ---- 3. kill -9 of `cdc apply` between MERGE and checkpoint ---------------------------------------------------
def cut_rows(pipe: Pipe, cut: int, base: str = "lake") -> int:
    """Rows of cut `cut` in a follower's `_cdc_cuts` (the Delta follower's lake, or the Iceberg
    follower's warehouse), read with delta-rs."""
    from deltalake import DeltaTable

    return (
        DeltaTable(str(pipe.dir / base / "_cdc_cuts"))
        .to_pyarrow_table()
        .column("cut_id")
        .to_pylist()
        .count(cut)
    )


ICE = {"name": "ice", "iceberg": {"warehouse": "ice"}}  # the embedded SQLite catalog


def assert_iceberg_is_source(pipe: Pipe, dsn: str, table: str) -> None:
    """The Iceberg table read by pyiceberg (not the sink) holds the source's keys and `v` values."""
    held = iceberg_rows(pipe.dir / "ice", table)
    source = source_rows(dsn, table, ("id",))
    assert {k: r["v"] for k, r in held.items()} == {k: r["v"] for k, r in source.items()}, table


def test_apply_killed_before_its_checkpoint(pg_db: str, tmp_path: Path, spark) -> None:
    """`cdc apply` crashed after merging every table (or after the first of two), before its
    checkpoint: the checkpoint names the cut as pending, and the next run applies exactly that cut,
    each table's MERGE committed once (Delta's txnAppId/txnVersion skip what was merged). Killed
    after the cut's `_cdc_cuts` row (apply:before-checkpoint), the rerun records the cut no second
    time (a first attempt appends it without a Delta transaction id, sinks/delta/cuts.py).
    An Iceberg follower (embedded SQLite catalog) beside it is crashed at the same three points
    (in-process): one snapshot per table carries the cut (`pgcdc.cut`, read by pyiceberg) before
    the rerun ([0, 1] between the tables), still one after it, one `_cdc_cuts` row, and pyiceberg
    reads the source's rows; it then takes the Delta follower's later cuts (an insert of a deleted
    key, a key freed and taken again) in one apply, and `cdc verify` covers both followers."""
    make_table(pg_db, "a", 100)
    make_table(pg_db, "b", 100)
    # one table after the other, so "between tables" is one committed and one not started
    # (test_parallel_apply.py crashes a cut applied side by side)
    pipe = make_pipe(
        tmp_path,
        pg_db,
        ["public.a", "public.b"],
        sinks=[LAKE, ICE],
        spark={"conf": FAST_JVM, "apply_parallelism": 1},
    )
    snapshot(pipe)
    apply_ok(pipe, spark)
    app = lake_app_id(pipe)
    tables = ["public.a", "public.b"]
    for n, fault in enumerate(("apply:after-merge", "apply:between-tables", "apply:before-checkpoint")):
        for t in ("a", "b"):
            sql(
                pg_db,
                f"UPDATE {t} SET v = '{fault}' WHERE id <= 10",
                f"DELETE FROM {t} WHERE id = {50 + n}",
                f"INSERT INTO {t} VALUES ({1000 + n}, '{fault}')",
            )
        stream(pipe)
        before = ckpt(pipe)
        commits = {t: len(delta_commits(delta_dir(pipe, t))) for t in tables}
        # in-process (no second JVM); test_parallel_apply.py SIGKILLs a real `cdc apply` process
        apply_crashing(pipe.file, spark, fault)
        crashed = ckpt(pipe)
        assert crashed["cut_id"] == before["cut_id"] and crashed["pending"], crashed
        cut = crashed["pending"]["cut_id"]
        merged = {t: len(txn_commits(delta_dir(pipe, t), app, cut)) for t in tables}
        want = [0, 1] if fault == "apply:between-tables" else [1, 1]
        assert sorted(merged.values()) == want, (
            f"{fault}: MERGE commits for cut {cut} before the rerun: {merged}"
        )
        recorded = cut_rows(pipe, cut)
        assert recorded == (1 if fault == "apply:before-checkpoint" else 0), (fault, recorded)
        # the Iceberg follower crashed at the same point of the same cut
        ice_before = ckpt(pipe, "ice")
        apply_crashing(pipe.file, spark, fault, "ice")
        ice_crashed = ckpt(pipe, "ice")
        assert ice_crashed["cut_id"] == ice_before["cut_id"] and ice_crashed["pending"]["cut_id"] == cut, (
            ice_crashed
        )
        committed = {t: iceberg_cut_commits(pipe.dir / "ice", t, cut) for t in tables}
        assert sorted(committed.values()) == want, f"ice {fault}: snapshots of cut {cut}: {committed}"
        recorded = cut_rows(pipe, cut, "ice")
        assert recorded == (1 if fault == "apply:before-checkpoint" else 0), ("ice", fault, recorded)

        reruns = apply_ok(pipe, spark)
        assert [(r.sink, r.cut_id) for r in reruns] == [("lake", cut), ("ice", cut)], (
            "the rerun did not apply the pending cut"
        )
        for sink in ("lake", "ice"):
            after = ckpt(pipe, sink)
            assert after["cut_id"] == cut and after["pending"] is None, (sink, after)
        merged = {t: len(txn_commits(delta_dir(pipe, t), app, cut)) for t in tables}
        assert merged == dict.fromkeys(tables, 1), f"{fault}: MERGE commits for cut {cut}: {merged}"
        # one commit per table for the cut, crash and replay included: the position is the MERGE's
        # txn version, no marker commit (issue 37 item 1)
        added = {t: len(delta_commits(delta_dir(pipe, t))) - commits[t] for t in tables}
        assert added == dict.fromkeys(tables, 1), f"{fault}: Delta commits for cut {cut}: {added}"
        assert cut_rows(pipe, cut) == 1, f"{fault}: _cdc_cuts rows of cut {cut}"
        committed = {t: iceberg_cut_commits(pipe.dir / "ice", t, cut) for t in tables}
        assert committed == dict.fromkeys(tables, 1), f"ice {fault}: snapshots of cut {cut}: {committed}"
        assert cut_rows(pipe, cut, "ice") == 1, f"ice {fault}: _cdc_cuts rows of cut {cut}"
        for t in tables:
            assert_delta_is_source(spark, pipe, pg_db, t)
            assert_iceberg_is_source(pipe, pg_db, t)

    # A cut of inserts alone is appended, not merged (sinks/delta/sink.py _appends), with the same
    # transaction id: killed between the tables, the rerun appends the second one and Delta skips the
    # first one's append. Key 50 was deleted in an earlier cut: the table lacks it, it is appended too.
    # b's cut deletes and inserts one key in one transaction and changes a key: it MERGEs.
    sql(
        pg_db,
        "INSERT INTO a VALUES (50, 'again')",
        "INSERT INTO a SELECT g, 'new' FROM generate_series(2000, 2099) g",
        "BEGIN",
        "DELETE FROM b WHERE id = 1",
        "INSERT INTO b VALUES (1, 'deleted and inserted')",
        "COMMIT",
        "UPDATE b SET id = 3000 WHERE id = 2",
    )
    stream(pipe)
    apply_crashing(pipe.file, spark, "apply:between-tables", "lake")
    cut = ckpt(pipe)["pending"]["cut_id"]
    assert sorted(len(txn_commits(delta_dir(pipe, t), app, cut)) for t in tables) == [0, 1]
    (rerun,) = apply_ok(pipe, spark, "lake")
    assert rerun.cut_id == cut
    operations = {t: cut_operations(delta_dir(pipe, t), cut) for t in tables}
    assert operations == {"public.a": ["WRITE"], "public.b": ["MERGE"]}, operations
    # the key b's change freed, inserted again in the next cut: appended
    sql(pg_db, "INSERT INTO b VALUES (2, 'freed key taken again')")
    stream(pipe)
    (run,) = apply_ok(pipe, spark, "lake")
    assert cut_operations(delta_dir(pipe, "public.b"), run.cut_id) == ["WRITE"]
    for t in tables:  # read with delta-rs, which fails on a key held twice
        held = {r["id"]: r["v"] for r in delta_rs_rows(spark, delta_dir(pipe, t)).values()}
        assert held == {int(r["id"]): r["v"] for r in source_rows(pg_db, t, ("id",)).values()}, t
    (run,) = apply_ok(pipe, spark, "ice")  # both cuts at once
    for t in tables:  # pyiceberg, which fails on a key held twice too
        assert_iceberg_is_source(pipe, pg_db, t)
    verified(pipe, spark)


# ---- 5. a real cluster: tests/integration/test_spark_cluster.py (standalone master and workers) ----------


# ---- 7. bad input ---------------------------------------------------------------------------------------------
def test_compacted_log_and_values_spark_cannot_hold(pg_db: str, tmp_path: Path, spark) -> None:
    """A follower whose position the log no longer holds (deletes compacted away) fails naming the
    table and `cdc snapshot --tables`, and following that remedy makes it identical again. Values
    Spark has no type for stop the batch naming table, column and key, and nothing is written."""
    make_table(pg_db, "p", 100)
    sql(
        pg_db,
        "CREATE TABLE r(id int PRIMARY KEY, d date, x numeric(10,2), ts timestamptz)",
        "INSERT INTO r SELECT g, '2024-01-01', 1.5, '2024-01-01 00:00:00+00' FROM generate_series(1, 10) g",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.p", "public.r"], sinks=[LAKE])
    snapshot(pipe)
    apply_ok(pipe, spark)
    before = ckpt(pipe)
    sql(
        pg_db,
        "UPDATE p SET v = 'changed' WHERE id <= 20",
        "DELETE FROM p WHERE id > 90",
        "INSERT INTO p SELECT g, 'new' FROM generate_series(200, 210) g",
        "DELETE FROM p WHERE id = 205",
        # r: a key deleted and inserted again; compaction keeps the insert alone (the newest event)
        "DELETE FROM r WHERE id = 3",
        "INSERT INTO r VALUES (3, '2024-01-03', 3.5, '2024-01-03 00:00:00+00')",
    )
    stream(pipe)
    ok("log", "compact", pipe.file, "--tombstone-retention", "0s")
    assert [e[3] for e in log_events(pipe, "public.r")] == ["c"], "r's delete was to be compacted away"
    report = apply_fails(pipe, spark)
    assert "public.p" in report and f"`cdc snapshot {pipe.file} --tables public.p`" in report, report
    assert ckpt(pipe) == before, "a failed apply moved the checkpoint"
    ok("snapshot", pipe.file, "--no-progress", "--tables", "public.p")  # the remedy, as printed
    stream(pipe)
    (run,) = apply_ok(pipe, spark)
    verified(pipe, spark)
    assert_delta_is_source(spark, pipe, pg_db, "public.p")
    # r's range holds one insert where it had two events: a gap, so it MERGEs (an append would
    # hold key 3 twice: the follower had it before the compacted delete)
    assert cut_operations(delta_dir(pipe, "public.r"), run.cut_id) == ["MERGE"]
    held = delta_rs_rows(spark, delta_dir(pipe, "public.r"))  # delta-rs: fails on a key held twice
    assert sorted(r["id"] for r in held.values()) == list(range(1, 11))

    # Values Spark cannot hold, next to an ordinary change of another table in the same batch.
    versions = {t: delta_version(delta_dir(pipe, t)) for t in ("public.p", "public.r")}
    before = ckpt(pipe)
    sql(
        pg_db,
        "UPDATE p SET v = 'next to bad values' WHERE id = 1",
        "UPDATE r SET d = '0044-03-15 BC' WHERE id = 5",
        "UPDATE r SET x = 'NaN' WHERE id = 6",
        "UPDATE r SET ts = 'infinity' WHERE id = 7",
    )
    stream(pipe)
    report = apply_fails(pipe, spark)
    assert "public.r" in report and "'d'" in report and "key 5" in report, report
    assert "3 column(s) affected: d, x, ts" in report, report
    assert ckpt(pipe)["cut_id"] == before["cut_id"], "the checkpoint moved past values never applied"
    now = {t: delta_version(delta_dir(pipe, t)) for t in versions}
    assert now == versions, (
        f"Delta tables written although the batch stopped (versions before, after): {versions}, {now}"
    )


def test_incompatible_schemas_stop_the_batch(pg_db: str, tmp_path: Path, spark) -> None:
    """A Delta table changed by hand to an incompatible schema, and a source column type change
    Delta cannot widen to, each stop the batch before anything is written, naming table and column;
    the remedy the message gives (move the Delta table away) rebuilds the follower."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    make_table(pg_db, "p", 50)
    sql(
        pg_db,
        "CREATE TABLE q(id int PRIMARY KEY, v text, n int)",
        "INSERT INTO q SELECT g, 'q' || g, g FROM generate_series(1, 50) g",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.p", "public.q"], sinks=[LAKE])
    snapshot(pipe)
    apply_ok(pipe, spark)
    p_dir, q_dir = delta_dir(pipe, "public.p"), delta_dir(pipe, "public.q")
    good = delta_version(q_dir)

    # The Delta table of q replaced by hand (column v is an int there now), and a source column type
    # change Delta cannot widen to (int -> text), each with changes to p in the same batch.
    delta_df(spark, pipe, "public.q").withColumn("v", F.length("v")).write.format("delta").mode(
        "overwrite"
    ).option("overwriteSchema", "true").save(str(q_dir))
    sql(
        pg_db,
        "UPDATE p SET v = 'b' WHERE id <= 5",
        "UPDATE q SET v = 'b' WHERE id <= 5",
        "ALTER TABLE q ALTER COLUMN n TYPE text USING n::text",
        "UPDATE q SET n = 'not a number' WHERE id = 1",
    )
    stream(pipe)
    before = ckpt(pipe)
    for column in ("v", "n"):  # v: the Delta table changed by hand, reported first; n: the source's type
        versions = delta_version(p_dir), delta_version(q_dir)
        report = apply_fails(pipe, spark)
        assert "public.q" in report and f"column '{column}' is int" in report and "string" in report, report
        assert (delta_version(p_dir), delta_version(q_dir)) == versions, (
            f"written although the batch failed: {report}"
        )
        assert ckpt(pipe)["cut_id"] == before["cut_id"], "the checkpoint moved past a failed batch"
        if column == "v":
            DeltaTable.forPath(spark, str(q_dir)).restoreToVersion(good)

    # The remedy the message names: move the Delta table away; it is rebuilt from the log.
    assert "move the Delta table away" in report, report
    shutil.move(q_dir, tmp_path / "q.moved")
    apply_ok(pipe, spark)
    verified(pipe, spark)


def test_apply_command_line_errors(pg_db: str, tmp_path: Path) -> None:
    """`cdc apply` without sinks or with an unknown sink: exit 2; without Java: exit 4 and one line
    saying so. No traceback, no Java stack."""
    make_table(pg_db, "t", 5)
    pipe = make_pipe(tmp_path, pg_db, ["public.t"], sinks=[LAKE])
    snapshot(pipe)  # the log exists: what fails below is the command
    (tmp_path / "nosinks").mkdir()
    nosinks = write_pipeline(
        tmp_path / "nosinks", pg_db, ["public.t"], state_dir=str(state_dir(pipe)), spark={"conf": FAST_JVM}
    )
    slow = cdc_popen("apply", nosinks, "--once")  # starts Spark today: runs while the others do
    try:
        run = cdc("apply", pipe.file, "--once", "--sink", "nosuch")
        assert run.code == 2 and "no sink named 'nosuch'" in run.err and "lake" in run.err, run
        no_traceback(run)

        path = os.pathsep.join(
            d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "java").exists()
        )
        env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"} | {"PATH": path}
        done = subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "apply", str(pipe.file), "--once"],
            capture_output=True, text=True, timeout=120, env=env, cwd=REPO, check=False,
        )  # fmt: skip
        assert done.returncode == 4, (done.returncode, done.stdout, done.stderr)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Java" in errors[0], done.stderr
        assert (
            "Traceback" not in done.stderr and "java.lang" not in done.stderr and "\tat " not in done.stderr
        )
        out, err = slow.communicate(timeout=300)
    finally:
        if slow.poll() is None:
            slow.kill()
    assert slow.returncode == 2 and "no sinks" in err, (slow.returncode, out, err)
    no_traceback((out, err))
