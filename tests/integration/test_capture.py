"""The capture path end to end: `cdc snapshot` + `cdc stream` into the local log, against a real
PostgreSQL 15, checked with the reference follower (tests.harness.materialize) against the source.

Every test ends with "followers end identical": materialize(log) == source_rows(source).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

import orjson
import psycopg2
import pytest

from cdc.ground.tables import TableName
from cdc.session import libpq_options
from tests.fixtures.capture import (
    UNAVAILABLE,
    Ev,
    assert_log_well_formed,
    assert_same,
    assert_txns_streamed,
    flush_wal,
    log_db,
    log_read,
    make_pipe,
    no_traceback,
    ok,
    restart_killed,
    rows_diff,
    slot_info,
    snapshot,
    start_stream,
    stop_stream,
    stream_events,
    stream_until_current,
    table_row,
)
from tests.fixtures.pgtypes import TYPE_COLUMNS, type_table
from tests.fixtures.workload import BIG_TEXT, Writer, make_table
from tests.harness import cdc_popen, materialize, source_rows, sql, write_pipeline

pytestmark = pytest.mark.integration


# ---- helpers -------------------------------------------------------------------------------------
def vm_hwm_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# ---- 1. snapshot with concurrent writes ----------------------------------------------------------
def test_snapshot_with_concurrent_writes(pg_db: str, tmp_path: Path) -> None:
    """Writes racing the snapshot land exactly once: transactions committed before the slot's
    consistent point are in the snapshot rows and not in the stream, every later one is in the
    stream (whole, once) and not in the snapshot."""
    n_rows = 36_000
    # 9000 heap pages: three ctid chunks of snapshot.chunks.PAGES_PER_CHUNK (4096) pages. Rows of
    # ~1.8 kB (4 a page, under the 2 kB TOAST threshold: stored inline, uncompressed) fill them with
    # an eighth of the rows 200-byte rows would take; full pages, so updates still move rows.
    make_table(pg_db, "t", n_rows, ", pad text NOT NULL DEFAULT repeat('p', 1800)")
    pipe = make_pipe(tmp_path, pg_db, ["public.t"])
    writer = Writer(pg_db, "t", list(range(1, n_rows + 1)), next_id=1_000_001, seed=1)
    writer.start()
    try:
        writer.wait_txns(30)
        run = snapshot(pipe, "--parallel", "2")
        during = len(writer.txns)
        writer.wait_txns(during + 30)
    finally:
        writer.finish()
    assert "in 3 chunk(s) with 2 worker(s)" in run.out, run.out
    stream_until_current(pipe)

    # The stream holds a suffix of the writer's transactions, each whole and once.
    by_xid: dict[int, list[Ev]] = defaultdict(list)
    for ev in stream_events(pipe, "public.t"):
        by_xid[ev.xid].append(ev)
    in_stream = [t.xid in by_xid for t in writer.txns]
    assert True in in_stream, "no writer transaction reached the stream"
    first = in_stream.index(True)
    missing = [(i, t.xid, t.ops) for i, t in enumerate(writer.txns) if i >= first and not in_stream[i]]
    assert not missing, (
        f"transactions committed after the consistent point are missing from the stream: {missing[:3]}"
        f" (first streamed: #{first} of {len(writer.txns)}, snapshot done after #{during}, {len(missing)} missing)"
    )
    assert first > 0, "every writer transaction was streamed: the snapshot did not see the writes before it"
    assert first < during, "the consistent point came after every transaction written during the snapshot"
    assert set(by_xid) == {t.xid for t in writer.txns[first:]}, "stream events from transactions nobody wrote"
    for t in writer.txns[first:]:
        evs = by_xid[t.xid]
        assert [e.seq for e in evs] == list(range(1, len(evs) + 1)), (
            f"txn {t.xid}: seqs {[e.seq for e in evs]}"
        )
        assert len({e.lsn for e in evs}) == 1
        assert sorted((e.op, int(e.key)) for e in evs) == sorted((op, i) for op, i, _v in t.ops), (
            f"txn {t.xid}"
        )

    # The snapshot rows are the initial rows plus exactly the transactions before the consistent point.
    expected: dict[int, str | None] = {}
    for t in writer.txns[:first]:
        for _op, i, v in t.ops:
            expected[i] = v
    touched = {i for t in writer.txns for _op, i, _v in t.ops}
    snap: dict[int, str] = {}
    from cdc.log.local import LocalLog

    log = LocalLog(pipe.log, readonly=True)
    try:
        cut = log.latest_cut()
        rng = cut.tables[TableName("public", "t")]
        for rec in log.read(TableName("public", "t"), rng.base - 1, rng.end):
            if rec.op == "r":
                rid = int(rec.values[0])
                assert rid not in snap, f"id {rid} twice in the snapshot"
                snap[rid] = rec.values[1]
    finally:
        log.close()
    for i in touched:
        want = expected.get(i, f"x{i}" if i <= n_rows else None)
        assert snap.get(i) == want, (
            f"id {i}: snapshot has {snap.get(i)!r}, the source had {want!r} at the consistent point"
        )
    inserted = sum(1 for i, v in expected.items() if i > n_rows and v is not None)
    deleted = sum(1 for i, v in expected.items() if i <= n_rows and v is None)
    assert len(snap) == n_rows + inserted - deleted

    assert_same(pipe, {"public.t": ["id"]})
    assert_log_well_formed(pipe)


# ---- 2. every mapped type round-trips --------------------------------------------------------------
def test_every_type_round_trips(pg_db: str, tmp_path: Path) -> None:
    """The same values, once in the snapshot and once streamed (as inserts and as updates), render to
    identical envelope `after` values, and the follower equals the source."""
    names = ", ".join(name for name, _, _ in TYPE_COLUMNS)
    sql(
        pg_db,
        *type_table(),
        # Keys with every character COPY escapes, single and composite.
        "CREATE TABLE tk(k text, n int, v text, PRIMARY KEY (k, n))",
        "CREATE TABLE tk1(k text PRIMARY KEY, v text)",
        "INSERT INTO tk SELECT k, n, 'v' FROM unnest(ARRAY[E'a\\tb', E'line\\nbreak', E'back\\\\slash', E'\\\\N', 'ü',"
        " ' sp ', E'cr\\r', E'\\b\\f\\v']) k, generate_series(1, 2) n",
        "INSERT INTO tk1 SELECT DISTINCT k, 'v' FROM tk",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.ty", "public.tk", "public.tk1"])
    snapshot(pipe)
    sql(
        pg_db,
        f"INSERT INTO ty(id, {names}) SELECT id + 100, {names} FROM ty",
        f"UPDATE ty SET {', '.join(f'{n} = {n}' for n, _, _ in TYPE_COLUMNS)} WHERE id < 100",
        "UPDATE tk SET v = 'u' WHERE n = 1",
        "UPDATE tk1 SET v = 'u'",
        "DELETE FROM tk WHERE n = 2 AND k = E'a\\tb'",
        "DELETE FROM tk1 WHERE k = E'\\\\N'",
        "INSERT INTO tk SELECT k || E'\\t2', 3, 'new' FROM tk WHERE n = 1",
        "INSERT INTO tk1 SELECT k || E'\\\\', 'new' FROM tk1",
    )
    stream_until_current(pipe)

    events = log_read(pipe, "--table", "public.ty")
    after: dict[tuple[str, int], dict] = {}
    for ev in events:
        key = (ev["op"], ev["after"]["id"])
        assert key not in after, f"two {key} events"
        after[key] = {k: v for k, v in ev["after"].items() if k != "id"}
    assert sorted(after) == sorted(
        [("r", 1), ("r", 2), ("r", 3), ("c", 101), ("c", 102), ("c", 103), ("u", 1), ("u", 2), ("u", 3)]
    )
    for i in (1, 2, 3):
        snap = after[("r", i)]
        for op, j in (("c", i + 100), ("u", i)):
            streamed = after[(op, j)]
            differ = {k: (snap[k], streamed[k]) for k in snap if snap[k] != streamed[k]}
            assert not differ, f"row {i}: snapshot vs streamed {op} differ (snapshot, stream): {differ}"
            assert set(streamed) == set(snap)
    assert all(v is None for v in after[("r", 3)].values())
    # A few spot checks so "both sides equally wrong" cannot pass.
    r1, r2 = after[("r", 1)], after[("r", 2)]
    assert r1["c_text"] == "tab\there\nnew line\\back\\slash \\N \"dq\" 'sq' \r cr ü € 😀 \x01"
    assert r2["c_text"] == "" and r2["c_text2"] == "NULL" and r1["c_text2"] == "\\N"
    assert r1["c_float4"] == "NaN" and r2["c_float4"] == "-Infinity" and r1["c_float8"] == "Infinity"
    assert (
        r1["c_numeric"] == "123456789012345678901234567890.000000000000000000001" and r2["c_numeric"] == "NaN"
    )
    assert r1["c_int8"] == -9223372036854775808 and r2["c_int8"] == 9223372036854775807
    assert r1["c_bytea"] == "AP9cCgk=" and r2["c_bytea"] == ""
    assert (
        r1["c_int_array"] == [1, None, 3]
        and r1["c_int_2d"] == [[1, 2], [3, None]]
        and r2["c_int_2d"] == [7, 8]
    )
    assert r1["c_text_array"] == ["a,b", 'c"d', None, "NULL", "back\\slash", "tab\t", ""]
    assert r1["c_date"] == -735160 and r1["c_bpchar"] == "ab   " and r1["c_bool"] is True
    assert (
        r1["c_timestamptz"] == "2024-01-01T06:30:00.500000Z"
        and r1["c_json"] == '{"b": [1, "x\\ty"],  "a": null}'
    )
    assert (
        r1["c_enum"] == "with space"
        and r1["c_domain_num"] == "1.50"
        and r1["c_interval"] == "P1Y2M-3DT4H5M6.789S"
    )

    assert_same(pipe, {"public.ty": ["id"], "public.tk": ["k", "n"], "public.tk1": ["k"]})
    assert_log_well_formed(pipe)


# ---- 3. unchanged TOAST values ---------------------------------------------------------------------


def test_toast_unchanged_update(pg_db: str, tmp_path: Path) -> None:
    """An update that does not touch a TOASTed column carries the unchanged marker, never a value,
    and the follower keeps the value it had (from the snapshot or from an earlier stream event)."""
    sql(
        pg_db,
        "CREATE TABLE toast(id int PRIMARY KEY, n int, big text, bin bytea)",
        "ALTER TABLE toast ALTER COLUMN big SET STORAGE EXTERNAL",
        "ALTER TABLE toast ALTER COLUMN bin SET STORAGE EXTERNAL",
        f"INSERT INTO toast SELECT g, 0, {BIG_TEXT}, decode({BIG_TEXT}, 'hex') FROM generate_series(1, 3) g",
    )
    assert sql(pg_db, "SELECT min(length(big)) FROM toast")[0][0] > 8192
    pipe = make_pipe(tmp_path, pg_db, ["public.toast"])
    snapshot(pipe)
    sql(
        pg_db,
        "UPDATE toast SET n = 1 WHERE id = 1",  # value known from the snapshot
        f"INSERT INTO toast VALUES (4, 0, {BIG_TEXT}, decode({BIG_TEXT}, 'hex'))",
        "UPDATE toast SET n = 1 WHERE id = 4",  # value known from the stream
        "BEGIN",
        "UPDATE toast SET n = 2 WHERE id = 4",
        "UPDATE toast SET n = 3 WHERE id = 4",
        "COMMIT",
        f"UPDATE toast SET n = 1, big = {BIG_TEXT} WHERE id = 2",  # big changes, bin unchanged
        "UPDATE toast SET n = 2 WHERE id = 2",
        "DELETE FROM toast WHERE id = 3",
    )
    stream_until_current(pipe)

    updates = [e for e in log_read(pipe, "--table", "public.toast") if e["op"] == "u"]
    by_row: dict[int, list[dict]] = defaultdict(list)
    for e in updates:
        by_row[e["after"]["id"]].append(e["after"])
    assert [a["n"] for a in by_row[1]] == [1] and [a["n"] for a in by_row[4]] == [1, 2, 3]
    for a in by_row[1] + by_row[4]:
        assert a["big"] == UNAVAILABLE, f"unchanged TOAST text sent as {a['big'][:40]!r}"
        assert a["bin"] == "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==", (
            "bytea placeholder is base64 of the marker"
        )
    first, second = by_row[2]
    assert len(first["big"]) > 8192 and first["bin"] == "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="
    assert second["big"] == UNAVAILABLE
    assert_same(pipe, {"public.toast": ["id"]})


# ---- 4. primary-key updates --------------------------------------------------------------------------
def test_primary_key_update(pg_db: str, tmp_path: Path) -> None:
    """A key change is a delete of the old key then a create of the new one, next to each other."""
    sql(
        pg_db,
        "CREATE TABLE pk(id int PRIMARY KEY, v text)",
        "INSERT INTO pk SELECT g, 'v' || g FROM generate_series(1, 20) g",
        "CREATE TABLE pk2(a int, b text, v text, PRIMARY KEY (a, b))",
        "ALTER TABLE pk2 REPLICA IDENTITY FULL",
        "INSERT INTO pk2 SELECT g, 'b' || g, 'v' FROM generate_series(1, 5) g",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.pk", "public.pk2"])
    snapshot(pipe)
    sql(
        pg_db,
        "UPDATE pk SET id = id + 1000 WHERE id <= 5",
        "BEGIN",
        "UPDATE pk SET id = 2000, v = 'moved' WHERE id = 10",
        "UPDATE pk SET id = 10 WHERE id = 11",  # the freed key is taken in the same transaction
        "COMMIT",
        "UPDATE pk2 SET b = 'changed' WHERE a = 1",  # one column of a composite key, old row in full
        "UPDATE pk2 SET v = 'same key' WHERE a = 2",
    )
    stream_until_current(pipe)

    evs = stream_events(pipe, "public.pk")
    moved = [e for e in evs if e.op in "dc" and e.key is not None]
    for i in range(1, 6):
        d = [e for e in moved if e.op == "d" and e.key == str(i).encode()]
        c = [e for e in moved if e.op == "c" and e.key == str(i + 1000).encode()]
        assert len(d) == 1 and len(c) == 1, f"id {i}: deletes {d}, creates {c}"
        assert (d[0].lsn, d[0].seq + 1) == (c[0].lsn, c[0].seq), (
            f"id {i}: delete {d[0]} not right before create {c[0]}"
        )
    assert [(e.op, e.key) for e in evs if e.op != "u"][-4:] == [
        ("d", b"10"),
        ("c", b"2000"),
        ("d", b"11"),
        ("c", b"10"),
    ]
    assert not [e for e in evs if e.op == "u"], "a key change must not be logged as an update"
    envelopes = [e for e in log_read(pipe, "--table", "public.pk2") if e["op"] != "r"]
    assert [(e["op"], (e["before"] or {}).get("b"), (e["after"] or {}).get("b")) for e in envelopes] == [
        ("d", "b1", None),
        ("c", None, "changed"),
        ("u", "b2", "b2"),
    ]
    assert_same(pipe, {"public.pk": ["id"], "public.pk2": ["a", "b"]})
    assert_log_well_formed(pipe)


# ---- 5. positions inside one transaction ---------------------------------------------------------------
def test_positions_inside_transactions(pg_db: str, tmp_path: Path) -> None:
    """Delete + reinsert of a key and 500 updates of one row in single transactions: every event has
    its own position, increasing in the order the source made the changes."""
    make_table(pg_db, "t", 10)
    # Batches smaller than the transaction: the transaction still goes into the log whole.
    pipe = make_pipe(tmp_path, pg_db, ["public.t"], stream={"batch_max_events": 50})
    snapshot(pipe)
    sql(
        pg_db,
        "BEGIN",
        "DELETE FROM t WHERE id = 1",
        "INSERT INTO t VALUES (1, 'reborn')",
        "DELETE FROM t WHERE id = 2",
        "INSERT INTO t VALUES (2, 'reborn')",
        "DELETE FROM t WHERE id = 2",
        "COMMIT",
        "DO $$ BEGIN FOR i IN 1..500 LOOP UPDATE t SET v = 'u' || i WHERE id = 3; END LOOP; END $$",
    )
    stream_until_current(pipe)

    evs = stream_events(pipe, "public.t")
    txns: dict[int, list[Ev]] = defaultdict(list)
    for e in evs:
        txns[e.lsn].append(e)
    assert len(txns) == 2, f"expected 2 transactions, got {len(txns)}"
    first, second = (txns[k] for k in sorted(txns))
    assert [(e.op, e.key, e.seq) for e in first] == [
        ("d", b"1", 1),
        ("c", b"1", 2),
        ("d", b"2", 3),
        ("c", b"2", 4),
        ("d", b"2", 5),
    ]
    assert [e.seq for e in second] == list(range(1, 501))
    assert {(e.op, e.key) for e in second} == {("u", b"3")}
    assert [e.off for e in second] == sorted(e.off for e in second)
    values = [e["after"]["v"] for e in log_read(pipe, "--table", "public.t") if e["op"] == "u"]
    assert values == [f"u{i}" for i in range(1, 501)], "updates out of order"
    with log_db(pipe) as db:  # no cut falls inside the 500-event transaction
        offs = {e.off for e in second}
        for (body,) in db.execute("SELECT tables FROM cuts"):
            end = orjson.loads(body)["1"][1]
            assert not (min(offs) <= end < max(offs)), f"a cut ends inside a transaction (offset {end})"
    state = assert_same(pipe, {"public.t": ["id"]})
    assert state["public.t"][("1",)]["v"] == "reborn" and ("2",) not in state["public.t"]
    assert_log_well_formed(pipe)


# ---- 6. truncate ---------------------------------------------------------------------------------------
def test_truncate(pg_db: str, tmp_path: Path) -> None:
    for t in ("a", "b", "other"):
        make_table(pg_db, t, 50)
    pipe = make_pipe(tmp_path, pg_db, ["public.a", "public.b"])
    snapshot(pipe)
    sql(
        pg_db,
        "TRUNCATE a",
        "INSERT INTO a VALUES (1, 'after truncate')",
        "UPDATE b SET v = 'before' WHERE id <= 10",
        "TRUNCATE a, b",  # two tables, one statement
        "INSERT INTO b SELECT g, 'refill' FROM generate_series(1, 20) g",
        "BEGIN",
        "INSERT INTO a VALUES (2, 'gone')",
        "TRUNCATE a, other",  # with a table outside the pipeline
        "INSERT INTO a SELECT g, 'same txn' FROM generate_series(5, 9) g",
        "COMMIT",
        "BEGIN",
        "UPDATE b SET v = 'then truncated' WHERE id = 1",
        "TRUNCATE b",
        "INSERT INTO b VALUES (100, 'only one')",
        "COMMIT",
    )
    stream_until_current(pipe)
    ops_a = [e.op for e in stream_events(pipe, "public.a")]
    ops_b = [e.op for e in stream_events(pipe, "public.b")]
    assert ops_a == ["t", "c", "t", "c", "t"] + ["c"] * 5, ops_a
    assert ops_b == ["u"] * 10 + ["t"] + ["c"] * 20 + ["u", "t", "c"], ops_b
    state = assert_same(pipe, {"public.a": ["id"], "public.b": ["id"]})
    assert len(state["public.a"]) == 5 and list(state["public.b"]) == [("100",)]
    assert "public.other" not in state
    assert_log_well_formed(pipe)


# ---- 7. schema changes mid-stream ------------------------------------------------------------------------
def _project(rows: dict[tuple, dict], columns: Iterable[str]) -> dict[tuple, dict]:
    cols = list(columns)
    return {k: {c: r.get(c) for c in cols} for k, r in rows.items()}


def test_add_and_drop_columns(pg_db: str, tmp_path: Path) -> None:
    """ADD COLUMN (with and without default) and DROP COLUMN between changes: each layout the stream
    saw becomes a schema version, and rows read back right under the current columns."""
    make_table(pg_db, "s", 20)
    pipe = make_pipe(tmp_path, pg_db, ["public.s"])
    snapshot(pipe)
    sql(
        pg_db,
        "INSERT INTO s VALUES (100, 'v1')",
        "ALTER TABLE s ADD COLUMN c int",
        "INSERT INTO s VALUES (101, 'v2', 1)",
        "UPDATE s SET c = id WHERE id <= 5",
        "ALTER TABLE s ADD COLUMN d text NOT NULL DEFAULT 'dflt'",
        "UPDATE s SET c = -id",  # every row written again with the new layout
        "INSERT INTO s VALUES (102, 'v3', 2, 'given')",
        "ALTER TABLE s DROP COLUMN v",
        "UPDATE s SET d = 'dropped v' WHERE id IN (1, 100)",
        "DELETE FROM s WHERE id = 2",
        "BEGIN",
        "ALTER TABLE s ADD COLUMN e numeric(5,1)",
        "INSERT INTO s(id, c, e) VALUES (103, 3, 1.5)",
        "ALTER TABLE s DROP COLUMN e",
        "INSERT INTO s(id, c) VALUES (104, 4)",
        "COMMIT",
    )
    stream_until_current(pipe)

    from cdc.log.local import LocalLog

    log = LocalLog(pipe.log, readonly=True)
    try:
        versions = {v: s.column_names for v, s in log.schema_versions(TableName("public", "s")).items()}
    finally:
        log.close()
    assert list(versions.values()) == [
        ["id", "v"],
        ["id", "v", "c"],
        ["id", "v", "c", "d"],
        ["id", "c", "d"],
        ["id", "c", "d", "e"],
        ["id", "c", "d"],
    ], versions
    assert sorted(versions) == list(range(1, 7))
    source = source_rows(pg_db, "public.s", ["id"])
    current = ["id", "c", "d"]
    got = _project(materialize(pipe.log)["public.s"], current)
    assert got == source, rows_diff(got, source, "public.s")
    assert_log_well_formed(pipe)


def test_add_column_with_default_reaches_untouched_rows(pg_db: str, tmp_path: Path) -> None:
    make_table(pg_db, "s", 5)
    pipe = make_pipe(tmp_path, pg_db, ["public.s"])
    snapshot(pipe)
    sql(pg_db, "ALTER TABLE s ADD COLUMN d text DEFAULT 'dflt'", "INSERT INTO s VALUES (100, 'new', 'given')")
    stream_until_current(pipe)
    got = _project(materialize(pipe.log)["public.s"], ["id", "v", "d"])
    assert got == source_rows(pg_db, "public.s", ["id"])


# ---- 8. big transactions and memory ------------------------------------------------------------------------
def test_100k_row_transaction(pg_db: str, tmp_path: Path) -> None:
    make_table(pg_db, "big", 10)
    pipe = make_pipe(tmp_path, pg_db, ["public.big"], stream={"batch_max_events": 1000})
    snapshot(pipe)
    sql(
        pg_db,
        "BEGIN",
        "INSERT INTO big SELECT g, 'bulk' || g FROM generate_series(11, 100000) g",
        "UPDATE big SET v = 'touched' WHERE id <= 10",
        "COMMIT",
        "INSERT INTO big VALUES (0, 'after')",
    )
    run = stream_until_current(pipe)
    assert "streamed 100,001 events in 2 transactions" in run.out, run.out
    evs = stream_events(pipe, "public.big")
    big_txn = [e for e in evs if e.lsn == evs[0].lsn]
    assert len(big_txn) == 100_000 and [e.seq for e in big_txn] == list(range(1, 100_001))
    assert Counter(e.op for e in big_txn) == {"c": 99_990, "u": 10}
    with log_db(pipe) as db:  # the 1000-event batches never split the transaction
        first, last = big_txn[0].off, big_txn[-1].off
        for (body,) in db.execute("SELECT tables FROM cuts"):
            end = orjson.loads(body)["1"][1]
            assert not (first <= end < last), f"a cut ends inside the transaction (offset {end})"
    assert_same(pipe, {"public.big": ["id"]})
    assert_log_well_formed(pipe)


def test_1m_row_transaction_memory_is_bounded(pg_db: str, tmp_path: Path) -> None:
    """The reader does not hold a transaction in memory: streaming one transaction of 1M rows peaks
    far below what buffering its rows as Python objects would take."""
    n = 1_000_000
    sql(pg_db, "CREATE TABLE m(id int PRIMARY KEY, n int)")
    pipe = make_pipe(tmp_path, pg_db, ["public.m"])
    snapshot(pipe)
    sql(pg_db, f"INSERT INTO m SELECT g, g FROM generate_series(1, {n}) g")
    flush_wal(pg_db)
    proc = cdc_popen("stream", pipe.file, "--until", "current")
    peak = 0
    while proc.poll() is None:
        peak = max(peak, vm_hwm_kb(proc.pid) or 0)
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0, f"cdc stream exited {proc.returncode}\n{out}\n{err}"
    no_traceback((out, err))
    assert f"streamed {n:,} events in 1 transactions" in out, out
    with log_db(pipe) as db:
        assert db.execute(
            "SELECT count(*), count(DISTINCT seq), max(seq) FROM ev_1 WHERE op = 'c'"
        ).fetchone() == (n, n, n)
    peak_mb = peak / 1024
    print(f"cdc stream peak RSS {peak_mb:.0f} MB")
    # 1M rows as the reader's row tuples (11 fields, three bytes objects) would be >= 400 MB.
    assert 0 < peak_mb < 200, f"cdc stream peaked at {peak_mb:.0f} MB for a {n:,}-row transaction"


# ---- 9. many tiny transactions ----------------------------------------------------------------------------
def test_10k_tiny_transactions(pg_db: str, tmp_path: Path) -> None:
    sql(pg_db, "CREATE TABLE tiny(id int PRIMARY KEY, v text)")
    pipe = make_pipe(tmp_path, pg_db, ["public.tiny"])
    snapshot(pipe)
    sql(
        pg_db,
        "DO $$ BEGIN FOR i IN 1..10000 LOOP INSERT INTO tiny VALUES (i, 'v' || i); COMMIT; END LOOP; END $$",
    )
    run = stream_until_current(pipe)
    assert "streamed 10,000 events in 10,000 transactions" in run.out, run.out
    evs = stream_events(pipe, "public.tiny")
    assert len(evs) == 10_000 and len({e.lsn for e in evs}) == 10_000 and len({e.xid for e in evs}) == 10_000
    assert {e.seq for e in evs} == {1}
    assert [int(e.key) for e in evs] == list(range(1, 10_001)), "commit order lost"
    assert_same(pipe, {"public.tiny": ["id"]})
    assert_log_well_formed(pipe)


# ---- --until current and asynchronous commits ----------------------------------------------------------------
def test_until_current_includes_async_commits(pg_db: str, tmp_path: Path) -> None:
    """`cdc stream --until current` must include every transaction committed before it started,
    also those committed with synchronous_commit=off (common for bulk loads): their commit has
    returned to the client, but the server may not have *written* their WAL yet, so the server's
    write position (pg_current_wal_lsn) can be behind them; the insert position is not."""
    from cdc.reader import run_stream
    from sinks.registry import load_pipeline

    sql(pg_db, "CREATE TABLE a(id int PRIMARY KEY)")
    pipe = make_pipe(tmp_path, pg_db, ["public.a"])
    snapshot(pipe)
    conn = psycopg2.connect(pg_db, options=libpq_options())
    conn.autocommit = True
    try:
        total = 0
        for round_ in range(
            5
        ):  # the walwriter writes such WAL within wal_writer_delay (200 ms): try a few times
            with conn.cursor() as cur:
                cur.execute("SET synchronous_commit = off")
                cur.execute(
                    "INSERT INTO a SELECT g FROM generate_series(%s, %s) g",
                    (round_ * 10 + 1, round_ * 10 + 10),
                )
            stats = run_stream(load_pipeline(pipe.file), until="current")
            total += stats.events
            assert total == (round_ + 1) * 10, (
                f"round {round_}: the stream stopped before a committed transaction"
            )
    finally:
        conn.close()
    assert_same(pipe, {"public.a": ["id"]})


# ---- 10. kill -9 of the stream ---------------------------------------------------------------------------
def test_kill_9_of_stream_loses_nothing(pg_db: str, tmp_path: Path) -> None:
    """~200k changes in 2000 transactions while `cdc stream` is killed with SIGKILL at random moments
    and restarted: in the end the log holds every change exactly once."""
    make_table(pg_db, "t", 2000)
    pipe = make_pipe(tmp_path, pg_db, ["public.t"])
    snapshot(pipe)
    writer = Writer(
        pg_db, "t", list(range(1, 2001)), next_id=100_001, seed=10,
        inserts=(40, 60), updates=(20, 40), deletes=(10, 30), max_txns=2000,
    )  # fmt: skip
    rng = random.Random(20)
    writer.start()
    proc = start_stream(pipe)
    try:
        for _ in range(3):
            time.sleep(rng.uniform(0.5, 3.0))
            proc = restart_killed(proc, pipe)
        writer.finish()
        stop_stream(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        writer.halt.set()
    assert len(writer.txns) == 2000 and writer.changes > 190_000
    stream_until_current(pipe)
    assert_txns_streamed(pipe, "public.t", writer.txns)
    assert len(stream_events(pipe, "public.t")) == writer.changes
    assert_same(pipe, {"public.t": ["id"]})
    assert_log_well_formed(pipe)


# ---- 11. idle database, filtered traffic --------------------------------------------------------------------
def test_idle_and_filtered_traffic_advance_the_slot(pg, pg_db: str, tmp_path: Path) -> None:
    """WAL the publication filters out (another database, an unpublished table) and an idle server
    do not hold the slot back: confirmed_flush_lsn moves past them, so WAL does not pile up."""
    sql(pg_db, "CREATE TABLE pub(id int PRIMARY KEY)", "CREATE TABLE unpub(id serial PRIMARY KEY, v text)")
    pipe = make_pipe(tmp_path, pg_db, ["public.pub"], stream={"status_interval_s": 1})
    snapshot(pipe)
    other = "noise_" + os.urandom(4).hex()
    sql(pg.dsn(), f"CREATE DATABASE {other}")
    proc = start_stream(pipe)
    try:
        start_flush = slot_info(pg_db, pipe.slot)[1]
        same = psycopg2.connect(pg_db)
        far = psycopg2.connect(pg.dsn(other))
        same.autocommit = far.autocommit = True
        with same.cursor() as c1, far.cursor() as c2:
            c2.execute("CREATE TABLE noise(id serial PRIMARY KEY, v text)")
            mid_flush = None
            started = time.monotonic()
            while time.monotonic() - started < 8:
                c1.execute("INSERT INTO unpub(v) SELECT repeat('u', 100) FROM generate_series(1, 20)")
                c2.execute("INSERT INTO noise(v) SELECT repeat('n', 100) FROM generate_series(1, 20)")
                if mid_flush is None and time.monotonic() - started > 5:
                    mid_flush = slot_info(pg_db, pipe.slot)[1]
                time.sleep(0.005)
            c1.execute("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint")
            before_idle = c1.fetchone()[0]
        same.close()
        far.close()
        assert mid_flush > start_flush, "the slot did not move while only filtered WAL was written"
        deadline = time.monotonic() + 30
        while (confirmed := slot_info(pg_db, pipe.slot)[1]) < before_idle and time.monotonic() < deadline:
            time.sleep(0.2)
        assert confirmed >= before_idle, (
            f"slot stuck at {confirmed}, WAL was at {before_idle} before the idle period"
        )
        time.sleep(2)  # fully idle for a while: still running, nothing breaks
        assert proc.poll() is None, f"cdc stream exited during the idle period: {proc.communicate()}"
        assert slot_info(pg_db, pipe.slot)[1] >= before_idle
        stop_stream(proc, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
        sql(pg.dsn(), f"DROP DATABASE IF EXISTS {other} WITH (FORCE)")
    assert stream_events(pipe, "public.pub") == []


# ---- 12. a table added to a running pipeline ---------------------------------------------------------------
def test_snapshot_of_added_table_while_streaming(pg_db: str, tmp_path: Path) -> None:
    """`cdc snapshot --tables` for a table added to the pipeline file while `cdc stream` runs and
    both tables keep being written: the new table ends equal, the old one is untouched."""
    make_table(pg_db, "a", 200)
    make_table(pg_db, "b", 5000)
    pipe = make_pipe(tmp_path, pg_db, ["public.a"])
    snapshot(pipe)
    a_before = table_row(pipe, "public.a")
    proc = start_stream(pipe)
    wa = Writer(pg_db, "a", list(range(1, 201)), next_id=10_001, seed=12, pause=0.002)
    wb = Writer(pg_db, "b", list(range(1, 5001)), next_id=10_001, seed=13, pause=0.002)
    try:
        wa.start()
        wb.start()
        wb.wait_txns(50)
        write_pipeline(tmp_path, pg_db, ["public.a", "public.b"])  # the user adds b to the pipeline...
        run = snapshot(pipe, "--tables", "public.b")  # ...and snapshots it while the stream runs
        assert "copying 1 table(s)" in run.out and "public.b:" in run.out, run.out
        n_a, n_b = len(wa.txns), len(wb.txns)
        wa.wait_txns(n_a + 50)
        wb.wait_txns(n_b + 50)
        wa.finish()
        wb.finish()
        time.sleep(0.5)
        stop_stream(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        wa.halt.set()
        wb.halt.set()
    stream_until_current(pipe)
    assert table_row(pipe, "public.a") == a_before, "the snapshot of b touched a"
    assert_txns_streamed(pipe, "public.a", wa.txns)
    assert_same(pipe, {"public.a": ["id"], "public.b": ["id"]})
    assert_log_well_formed(pipe)


# ---- 13. interrupted snapshot ---------------------------------------------------------------------------------
# Runs the real CLI, except that the copy of one table SIGKILLs the process after its first rows are
# on disk and once the other tables' snapshots are finished: a crash in the middle of a copy, on cue.
CRASH_DURING_COPY = r"""
import os, signal, sqlite3, sys, threading, time
import snapshot.copier as copier
from pipelines.cli import main

