"""The tables of a cut applied side by side (pipelines/apply/parallel.py, `spark.apply_parallelism`)
against a real PostgreSQL, the session's Spark, Delta and Redis.

One scenario (Spark pays seconds per table): five small tables, apply_parallelism 4, a Delta
and a Redis follower.
* each sink reports its tables' stats in the cut's order, whatever finished first, with the
  right counts (the bootstrap cut, then a cut of inserts, updates, deletes and a truncate);
* a `cdc apply` SIGKILLed in the middle of that parallel cut (the fifth table about to start,
  one table committed, others in flight) leaves the cut pending; the next run applies exactly
  that cut, each table's MERGE committed once (Delta's txnAppId/txnVersion skip those already in);
* both followers then hold the source: `cdc verify` exit 0, and the rows read back with delta-rs
  and redis-py equal the source.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis

from tests.fixtures.lake import (
    FAST_JVM,
    LAKE,
    apply_ok,
    ckpt,
    delta_dir,
    lake_app_id,
    make_pipe,
    snapshot,
    stream,
    txn_commits,
    verified,
)
from tests.fixtures.readers import delta_rows, redis_rows
from tests.harness import cdc, source_rows, sql

pytestmark = [pytest.mark.integration]

TABLES = [f"public.p{i}" for i in range(5)]


def assert_followers_are_source(pipe, spark, dsn: str, url: str) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        for table in TABLES:
            source = source_rows(dsn, table, ("id",))
            lake = delta_rows(spark, delta_dir(pipe, table))
            assert {k: r["v"] for k, r in lake.items()} == {k: r["v"] for k, r in source.items()}, table
            cached = redis_rows(client, f"{table}:")
            assert {(str(r["id"]),): r["v"] for r in cached.values()} == {
                k: r["v"] for k, r in source.items()
            }, table
    finally:
        client.close()


def test_cut_of_five_tables_applied_side_by_side(pg_db: str, tmp_path: Path, spark, redis_db: str) -> None:
    for i, table in enumerate(TABLES):
        sql(
            pg_db,
            f"CREATE TABLE {table}(id int PRIMARY KEY, v text)",
            f"INSERT INTO {table} SELECT g, 't{i}-' || g FROM generate_series(1, 20) g",
        )
    pipe = make_pipe(
        tmp_path,
        pg_db,
        TABLES,
        sinks=[LAKE, {"name": "cache", "redis": {"url": redis_db, "tables": TABLES}}],
        spark={"conf": FAST_JVM, "apply_parallelism": 4},
    )
    snapshot(pipe)
    (lake, cache) = apply_ok(pipe, spark)
    # the stats in the cut's order, whatever finished first
    assert [s.table for s in lake.tables] == [s.table for s in cache.tables] == TABLES
    assert [s.inserted for s in lake.tables] == [s.inserted for s in cache.tables] == [20] * len(TABLES)

    # a cut of updates, deletes, inserts and a truncate, its lake apply killed (kill -9) mid-way
    for i, table in enumerate(TABLES):
        sql(
            pg_db,
            f"UPDATE {table} SET v = 'changed' WHERE id <= {i + 1}",
            f"DELETE FROM {table} WHERE id = 20",
            f"INSERT INTO {table} VALUES (100, 'new {i}')",
        )
    sql(pg_db, "TRUNCATE public.p3", "INSERT INTO public.p3 VALUES (1, 'after the truncate')")
    stream(pipe)
    before = ckpt(pipe)
    run = cdc(
        "apply", pipe.file, "--once", "--sink", "lake", env={"CDC_FAULT": "apply:between-tables"}, timeout=600
    )
    assert run.code == -signal.SIGKILL, f"exit {run.code}\n{run.out}\n{run.err}"
    crashed = ckpt(pipe)
    assert crashed["cut_id"] == before["cut_id"] and crashed["pending"], crashed
    cut = crashed["pending"]["cut_id"]
    app = lake_app_id(pipe)
    merged = {t: len(txn_commits(delta_dir(pipe, t), app, cut)) for t in TABLES}
    # one table had finished when the fifth was about to start; at most the four started ones are in
    assert 1 <= sum(merged.values()) <= 4 and set(merged.values()) <= {0, 1}, merged

    (lake, cache) = apply_ok(pipe, spark)
    assert {r.sink: r.cut_id for r in (lake, cache)} == {"lake": cut, "cache": cut}, (
        "the rerun did not apply the pending cut"
    )
    assert ckpt(pipe)["pending"] is None
    merged_now = {t: len(txn_commits(delta_dir(pipe, t), app, cut)) for t in TABLES}
    assert merged_now == dict.fromkeys(TABLES, 1), f"MERGE commits of cut {cut} per table: {merged_now}"
    assert [s.table for s in lake.tables] == [s.table for s in cache.tables] == TABLES
    # table i: ids 1..i+1 updated; p3 was truncated (its earlier changes dropped, id 1 inserted anew)
    updated = {t: 0 if t == "public.p3" else i + 1 for i, t in enumerate(TABLES)}
    assert {s.table: s.updated for s in cache.tables} == updated
    # the lake's counts of the tables this run merged (those the killed run had committed are skipped)
    assert {s.table: s.updated for s in lake.tables if not merged[s.table]} == {
        t: n for t, n in updated.items() if not merged[t]
    }
    verified(pipe, spark)
    assert_followers_are_source(pipe, spark, pg_db, redis_db)
