"""Tables without a primary key: an insert-only audit table and a REPLICA IDENTITY FULL table beside
a keyed table.

The insert-only table goes into the pipeline's insert-only publication, so the application's own
UPDATE and DELETE on it keep working; each inserted row (snapshot and stream, a TOASTed value among
them) is its own log record keyed by its position and lands in Delta as its own row, read back by
delta-rs as the source's multiset; verify compares it as a multiset and names what differs. The FULL
table's updates and deletes of one of identical rows change one of them in Delta and in Iceberg too
(an Iceberg follower beside the Delta one, read back by pyiceberg and Polars).
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from pipelines.devservices.postgres import LocalPostgres
from tests.fixtures.capture import start_stream, stop_stream
from tests.fixtures.lake import LAKE, apply_ok, ckpt_file, delta_dir, make_pipe, snapshot, stream, verified
from tests.fixtures.readers import delta_rows, tantivy_docs, tantivy_live_count
from tests.harness import apply_crashing, cdc_here, sql, verify, wait_for

pytestmark = pytest.mark.integration

POSITION = ("_cdc_lsn", "_cdc_seq")
# an Iceberg follower of both keyless tables beside the Delta one (SQLite catalog in <pipe>/ice)
ICE = {"name": "ice", "iceberg": {"warehouse": "ice", "tables": ["public.audit", "public.tally"]}}


def _source(dsn: str) -> Counter:
    return Counter(sql(dsn, "SELECT who, what, n FROM audit"))


def _lake(path: Path) -> Counter:
    rows = delta_rows(None, path, POSITION)  # delta-rs; asserts the positions are unique
    return Counter((r["who"], r["what"], r["n"]) for r in rows.values())


def _tally(dsn: str) -> Counter:
    return Counter(sql(dsn, "SELECT k, v, doc FROM tally"))


def _lake_tally(path: Path) -> Counter:
    rows = delta_rows(None, path, POSITION)  # delta-rs; asserts the positions are unique
    return Counter((r["k"], r["v"], r["doc"]) for r in rows.values())


def _iceberg(pipe, table: str, columns: tuple[str, ...]) -> Counter:
    """The Iceberg follower's table as a multiset, read by pyiceberg and by Polars `scan_iceberg` (not
    through the sink), which must agree; each row has its own position."""
    import polars as pl
    from pyiceberg.catalog.sql import SqlCatalog

    lake = pipe.dir / "ice"
    found = SqlCatalog("ice", uri=f"sqlite:///{lake / 'catalog.db'}", warehouse=f"file://{lake}").load_table(
        table
    )
    rows = found.scan().to_arrow().to_pylist()
    positions = {(r["_cdc_lsn"], r["_cdc_seq"]) for r in rows}
    assert len(positions) == len(rows) and (None, None) not in positions, rows
    got = Counter(tuple(r[c] for c in columns) for r in rows)
    polars = pl.scan_iceberg(found).select(*columns).collect().rows()
    assert Counter(polars) == got, (polars, got)
    return got


def _one(k: str) -> str:
    """A WHERE that picks one of the rows with k = `k` (identical ones among them), by ctid."""
    return f"ctid = (SELECT ctid FROM tally WHERE k = '{k}' LIMIT 1)"


# on 18 in `make test-slow` only: `make test` has the keyless tables on 18 in the compact scenario of
# test_pg_versions.py (insert-only and FULL, duplicates updated and deleted one at a time)
@pytest.mark.parametrize(
    "pg_any", [15, pytest.param(18, marks=pytest.mark.slow)], ids=["pg15", "pg18"], indirect=True
)
def test_insert_only_table_snapshot_stream_apply_verify(
    pg_any_db: str, tmp_path: Path, spark, monkeypatch
) -> None:
    """Beside it, a keyless REPLICA IDENTITY FULL table (tally) followed as a multiset: an update or
    a delete of one of two identical rows changes one of them, in the source, in Delta and (on
    PostgreSQL 15: the follower's side is the same on every major) in Iceberg. On PostgreSQL 15 the
    tally table is then switched back to the default replica identity while followed: validate names
    what breaks and the fixes, the stream goes on exactly, and the fix as printed moves the table to
    the insert-only publication."""
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # Polars plans the scan with pyiceberg
    dsn = pg_any_db
    pg15 = int(sql(dsn, "SHOW server_version_num")[0][0]) < 180000
    ice = [ICE] if pg15 else []
    sql(
        dsn,
        "CREATE TABLE audit(who text, what text, n int)",  # no key, default replica identity
        "CREATE TABLE acct(id int PRIMARY KEY, bal int)",
        "CREATE TABLE tally(k text, v int, doc text)",
        "ALTER TABLE tally REPLICA IDENTITY FULL",
        # duplicates on purpose: two identical rows are two rows
        "INSERT INTO audit SELECT 'u' || (g % 3), 'login', g % 4 FROM generate_series(1, 30) g",
        "INSERT INTO acct SELECT g, 100 FROM generate_series(1, 10) g",
        "INSERT INTO tally SELECT k, v, NULL FROM (VALUES ('a', 1), ('a', 1), ('a', 1), ('b', 2), ('b', 2), ('c', 3)) t(k, v)",
    )
    pipe = make_pipe(
        tmp_path,
        dsn,
        ["public.audit", "public.acct", "public.tally"],
        sinks=[
            {"name": "lake", "delta": {"path": "lake"}},
            {"name": "cache", "redis": {"url": "redis://127.0.0.1:1/0", "tables": ["public.audit"]}},
        ],
    )

    # validate: the cache cannot hold it (exit 3, the reason); the delta sink alone passes and says how it is followed
    run = cdc_here("validate", pipe.file)
    assert run.code == 3, run.out + run.err
    assert "sink cache (redis) cannot follow public.audit: it has no primary key" in run.out, run.out
    docs = {"name": "docs", "search": {"engine": "tantivy", "path": "docs", "tables": ["public.audit"]}}
    pipe = make_pipe(
        tmp_path,
        dsn,
        ["public.audit", "public.acct", "public.tally"],
        sinks=[{"name": "lake", "delta": {"path": "lake"}}, docs, *ice],
    )
    run = cdc_here("validate", pipe.file)
    assert run.code == 0, run.out + run.err
    assert (
        "table public.audit: 3 columns, no key: followed insert-only (inserts and truncates, through publication cdc_test_inserts)"
        in run.out
    ), run.out
    assert "table public.acct: 2 columns, key (id) from primary key" in run.out, run.out
    assert (
        "table public.tally: 3 columns, no key, REPLICA IDENTITY FULL: followed as a multiset (inserts, updates, "
        "deletes and truncates, through publication cdc_test), each row identified by its content" in run.out
    ), run.out

    snapshot(pipe)
    apply_ok(pipe, spark)
    before = ckpt_file(pipe).read_bytes()  # the follower's checkpoint at the snapshot's cut
    ice_before = ckpt_file(pipe, "ice").read_bytes() if pg15 else b""
    pubs = sql(
        dsn,
        "SELECT p.pubname, c.relname, p.pubinsert, p.pubupdate, p.pubdelete FROM pg_publication p"
        " JOIN pg_publication_rel r ON r.prpubid = p.oid JOIN pg_class c ON c.oid = r.prrelid ORDER BY 1, 2",
    )
    assert pubs == [
        ("cdc_test", "acct", True, True, True),
        ("cdc_test", "tally", True, True, True),
        ("cdc_test_inserts", "audit", True, False, False),
    ], pubs

    # more inserts after the snapshot: duplicates again, and a TOASTed (out-of-line, uncompressible) value
    big = "SELECT string_agg(md5(g::text), '') FROM generate_series(1, 3000) g"
    sql(
        dsn,
        "INSERT INTO audit SELECT 'u1', 'login', 1 FROM generate_series(1, 5)",
        f"INSERT INTO audit VALUES ('u9', ({big}), 7)",
        "UPDATE acct SET bal = bal + 1 WHERE id <= 3",
        # the application's UPDATE and DELETE of one of identical rows (they work: FULL is a replica identity)
        f"UPDATE tally SET v = 10 WHERE {_one('a')}",
        f"DELETE FROM tally WHERE {_one('b')}",
        # two identical TOASTed rows; an update of one leaves its TOAST value alone (sent unchanged)
        f"INSERT INTO tally SELECT 't', 5, ({big}) FROM generate_series(1, 2)",
        f"UPDATE tally SET v = 6 WHERE {_one('t')}",
        # inserted and one of them deleted in the same cut
        "INSERT INTO tally VALUES ('d', 4, 'x'), ('d', 4, 'x')",
        f"DELETE FROM tally WHERE {_one('d')}",
    )
    stream(pipe)
    apply_ok(pipe, spark)
    tally = delta_dir(pipe, "public.tally")
    assert _lake_tally(tally) == _tally(dsn)
    assert sorted((k, v) for k, v, _ in _lake_tally(tally).elements()) == [
        ("a", 1),
        ("a", 1),
        ("a", 10),
        ("b", 2),
        ("c", 3),
        ("d", 4),
        ("t", 5),
        ("t", 6),
    ]
    assert {len(d) for k, _, d in _lake_tally(tally) if k == "t"} == {96_000}  # the TOASTed value whole
    if pg15:
        ice_tally = _iceberg(pipe, "public.tally", ("k", "v", "doc"))
        assert ice_tally == _tally(dsn)
        assert {len(d) for k, _, d in ice_tally if k == "t"} == {96_000}
    path = delta_dir(pipe, "public.audit")
    assert _lake(path) == _source(dsn)
    assert sum(_lake(path).values()) == 36
    assert max(len(w) for _, w, _ in _lake(path)) == 96_000  # the TOASTed value whole
    index = tmp_path / "docs" / "public" / "audit"
    found = tantivy_docs(index)  # tantivy's own searcher; ids are the positions
    assert Counter((d["who"], d["what"], d["n"]) for d in found.values()) == _source(dsn)
    assert tantivy_live_count(index) == 36 and all(i.startswith("[") for i in found), list(found)[:3]
    verified(pipe, spark)

    # a crash after the follower's write and before its checkpoint: the cut is applied again, no row doubled
    ckpt_file(pipe).write_bytes(before)
    if pg15:
        ckpt_file(pipe, "ice").write_bytes(ice_before)
    apply_ok(pipe, spark)
    assert _lake(path) == _source(dsn) and ckpt_file(pipe).read_bytes() != before
    assert _lake_tally(tally) == _tally(dsn)  # the cut's deletes removed no second copy
    if pg15:
        assert ckpt_file(pipe, "ice").read_bytes() != ice_before
        assert _iceberg(pipe, "public.tally", ("k", "v", "doc")) == _tally(dsn)  # the snapshot-summary cut id
        assert _iceberg(pipe, "public.audit", ("who", "what", "n")) == _source(dsn)

    # the application's own UPDATE and DELETE on the keyless table still work (no replica identity
    # needed: it is in no publication that publishes them) ...
    sql(dsn, "UPDATE audit SET n = 100 WHERE who = 'u9'", "DELETE FROM audit WHERE n = 3")
    assert sql(dsn, "SELECT count(*) FROM audit WHERE n = 100") == [(1,)]
    # ... and are not followed (nothing is pending for the follower): verify names what differs, as a multiset
    code, report = verify(pipe.file, spark)
    assert code == 1, report
    assert "missing 1, extra 8, different 0" in report, report
    assert "extra: 3 row(s) (who='u0', what='login', n=3)" in report, report
    assert "missing: 1 row(s) (who='u9'" in report and "n=100)" in report, report

    # the insert-only table gets REPLICA IDENTITY FULL while followed: it is still in the insert-only
    # publication alone, so its updates and deletes are not captured; validate says so, and the stream
    # stops at its next change with the fix, which works as printed (a new copy, in the main publication)
    sql(dsn, "ALTER TABLE audit REPLICA IDENTITY FULL", "INSERT INTO audit VALUES ('u5', 'after', 5)")
    run = cdc_here("validate", pipe.file)  # a multiset now, which the search sink cannot follow
    assert run.code == 3 and "sink docs (search) cannot follow public.audit" in run.out, run.out
    pipe = make_pipe(tmp_path, dsn, ["public.audit", "public.acct", "public.tally"], sinks=[LAKE, *ice])
    run = cdc_here("validate", pipe.file)
    assert run.code == 0, run.out + run.err
    assert "note: table public.audit has REPLICA IDENTITY FULL but is followed insert-only" in run.out, (
        run.out
    )
    run = cdc_here("stream", pipe.file, "--until", "current")
    assert run.code == 3, run.out + run.err
    assert "table public.audit got REPLICA IDENTITY FULL while followed insert-only" in run.err, run.err
    assert "--tables public.audit`" in run.err, run.err
    run = cdc_here("snapshot", pipe.file, "--tables", "public.audit", "--no-progress")
    assert run.code == 0, run.out + run.err
    assert ("cdc_test", "audit", True, True, True) in sql(
        dsn,
        "SELECT p.pubname, c.relname, p.pubinsert, p.pubupdate, p.pubdelete FROM pg_publication p"
        " JOIN pg_publication_rel r ON r.prpubid = p.oid JOIN pg_class c ON c.oid = r.prrelid",
    )
    if not pg15:
        # the rest is the follower's side (a new base's multiset MERGE, a crash), the same on every major,
        # and the switch from FULL back to DEFAULT, run on 15
        return
    # one of identical rows updated and one deleted, in the cut that starts the table over from its new
    # base: each follower's multiset MERGE replaces every row in that commit (sinks/multiset.py, restart)
    one = "ctid = (SELECT ctid FROM audit WHERE who = 'u1' AND what = 'login' AND n = 1 LIMIT 1)"
    sql(dsn, f"UPDATE audit SET n = 50 WHERE {one}", f"DELETE FROM audit WHERE {one}")
    stream(pipe)
    code, report = verify(pipe.file, spark)  # the follower is at a cut before the point, changes pending
    assert code == 1 and "NOT VERIFIED" in report and "are not applied yet" in report, report
    # killed after the cut's MERGE committed, before the cut is recorded: the rerun applies it again (Delta
    # skips the MERGE; Iceberg finds the cut id in the table's snapshots), and the new base's rows stay
    apply_crashing(pipe.file, spark, "apply:after-merge", "lake")
    apply_crashing(pipe.file, spark, "apply:after-merge", "ice")
    apply_ok(pipe, spark)
    assert _lake(path) == _source(dsn) and Counter({("u1", "login", 50): 1}) <= _lake(path)
    assert _iceberg(pipe, "public.audit", ("who", "what", "n")) == _source(dsn)  # (verified at the end)

    # the multiset table switched back to the default replica identity while followed (by a running
    # stream): it is still in the main publication, so PostgreSQL refuses the application's UPDATE and
    # DELETE on it (inserts work)
    running = start_stream(pipe)
    sql(
        dsn,
        "ALTER TABLE tally REPLICA IDENTITY DEFAULT",
        "INSERT INTO tally VALUES ('e', 7, 'y'), ('e', 7, 'y')",
    )
    with pytest.raises(Exception, match="does not have a replica identity and publishes updates"):
        sql(dsn, f"UPDATE tally SET v = 8 WHERE {_one('e')}")
    switched = (
        "table public.tally has no primary key and REPLICA IDENTITY DEFAULT but is followed through publication "
        "cdc_test, which publishes updates and deletes"
    )
    # the stream goes on (its inserts are all its changes now) and says so at the table's first change
    # after the switch; both followers stay exact
    # the insert position: the write position can be behind the inserts' commit (synchronous_commit=off)
    now = sql(dsn, "SELECT pg_current_wal_insert_lsn()")[0][0]
    wait_for(
        "the stream to acknowledge the inserts after the switch",
        lambda: sql(
            dsn,
            f"SELECT confirmed_flush_lsn >= '{now}' FROM pg_replication_slots WHERE slot_name = 'cdc_test'",
        )[0][0],
        running,
    )
    out, err = stop_stream(running)
    assert switched in out + err, out + err
    stream(pipe)  # (up to now, as in the rest of the test: it warns at its start)
    run = cdc_here("validate", pipe.file)  # the problem and both fixes
    assert run.code == 3 and switched in run.out, run.out + run.err
    assert "FAIL table public.tally: 3 columns, no key, REPLICA IDENTITY DEFAULT (was FULL)" in run.out, (
        run.out
    )
    assert "fix: run ALTER TABLE public.tally REPLICA IDENTITY FULL;" in run.out, run.out
    assert "--tables public.tally` (it moves public.tally to publication cdc_test_inserts" in run.out, run.out
    apply_ok(pipe, spark)
    assert _lake_tally(tally) == _tally(dsn) == _iceberg(pipe, "public.tally", ("k", "v", "doc"))
    code, report = verify(pipe.file, spark)  # it warns and goes on too: every table identical
    assert code == 0 and switched in report, report
    # the second fix as printed: out of the main publication, into the insert-only one, copied again
    run = cdc_here("snapshot", pipe.file, "--tables", "public.tally", "--no-progress")
    assert run.code == 0, run.out + run.err
    members = sql(
        dsn,
        "SELECT p.pubname FROM pg_publication p JOIN pg_publication_rel r ON r.prpubid = p.oid"
        " WHERE r.prrelid = 'tally'::regclass",
    )
    assert members == [("cdc_test_inserts",)], members
    assert cdc_here("validate", pipe.file).code == 0
    sql(
        dsn,
        "INSERT INTO tally VALUES ('f', 9, 'z')",
        # a multiset table truncated, then identical rows again: the follower holds only those
        "TRUNCATE audit",
        "INSERT INTO audit VALUES ('u7', 'after truncate', 1), ('u7', 'after truncate', 1)",
    )
    stream(pipe)
    apply_ok(pipe, spark)  # the new base, then the insert: read back by delta-rs, pyiceberg and Polars
    assert _lake_tally(tally) == _tally(dsn) == _iceberg(pipe, "public.tally", ("k", "v", "doc"))
    assert _source(dsn) == Counter({("u7", "after truncate", 1): 2})
    assert _lake(path) == _source(dsn) == _iceberg(pipe, "public.audit", ("who", "what", "n"))
    sql(
        dsn, f"UPDATE tally SET v = 8 WHERE {_one('e')}", f"DELETE FROM tally WHERE {_one('e')}"
    )  # they work again

    run = cdc_here("teardown", pipe.file, "--drop-slot", "--yes")
    assert run.code == 0 and "dropped publication cdc_test_inserts" in run.out, run.out + run.err
    assert sql(dsn, "SELECT pubname FROM pg_publication") == []


@pytest.mark.slow
def test_pgbench_tpcb_with_history(pg_any: LocalPostgres, pg_any_db: str, tmp_path: Path, spark) -> None:
    """pgbench's TPC-B with pgbench_history (no key) captured: snapshot and stream under the running
    workload; its row count and sum(delta) equal in the source and the lake; verify exits 0."""
    dsn = pg_any_db
    pgbench = str(pg_any.bin_dir() / "pgbench")
    subprocess.run([pgbench, "-i", "-s", "1", "-q", dsn], check=True, capture_output=True, timeout=300)
    tables = [
        "public.pgbench_accounts",
        "public.pgbench_branches",
        "public.pgbench_tellers",
        "public.pgbench_history",
    ]
    pipe = make_pipe(tmp_path, dsn, tables, sinks=[LAKE])
    load = subprocess.Popen(
        [pgbench, "-c", "2", "-T", "20", "-n", dsn], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        time.sleep(3)
        snapshot(pipe)  # while the workload writes
        stream(pipe)
    finally:
        out, err = load.communicate(timeout=120)
    assert load.returncode == 0, err
    stream(pipe)
    apply_ok(pipe, spark)
    source = sql(dsn, "SELECT count(*), sum(delta) FROM pgbench_history")[0]
    assert source[0] > 100, out
    from deltalake import DeltaTable

    lake = DeltaTable(str(delta_dir(pipe, "public.pgbench_history"))).to_pyarrow_table().to_pylist()
    assert (len(lake), sum(r["delta"] for r in lake)) == source
    verified(pipe, spark)


def test_validate_refuses_what_would_break_the_application(pg_db: str, tmp_path: Path) -> None:
    """A keyless table already in a publication that publishes updates (PostgreSQL then refuses the
    application's UPDATE): refused with the statement that fixes it, which works as printed; a keyless
    REPLICA IDENTITY FULL table passes (followed as a multiset, through the main publication), and the
    application's UPDATE and DELETE on both work once the pipeline is set up."""
    sql(
        pg_db,
        "CREATE TABLE ev(at int, what text)",
        "CREATE TABLE full_ev(at int, what text)",
        "ALTER TABLE full_ev REPLICA IDENTITY FULL",
        "INSERT INTO ev VALUES (1, 'a')",
        "INSERT INTO full_ev VALUES (1, 'a'), (1, 'a')",
        "CREATE PUBLICATION cdc_test FOR TABLE ev",
    )
    with pytest.raises(Exception, match="does not have a replica identity"):
        sql(pg_db, "UPDATE ev SET what = 'x'")  # what the tool must never set up
    pipe = make_pipe(tmp_path, pg_db, ["public.ev", "public.full_ev"], sinks=[LAKE])
    run = cdc_here("validate", pipe.file)
    assert run.code == 3, run.out + run.err
    assert (
        "table public.ev has no primary key and is in publication cdc_test, which publishes updates"
        in run.out
    ), run.out
    assert "fix: run ALTER PUBLICATION cdc_test DROP TABLE public.ev;" in run.out, run.out
    assert "table public.full_ev: 2 columns, no key, REPLICA IDENTITY FULL: followed as a multiset" in run.out
    sql(pg_db, "ALTER PUBLICATION cdc_test DROP TABLE public.ev;")
    run = cdc_here("validate", pipe.file)
    assert run.code == 0, run.out + run.err
    snapshot(pipe)
    # the application's writes work
    sql(
        pg_db,
        "UPDATE ev SET what = 'x'",
        "UPDATE full_ev SET what = 'y'",
        "DELETE FROM full_ev",
        "DELETE FROM ev",
    )


def test_multiset_choice_of_rows_to_remove(spark) -> None:
    """The MERGE source of a multiset cut (sinks/multiset.py), on DataFrames alone (two small
    Spark jobs, no Delta): per content the oldest rows go, as many as the cut deletes, among the rows
    held and the rows the cut inserts; here a first cut (nothing held) and a new base (every held row
    goes but those inserted again at their position)."""
    from sinks.multiset import multiset_source

    cols = "k string, _cdc_lsn long, _cdc_seq long, _cdc_op string, _cdc_commit_ts timestamp"
    cut = spark.createDataFrame(
        [
            ("a", 20, 1, "d", None),  # a row held before
            ("n", 30, 1, "c", None),
            ("n", 30, 2, "c", None),
            ("n", 31, 1, "d", None),  # one of the two inserted 'n' rows: the oldest, (30, 1)
            (None, 32, 1, "c", None),
            (None, 33, 1, "d", None),  # NULLs equal: the row inserted just before
        ],
        cols,
    )

    def rows(df) -> set[tuple]:
        return {(r["k"], r["_cdc_lsn"], r["_cdc_seq"], r["_cdc_op"]) for r in df.collect()}

    # (with rows held, as applied to Delta: test_insert_only_table_snapshot_stream_apply_verify)
    assert rows(multiset_source(cut, ["k"], None)) == {("n", 30, 2, "c")}  # 'a': nothing to remove
    again = spark.createDataFrame([("n", 30, 2, "c", None), ("a", 10, 2, "r", None)], cols)
    assert rows(multiset_source(cut, ["k"], again, restart=True)) == {
        ("n", 30, 2, "c"),  # inserted again at its position: kept (the MERGE matches it and changes nothing)
        ("a", 10, 2, "d"),
    }