log_db, victim = sys.argv.pop(1), sys.argv.pop(1)
here = threading.local()
copy = copier.CopyPool._copy

def copy_or_die(self, conn, job):
    here.victim = job.table.name == victim
    return copy(self, conn, job)

class DyingFile:
    # The victim's segment file: dies after the first rows are on disk, once the others are live.
    def __init__(self, f):
        self.f = f
    def __getattr__(self, name):
        return getattr(self.f, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return self.f.__exit__(*exc)
    def write(self, data):
        n = self.f.write(data)
        self.f.flush()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with sqlite3.connect(f"file:{log_db}?mode=ro", uri=True) as db:
                if db.execute("SELECT count(*) FROM tables WHERE state = 'live'").fetchone()[0] == 2:
                    break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
        return n

private_open = copier.private_open

def open_or_die(path, mode="wb", **kwargs):
    f = private_open(path, mode, **kwargs)
    if getattr(here, "victim", False) and str(path).endswith(".part"):
        return DyingFile(f)
    return f

copier.CopyPool._copy = copy_or_die
copier.private_open = open_or_die  # the segment writer's open, looked up at call time
sys.argv[0] = "cdc"
main()
"""


def test_interrupted_snapshot_is_redone(pg_db: str, tmp_path: Path) -> None:
    """kill -9 of `cdc snapshot` in the middle of copying one table, after two others finished: the
    rerun keeps the finished tables, copies the interrupted one again and cleans up after it."""
    from tests.harness import REPO

    for t, n in (("small1", 100), ("small2", 100), ("big", 20_000)):
        make_table(pg_db, t, n)
    pipe = make_pipe(tmp_path, pg_db, ["public.small1", "public.small2", "public.big"])
    args = [str(pipe.log / "log.db"), "big", "snapshot", str(pipe.file), "--no-progress", "--parallel", "2"]
    crashed = subprocess.run(
        [sys.executable, "-c", CRASH_DURING_COPY, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert crashed.returncode == -signal.SIGKILL, (
        f"exit {crashed.returncode}\n{crashed.stdout}\n{crashed.stderr}"
    )
    with log_db(pipe) as db:
        states = dict(db.execute("SELECT table_name, state FROM tables").fetchall())
    assert states == {"small1": "live", "small2": "live", "big": "snapshotting"}, states
    partial = [p for p in (pipe.log / "segments").rglob("*.part")]
    assert partial and partial[0].stat().st_size > 0, "the crash did not happen in the middle of the copy"

    sql(
        pg_db,
        "UPDATE big SET v = 'between' WHERE id <= 100",
        "DELETE FROM big WHERE id > 19900",
        "UPDATE small1 SET v = 'between' WHERE id <= 10",
    )
    run = snapshot(pipe, "--parallel", "2")
    assert "temporary replication slot" in run.out and "copying 1 table(s)" in run.out, run.out
    assert "public.big: 19,900 rows" in run.out, run.out
    sql(pg_db, "UPDATE big SET v = 'after' WHERE id <= 50", "UPDATE small2 SET v = 'after' WHERE id <= 10")
    stream_until_current(pipe)
    with log_db(pipe) as db:
        snaps = Counter(
            db.execute(
                "SELECT t.table_name, s.state FROM snapshots s JOIN tables t ON t.id = s.table_id"
            ).fetchall()
        )
    assert snaps == {
        ("small1", "done"): 1,
        ("small2", "done"): 1,
        ("big", "abandoned"): 1,
        ("big", "done"): 1,
    }, snaps
    leftovers = [p.name for p in (pipe.log / "segments").rglob("*") if p.is_file() and p.suffix != ".copy"]
    assert not leftovers, f"files of the interrupted copy left behind: {leftovers}"
    assert_same(pipe, {"public.small1": ["id"], "public.small2": ["id"], "public.big": ["id"]})
    assert_log_well_formed(pipe)


# ---- 14. compaction -------------------------------------------------------------------------------------------
def test_compaction(pg_db: str, tmp_path: Path) -> None:
    sql(
        pg_db,
        "CREATE TABLE c(id int PRIMARY KEY, n int NOT NULL DEFAULT 0, big text)",
        "ALTER TABLE c ALTER COLUMN big SET STORAGE EXTERNAL",
        "INSERT INTO c(id) SELECT g FROM generate_series(1, 600) g",
        f"UPDATE c SET big = {BIG_TEXT} WHERE id <= 5",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.c"])
    snapshot(pipe)
    sql(
        pg_db,
        "DO $$ BEGIN FOR i IN 1..5 LOOP UPDATE c SET n = n + 1; COMMIT; END LOOP; END $$",
        "DELETE FROM c WHERE id % 3 = 0",
        "INSERT INTO c(id) SELECT g FROM generate_series(1001, 1100) g",
        "DELETE FROM c WHERE id BETWEEN 1001 AND 1050",
        f"INSERT INTO c VALUES (2000, 0, {BIG_TEXT})",
        "UPDATE c SET n = 1 WHERE id = 2000",  # TOAST value known only from the stream
        "UPDATE c SET n = 2 WHERE id = 2000",
    )
    stream_until_current(pipe)
    deleted = 200 + 50
    tid = table_row(pipe, "public.c")[0]

    def counts() -> tuple[int, int, int]:
        with log_db(pipe) as db:
            events = db.execute(f"SELECT count(*) FROM ev_{tid} WHERE op != 'S'").fetchone()[0]
            deletes = db.execute(f"SELECT count(*) FROM ev_{tid} WHERE op = 'd'").fetchone()[0]
            seg_rows = db.execute("SELECT coalesce(sum(rows), 0) FROM segments").fetchone()[0]
        return events, deletes, seg_rows

    events0, deletes0, seg0 = counts()
    assert (deletes0, seg0) == (deleted, 600)
    ok("log", "compact", pipe.file)  # default retention: tombstones stay
    events1, deletes1, seg1 = counts()
    assert events1 < events0 / 3, f"compaction kept {events1} of {events0} events"
    assert deletes1 == deleted, "deletes younger than the retention must stay"
    assert seg1 < seg0, "snapshot rows superseded by newer events must go"
    assert_same(pipe, {"public.c": ["id"]})
    ok("log", "compact", pipe.file, "--tombstone-retention", "0s")
    events2, deletes2, seg2 = counts()
    assert deletes2 == 0 and events2 == events1 - deleted and seg2 <= seg1
    assert table_row(pipe, "public.c")[0] == tid
    with log_db(pipe) as db:
        assert db.execute("SELECT purged_below FROM tables WHERE id = ?", (tid,)).fetchone()[0] > 0
    assert_same(pipe, {"public.c": ["id"]})
    # Streaming goes on normally on a compacted log.
    sql(
        pg_db,
        "UPDATE c SET n = 99 WHERE id <= 10",
        "DELETE FROM c WHERE id = 1",
        "INSERT INTO c(id) VALUES (3)",
    )
    stream_until_current(pipe)
    assert_same(pipe, {"public.c": ["id"]})
    assert_log_well_formed(pipe)


# ---- 15. SIGINT / SIGTERM ---------------------------------------------------------------------------------------
def test_sigint_and_sigterm_stop_cleanly(pg_db: str, tmp_path: Path) -> None:
    """Ctrl-C or SIGTERM of a running `cdc stream` under write load: exit 0, no traceback, and a later
    run continues exactly where it stopped."""
    make_table(pg_db, "t", 500)
    pipe = make_pipe(tmp_path, pg_db, ["public.t"])
    snapshot(pipe)
    writer = Writer(
        pg_db,
        "t",
        list(range(1, 501)),
        next_id=10_001,
        seed=15,
        inserts=(0, 20),
        updates=(0, 20),
        deletes=(0, 5),
    )
    writer.start()
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
            proc = start_stream(pipe)
            try:
                writer.wait_txns(len(writer.txns) + 100)
                out, _err = stop_stream(proc, sig)
            finally:
                if proc.poll() is None:
                    proc.kill()
            assert "streamed" in out, out
    finally:
        writer.finish()
    stream_until_current(pipe)
    assert_txns_streamed(pipe, "public.t", writer.txns)
    assert_same(pipe, {"public.t": ["id"]})
    assert_log_well_formed(pipe)


@pytest.mark.parametrize("identity", ["DEFAULT", "FULL"])
def test_key_change_keeps_unchanged_toast_values(pg_db: str, tmp_path: Path, identity: str) -> None:
    """A primary-key change of a row whose TOASTed value the UPDATE did not touch: the new row must
    carry the value (followers have no row under the new key to keep it from)."""
    sql(
        pg_db,
        "CREATE TABLE tk (id int PRIMARY KEY, big text, small int)",
        "ALTER TABLE tk ALTER big SET STORAGE EXTERNAL",
        f"ALTER TABLE tk REPLICA IDENTITY {identity}",
        "INSERT INTO tk SELECT g, repeat(md5(g::text), 200), g FROM generate_series(1, 5) g",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.tk"])
    snapshot(pipe)
    sql(pg_db, "UPDATE tk SET id = id + 1000 WHERE id <= 2", "UPDATE tk SET small = 0 WHERE id = 1001")
    stream_until_current(pipe)
    assert_same(pipe, {"public.tk": ["id"]})
    assert_log_well_formed(pipe)
