"""Issue 33.5: `dropped_columns: keep | null | drop` per sink, on real PostgreSQL, Spark/Delta (read
back by delta-rs, the `deltalake` package) and Redis (read by redis-py). After `DROP COLUMN rollout`
and updates of some rows: keep leaves the updated rows with their old value (as before), null gives
every row NULL, drop removes the column; the next cut keeps it so; `cdc verify` passes for all."""

from __future__ import annotations

import pytest
import redis
from deltalake import DeltaTable

from tests.fixtures.lake import apply, make_pipe, snapshot, stream, verified
from tests.fixtures.readers import redis_rows
from tests.harness import sql

pytestmark = pytest.mark.integration


def _lake(tmp_path, name: str) -> dict[int, dict]:
    rows = DeltaTable(str(tmp_path / name / "public" / "t")).to_pyarrow_table().to_pylist()
    return {r["id"]: r for r in rows}


def test_dropped_columns_keep_null_drop(tmp_path, pg_db, spark, redis_db):
    sql(
        pg_db,
        "CREATE TABLE t(id int PRIMARY KEY, v text, rollout text)",
        "INSERT INTO t SELECT g, 'v' || g, 'r' || g FROM generate_series(1, 10) g",
    )
    sinks = [
        {"name": "keep", "delta": {"path": "keep"}},
        {"name": "nulled", "delta": {"path": "nulled"}, "dropped_columns": "null"},
        {"name": "dropped", "delta": {"path": "dropped"}, "dropped_columns": "drop"},
        {
            "name": "cnull",
            "redis": {"url": redis_db, "tables": ["public.t"], "key": "n:{schema}.{table}:{pk}"},
            "dropped_columns": "null",
        },
        {
            "name": "cdrop",
            "redis": {"url": redis_db, "tables": ["public.t"], "key": "d:{schema}.{table}:{pk}"},
            "dropped_columns": "drop",
        },
    ]
    pipe = make_pipe(tmp_path, pg_db, ["public.t"], sinks=sinks)
    snapshot(pipe)
    runs, lines = apply(pipe, spark)
    assert not [r for r in runs if r.error], "\n".join(lines)
    assert _lake(tmp_path, "nulled")[1]["rollout"] == "r1"

    sql(
        pg_db,
        "ALTER TABLE t DROP COLUMN rollout",
        "UPDATE t SET v = 'new' WHERE id <= 3",
        "INSERT INTO t VALUES (11, 'v11')",
    )
    stream(pipe)
    runs, lines = apply(pipe, spark)
    out = "\n".join(lines)
    assert not [r for r in runs if r.error], out
    assert "sink nulled: public.t: column(s) rollout dropped at the source: set NULL in every row" in out, out
    assert "sink dropped: public.t: column(s) rollout dropped at the source: dropped from the table" in out, (
        out
    )

    keep, nulled, dropped = _lake(tmp_path, "keep"), _lake(tmp_path, "nulled"), _lake(tmp_path, "dropped")
    assert keep[1]["rollout"] == "r1" and keep[1]["v"] == "new" and keep[11]["rollout"] is None  # as before
    assert all(r["rollout"] is None for r in nulled.values()) and nulled[1]["v"] == "new"
    assert (
        all("rollout" not in r for r in dropped.values()) and dropped[1]["v"] == "new" and len(dropped) == 11
    )
    client = redis.Redis.from_url(redis_db, decode_responses=True)
    try:
        cnull = redis_rows(client, "n:public.t:")
        cdrop = redis_rows(client, "d:public.t:")
    finally:
        client.close()
    assert len(cnull) == len(cdrop) == 11
    assert all("rollout" in r and r["rollout"] is None for r in cnull.values()), cnull
    assert all("rollout" not in r for r in cdrop.values()), cdrop
    assert cnull["n:public.t:1"]["v"] == cdrop["d:public.t:1"]["v"] == "new"

    # the next cut: rows stay so, and each follower is the source
    sql(pg_db, "UPDATE t SET v = 'later' WHERE id IN (4, 11)")
    stream(pipe)
    runs, lines = apply(pipe, spark)
    assert not [r for r in runs if r.error], "\n".join(lines)
    assert _lake(tmp_path, "nulled")[4] == {**_lake(tmp_path, "nulled")[4], "v": "later", "rollout": None}
    assert "rollout" not in _lake(tmp_path, "dropped")[4]
    verified(pipe, spark)
