"""The Redis cache follower (sinks/cache) against a real PostgreSQL, Spark and redis-server.

* the compare-and-set scripts on their own: position guard (exact for 20-digit LSNs),
  tombstones, truncate marker, raw merge of unchanged-TOAST members;
* inserts, updates (incl. an unchanged TOAST value, a column added with a DEFAULT, and a
  column added and dropped inside one cut), deletes and truncates reach Redis; values are the row as JSON with the position first;
  `cdc verify` says identical;
* a replayed cut changes nothing; a late batch with older positions changes nothing (deleted
  rows are not resurrected, newer values not regressed);
* Redis killed mid-apply, restarted: the next run re-applies the pending cut and the cache
  equals the source;
* a password-protected Redis: the password reaches the executors by environment, in no
  pickled task function (issue 24 item 4);
* Redis unreachable: a clear SinkError naming the URL (password masked), checkpoint kept;
  with a Delta sink next to it only the cache fails, and it catches up after Redis is back.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from pathlib import Path

import pytest
import redis

from cdc.ground.errors import SinkError
from cdc.ground.tables import TableName
from pipelines.checkpoints import checkpoint_dir, load_checkpoint
from pipelines.devservices.base import free_port
from pipelines.devservices.redis import LocalRedis
from sinks.cache.keys import KeyTemplate
from sinks.registry import load_pipeline
from tests.fixtures.readers import delta_rows, redis_rows
from tests.fixtures.spark_tasks import shipped_tasks
from tests.fixtures.workload import BIG_TEXT
from tests.harness import apply_once, cdc_here, source_rows, sql, verify, write_pipeline
from tests.harness import stream_changes as stream

pytestmark = pytest.mark.integration


# ---- helpers -------------------------------------------------------------------------------------
def snapshot(file: Path) -> None:
    from snapshot.runner import run_snapshot

    run_snapshot(load_pipeline(file), progress=False)


def dump(url: str) -> dict[bytes, tuple[bytes | None, bool]]:
    """Every key with its value (strings) and whether it has a TTL."""
    client = redis.Redis.from_url(url)
    try:
        out = {}
        for key in client.scan_iter(count=1000):
            value = client.get(key) if client.type(key) == b"string" else None
            out[key] = (value, client.ttl(key) > 0)
        return out
    finally:
        client.close()


def rows_of(url: str, prefix: str) -> dict[str, dict]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return redis_rows(client, prefix)
    finally:
        client.close()


def assert_cache_is_source(url: str, dsn: str, table: str = "t", columns: tuple[str, ...] = ("v",)) -> None:
    """Read the cache with redis-py (not the sink's `current`) and compare it with the source:
    the same keys (`public.<table>:<id>`, integer ids need no escaping) and column values."""
    cached = rows_of(url, f"public.{table}:")
    source = source_rows(dsn, f"public.{table}", ("id",))
    assert sorted(cached) == sorted(f"public.{table}:{i}" for (i,) in source), (len(cached), len(source))
    for (i,), row in source.items():
        got = cached[f"public.{table}:{i}"]
        assert got["id"] == int(i), got
        for column in columns:
            text = row[column]
            want = None if text is None else (int(text) if column == "n" else text)
            assert got[column] == want, (i, column, got[column], text)


def assert_verified(file: Path, spark, sink: str) -> None:
    code, report = verify(file, spark, sink)
    assert code == 0, report


def stats_of(runs: list, sink: str) -> dict[str, tuple[int, int, int]]:
    run = next(r for r in runs if r.sink == sink)
    return {s.table: (s.inserted, s.updated, s.deleted) for s in run.tables}


def make_tables(dsn: str) -> None:
    sql(
        dsn,
        "CREATE TABLE t (id int PRIMARY KEY, n int, price numeric(10,2), at timestamptz, day date, raw bytea,"
        " tags int[], doc jsonb, big text, note text)",
        f"INSERT INTO t SELECT g, g, g * 1.25, '2024-01-31 10:00:00.123456+00'::timestamptz + g * interval '1 hour',"
        f" date '2024-01-01' + g, decode(md5(g::text), 'hex'), ARRAY[g, NULL, g + 1], jsonb_build_object('g', g),"
        f" CASE WHEN g <= 3 THEN {BIG_TEXT} END, 'a:b\\c' || g FROM generate_series(1, 50) g",
        "CREATE TABLE pair (a text, b int, v text, PRIMARY KEY (a, b))",
        "INSERT INTO pair VALUES ('x:y', 1, 'one'), ('x', 1, 'two'), ('k', 2, 'three')",
    )


# ---- 0. the compare-and-set scripts themselves ---------------------------------------------------
def test_scripts_guard_positions(redis_db: str) -> None:
    """The Lua scripts on a real Redis, without Spark: position guard, tombstones, truncate marker,
    raw merge of unchanged-TOAST members (numbers and empty arrays kept byte for byte)."""
    from sinks.cache import scripts
    from sinks.cache.writer import write_partition

    client = redis.Redis.from_url(redis_db, decode_responses=True)
    sha = client.script_load(scripts.UPSERT)
    marker = "__cdc:t:t:*"

    def write(*rows: tuple[str, str, int, int, str, str]) -> tuple[int, ...]:
        feed = iter([(k, "__cdc:d:" + k, op, lsn, seq, v, u) for k, op, lsn, seq, v, u in rows])
        (counts,) = write_partition(
            feed, url=redis_db, script=scripts.UPSERT, sha=sha, truncate_key=marker, ttl=0, tomb_ttl=600
        )
        return counts

    def doc(lsn: int, seq: int, rest: str) -> str:
        return f'{{"_cdc_lsn":{lsn},"_cdc_seq":{seq},"_cdc_op":"u",{rest}}}'

    v1 = doc(100, 1, '"id":1,"big":"x\\"y[}{,","n":12345678901234567890,"a":[[1,2],[]],"z":null')
    assert write(("t:1", "c", 100, 1, v1, "")) == (1, 0, 0, 0)
    assert client.get("t:1") == v1
    v2 = doc(200, 0, '"id":1,"big":null,"n":null,"a":null,"z":5')
    assert write(("t:1", "u", 200, 0, v2, "5,6,7")) == (0, 1, 0, 0)  # members 5-7 unchanged: kept raw
    assert client.get("t:1") == doc(
        200, 0, '"id":1,"big":"x\\"y[}{,","n":12345678901234567890,"a":[[1,2],[]],"z":5'
    )
    kept = client.get("t:1")
    assert write(("t:1", "u", 200, 0, v1, ""), ("t:1", "u", 199, 9, v1, "")) == (0, 0, 0, 2)  # equal, older
    assert client.get("t:1") == kept
    # 20-digit LSNs compare exactly (Lua numbers would not)
    big = 18446744073709551000
    assert write(("t:1", "u", big, 1, doc(big, 1, '"id":1'), "")) == (0, 1, 0, 0)
    assert write(("t:1", "u", big - 1, 5, doc(big - 1, 5, '"id":1'), "")) == (0, 0, 0, 1)
    # delete: key gone, tombstone holds the position; older upserts cannot resurrect it
    assert write(("t:1", "d", big, 2, "", "")) == (0, 0, 1, 0)
    assert (
        client.get("t:1") is None
        and client.get("__cdc:d:t:1") == f"{big}:2"
        and client.ttl("__cdc:d:t:1") > 0
    )
    assert write(("t:1", "c", big, 1, doc(big, 1, '"id":1'), "")) == (0, 0, 0, 1)
    assert write(("t:1", "c", big, 3, doc(big, 3, '"id":1'), "")) == (1, 0, 0, 0)
    assert client.get("__cdc:d:t:1") is None  # the row holds the position again
    # unchanged TOAST values with nothing cached: the row stays out (a miss, never a wrong NULL)
    assert write(("t:2", "u", 300, 0, doc(300, 0, '"id":2,"big":null'), "5")) == (0, 0, 0, 1)
    assert client.get("t:2") is None
    # a kept member the cached row lacks stays absent, and the row is still written (not left stale)
    assert write(("t:6", "c", 300, 0, doc(300, 0, '"id":6,"n":1'), "")) == (1, 0, 0, 0)
    assert write(("t:6", "u", 301, 0, doc(301, 0, '"id":6,"n":2,"gone":null'), "6")) == (0, 1, 0, 0)
    assert client.get("t:6") == doc(301, 0, '"id":6,"n":2')
    # 'o': a column the source dropped: kept where cached, left out where not, never a cache miss
    assert write(("t:7", "c", 300, 0, doc(300, 0, '"id":7,"old":[9]'), "")) == (1, 0, 0, 0)
    assert write(
        ("t:7", "u", 301, 0, doc(301, 0, '"id":7,"old":null,"n":3'), "o5"),
        ("t:8", "c", 301, 1, doc(301, 1, '"id":8,"old":null,"n":4'), "o5"),
    ) == (1, 1, 0, 0)
    assert client.get("t:7") == doc(301, 0, '"id":7,"old":[9],"n":3')
    assert client.get("t:8") == doc(301, 1, '"id":8,"n":4')
    # truncate marker: older writes are refused, older rows purged, others untouched
    assert write(
        ("t:3", "c", 50, 0, doc(50, 0, '"id":3'), ""), ("t:4", "c", 70, 0, doc(70, 0, '"id":4'), "")
    ) == (2, 0, 0, 0)
    client.hset("t:h", "not", "ours")
    mark, purge = client.register_script(scripts.MARK), client.register_script(scripts.PURGE)
    assert mark(keys=[marker], args=[60, 0]) == "60:0" and mark(keys=[marker], args=[55, 0]) == "60:0"
    assert write(("t:5", "c", 59, 9, doc(59, 9, '"id":5'), "")) == (0, 0, 0, 1)
    assert purge(keys=[marker, "t:3", "t:4", "t:h", "t:nothing"]) == 1
    assert client.get("t:3") is None and client.get("t:4") is not None and client.hget("t:h", "not") == "ours"
    client.close()


# ---- 1. changes reach Redis -----------------------------------------------------------------------
def test_changes_reach_redis(pg_db: str, tmp_path: Path, spark, redis_db: str) -> None:
    make_tables(pg_db)
    hot_url = redis_db.rsplit("/", 1)[0] + "/4"
    redis.Redis.from_url(hot_url).flushdb()
    file = write_pipeline(
        tmp_path,
        pg_db,
        ["public.t", "public.pair"],
        sinks=[
            {"name": "cache", "redis": {"url": redis_db, "tables": ["public.t", "public.pair"]}},
            {
                "name": "hot",
                "redis": {"url": hot_url, "tables": ["public.t"], "key": "app:{table}:{pk}:v1", "ttl": 3600},
            },
        ],
    )
    snapshot(file)
    runs = apply_once(file, spark)
    assert stats_of(runs, "cache") == {"public.t": (50, 0, 0), "public.pair": (3, 0, 0)}
    assert_verified(file, spark, "cache")

    rows = rows_of(redis_db, "public.t:")
    assert len(rows) == 50
    one = rows["public.t:1"]
    assert list(one)[:4] == ["_cdc_lsn", "_cdc_seq", "_cdc_op", "_cdc_commit_ts"]
    assert one["_cdc_op"] == "r" and one["n"] == 1 and one["price"] == "1.25" and one["tags"] == [1, None, 2]
    assert (
        one["at"] == "2024-01-31T11:00:00.123456Z" and one["day"] == "2024-01-02" and one["doc"] == '{"g": 1}'
    )
    assert one["note"] == "a:b\\c1" and len(one["big"]) == 9600
    # composite keys joined by ':', a ':' inside a value escaped
    assert sorted(rows_of(redis_db, "public.pair:")) == [
        "public.pair:k:2",
        "public.pair:x:1",
        "public.pair:x\\:y:1",
    ]
    hot = redis.Redis.from_url(hot_url)
    assert hot.ttl("app:t:7:v1") > 3000 and len(list(hot.scan_iter(match="app:*"))) == 50
    assert hot.ttl("__cdc:t:app:t:*:v1") == -1  # the bootstrap position, kept

    big_before = one["big"]
    sql(
        pg_db,
        "UPDATE t SET n = n + 100 WHERE id IN (1, 2)",  # big is an unchanged TOAST value here
        "UPDATE t SET note = NULL, tags = '{}' WHERE id = 4",
        "DELETE FROM t WHERE id IN (5, 6)",
        "INSERT INTO t (id, n, note) VALUES (51, 51, 'new')",
        "UPDATE t SET id = 60 WHERE id = 7",  # key change: delete 7, create 60
        "ALTER TABLE t ADD COLUMN extra int DEFAULT 7",
        "UPDATE t SET n = -1 WHERE id = 8",
        "UPDATE pair SET v = 'uno' WHERE a = 'x:y'",
    )
    stream(file, pg_db)
    runs = apply_once(file, spark)
    assert stats_of(runs, "cache")["public.t"] == (2, 4, 3)  # +51 +60, ~1 ~2 ~4 ~8, -5 -6 -7
    assert_verified(file, spark, "cache")
    rows = rows_of(redis_db, "public.t:")
    assert rows["public.t:1"]["n"] == 101 and rows["public.t:1"]["big"] == big_before
    assert rows["public.t:4"]["note"] is None and rows["public.t:4"]["tags"] == []
    assert "public.t:5" not in rows and "public.t:7" not in rows and rows["public.t:60"]["n"] == 7
    assert rows["public.t:9"]["extra"] == 7 and rows["public.t:8"]["extra"] == 7  # default filled in
    client = redis.Redis.from_url(redis_db)
    assert client.get("__cdc:d:public.t:5").decode().count(":") == 1  # tombstone: position
    assert client.ttl("__cdc:d:public.t:5") > 0

    # a column added and dropped inside one cut (found by bench/chaos.py seed 4): the rows updated
    # after the drop were cached before the column existed, and still take the update
    sql(
        pg_db,
        "ALTER TABLE t ADD COLUMN brief int DEFAULT 3",
        "UPDATE t SET n = 500 WHERE id = 9",
        "ALTER TABLE t DROP COLUMN brief",
        "UPDATE t SET n = 600 WHERE id IN (1, 10)",  # 1: big is an unchanged TOAST value too
        "INSERT INTO t (id, n) VALUES (70, 70)",
    )
    stream(file, pg_db)
    apply_once(file, spark)
    assert_verified(file, spark, "cache")
    rows = rows_of(redis_db, "public.t:")
    assert (
        rows["public.t:9"]["n"] == 500 and rows["public.t:10"]["n"] == 600 and rows["public.t:70"]["n"] == 70
    )
    assert rows["public.t:1"]["n"] == 600 and rows["public.t:1"]["big"] == big_before
    assert_cache_is_source(redis_db, pg_db, columns=("n", "note"))

    # truncate, then new rows in the same batch
    sql(
        pg_db,
        "TRUNCATE t",
        "INSERT INTO t (id, n) VALUES (1, 1000), (2, 2000)",
        "DELETE FROM pair WHERE b = 2",
    )
    stream(file, pg_db)
    runs = apply_once(file, spark)
    assert stats_of(runs, "cache")["public.t"] == (2, 0, 50)
    assert sorted(rows_of(redis_db, "public.t:")) == ["public.t:1", "public.t:2"]
    assert sorted(rows_of(redis_db, "public.pair:")) == ["public.pair:x:1", "public.pair:x\\:y:1"]
    assert sorted(k.decode() for k in hot.scan_iter(match="app:*")) == ["app:t:1:v1", "app:t:2:v1"]
    assert_verified(file, spark, "cache")
    assert client.get("__cdc:t:public.t:*") is not None  # the table's truncate position
    client.close()
    hot.close()


def test_numeric_exact_and_keys_unambiguous(pg_db: str, tmp_path: Path, spark, redis_db: str) -> None:
    """numeric values are the exact text (a JSON string, as in the envelope), also inside arrays and
    for a filled-in default; key values holding `:` or `\\` never share a key, and every key reads
    back (split_pk) to the row's key values."""
    sql(
        pg_db,
        "CREATE TABLE amt (a text, b text, price numeric(10,2), prices numeric(6,2)[], free numeric,"
        " PRIMARY KEY (a, b))",
        "INSERT INTO amt VALUES ('1:1', 'x', 9.99, '{1.5,NULL}', 0.1),"
        " ('1', '1:x', 0, '{}', 12345678901234567890.123456789), ('1\\', ':x', -0.01, NULL, NULL),"
        " ('1\\:', 'x', 99999999.99, '{0.1}', 1e-20)",
    )
    file = write_pipeline(
        tmp_path,
        pg_db,
        ["public.amt"],
        sinks=[{"name": "cache", "redis": {"url": redis_db, "tables": ["public.amt"]}}],
    )
    snapshot(file)
    apply_once(file, spark)
    keys = KeyTemplate(None, "cache").for_table(TableName("public", "amt"))
    rows = rows_of(redis_db, "public.amt:")
    assert len(rows) == 4  # four distinct keys
    for key, row in rows.items():
        assert keys.pk_of(key) == [row["a"], row["b"]]
    by_pk = {(r["a"], r["b"]): r for r in rows.values()}
    assert sorted(by_pk) == [("1", "1:x"), ("1:1", "x"), ("1\\", ":x"), ("1\\:", "x")]
    one = by_pk[("1:1", "x")]
    assert one["price"] == "9.99" and one["prices"] == ["1.50", None] and one["free"] == "0.1"
    assert (
        by_pk[("1", "1:x")]["price"] == "0.00"
        and by_pk[("1", "1:x")]["free"] == "12345678901234567890.123456789"
    )
    assert by_pk[("1\\", ":x")]["price"] == "-0.01" and by_pk[("1\\:", "x")]["price"] == "99999999.99"
    assert_verified(file, spark, "cache")

    sql(
        pg_db,
        "ALTER TABLE amt ADD COLUMN fee numeric(8,3) DEFAULT 0.5",  # filled into cached rows by the follower
        "UPDATE amt SET price = 10.10 WHERE a = '1:1'",
        "INSERT INTO amt VALUES ('2:2', '', 7.07, '{2.25}', 3)",
    )
    stream(file, pg_db)
    apply_once(file, spark)
    rows = {tuple(keys.pk_of(k)): r for k, r in rows_of(redis_db, "public.amt:").items()}
    assert rows[("1:1", "x")]["price"] == "10.10" and rows[("1:1", "x")]["fee"] == "0.500"
    assert rows[("1", "1:x")]["fee"] == "0.500"  # not written since: the default filled in, exact
    assert rows[("2:2", "")]["prices"] == ["2.25"] and rows[("2:2", "")]["fee"] == "0.500"
    assert_verified(file, spark, "cache")


# ---- 2. replays and late batches ------------------------------------------------------------------
def test_replay_and_late_batch_change_nothing(pg_db: str, tmp_path: Path, spark, redis_db: str) -> None:
    from cdc.log import open_log_view
    from pipelines.apply.readers import change_reader
    from sinks.changes import TableBatch
    from sinks.registry import make_sink

    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 200) g",
    )
    file = write_pipeline(
        tmp_path,
        pg_db,
        ["public.t"],
        sinks=[{"name": "cache", "redis": {"url": redis_db, "tables": ["public.t"]}}],
    )
    pipeline = load_pipeline(file)
    snapshot(file)
    apply_once(file, spark)
    sql(
        pg_db,
        "UPDATE t SET v = 'first' WHERE id <= 100",
        "DELETE FROM t WHERE id > 190",
        "INSERT INTO t VALUES (300, 'x')",
    )
    stream(file, pg_db)
    apply_once(file, spark)
    first_cut = load_checkpoint(pipeline.state_path, "cache")
    saved = (checkpoint_dir(pipeline.state_path) / "cache.json").read_text()

    sql(
        pg_db,
        "UPDATE t SET v = 'second' WHERE id <= 50",
        "DELETE FROM t WHERE id BETWEEN 51 AND 60",
        "DELETE FROM t WHERE id = 300",
    )
    stream(file, pg_db)
    apply_once(file, spark)
    assert_verified(file, spark, "cache")
    before = dump(redis_db)

    # replay: the checkpoint goes back one cut, the same cut is applied again
    (checkpoint_dir(pipeline.state_path) / "cache.json").write_text(saved)
    runs = apply_once(file, spark)
    assert stats_of(runs, "cache") == {"public.t": (0, 0, 0)}
    assert dump(redis_db) == before

    # replay from the base: the table is started over (bootstrap) at the same snapshot
    ckpt_file = checkpoint_dir(pipeline.state_path) / "cache.json"
    data = json.loads(ckpt_file.read_text())
    data.update(cut_id=0, lsn=0, tables={}, pending=None)
    ckpt_file.write_text(json.dumps(data))
    runs = apply_once(file, spark)
    assert stats_of(runs, "cache") == {"public.t": (0, 0, 0)}
    assert dump(redis_db) == before

    # a late batch: the events of the first cuts only (older positions), handed to the sink directly
    table = TableName("public", "t")
    log = open_log_view(pipeline)
    try:
        schema = log.schema(table)
        base, end = first_cut.tables["public.t"]
        raw = change_reader(log).read_changes(spark, table, base - 1, end, schema)
        batch = TableBatch(table, schema, raw, False, None, base - 1, end, log.value_kind)
        sink = make_sink(pipeline.sink("cache"), pipeline, spark)
        sink.prepare([batch])
        changes = batch.net()
        stats = sink.apply(batch, changes, 999)
        changes.release()
        batch.release()
    finally:
        log.close()
    assert (stats.inserted, stats.updated, stats.deleted) == (0, 0, 0)
    assert dump(redis_db) == before  # 51..60 and 300 stay deleted, 1..50 stay 'second'
    assert_verified(file, spark, "cache")
    assert_cache_is_source(redis_db, pg_db)


# ---- 3. Redis killed mid-apply ------------------------------------------------------------------------
def test_redis_killed_mid_apply_then_restarted(
    pg_db: str, tmp_path: Path, spark, own_redis: LocalRedis
) -> None:
    rows = 40_000  # ~30,000 changes in the cut: ~150 EVALSHA calls of 200 rows
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text, n int)",
        f"INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, {rows}) g",
    )
    file = write_pipeline(
        tmp_path,
        pg_db,
        ["public.t"],
        sinks=[{"name": "cache", "redis": {"url": own_redis.url, "tables": ["public.t"]}}],
    )
    pipeline = load_pipeline(file)
    snapshot(file)
    apply_once(file, spark)
    sql(pg_db, "UPDATE t SET v = v || '-2', n = n * 2 WHERE id % 3 <> 0", "DELETE FROM t WHERE id % 7 = 0")
    stream(file, pg_db)
    done_before = load_checkpoint(pipeline.state_path, "cache").cut_id

    client = redis.Redis.from_url(own_redis.url)
    calls = lambda: int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))  # noqa: E731
    start = calls()
    killed = threading.Event()

    def killer() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if calls() >= start + 40:  # ~8,000 rows written, most of the cut still to go
                    own_redis.kill()
                    killed.set()
                    return
            except redis.RedisError:
                return
            time.sleep(0.005)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    with pytest.raises(SinkError) as failure:
        apply_once(file, spark)
    thread.join(5)
    client.close()
    assert killed.is_set(), "the apply finished before Redis could be killed"
    message = str(failure.value)
    assert own_redis.url in message and "fix:" in message and "Traceback" not in message, message
    assert "Py4J" not in message and "java." not in message, message
    ckpt = load_checkpoint(pipeline.state_path, "cache")
    assert ckpt.cut_id == done_before and ckpt.pending is not None

    own_redis.restart()
    apply_once(file, spark)
    ckpt = load_checkpoint(pipeline.state_path, "cache")
    assert ckpt.pending is None and ckpt.cut_id > done_before
    assert_verified(file, spark, "cache")
    assert_cache_is_source(own_redis.url, pg_db, columns=("v", "n"))  # 40,000 rows minus the deletes


# ---- 4. Redis unreachable -----------------------------------------------------------------------------
def test_unreachable_redis_is_a_clear_error(pg_db: str, tmp_path: Path, spark) -> None:
    sql(pg_db, "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a')")
    port = free_port()
    url = f"redis://:s3cr3t-pw@127.0.0.1:{port}/0"
    file = write_pipeline(
        tmp_path,
        pg_db,
        ["public.t"],
        sinks=[{"name": "cache", "redis": {"url": url, "tables": ["public.t"]}}],
    )
    snapshot(file)
    with pytest.raises(SinkError) as failure:
        apply_once(file, spark)
    message = str(failure.value)
    assert f"127.0.0.1:{port}" in message and "s3cr3t" not in message and "***" in message, message
    assert "fix:" in message and "checkpoint" in message, message
    ckpt = load_checkpoint(load_pipeline(file).state_path, "cache")
    # Redis is checked (eviction policy, markers) before a cut is started: nothing pending
    assert ckpt.cut_id == 0 and ckpt.pending is None


def test_password_reaches_executors_by_environment_not_in_tasks(
    pg_db: str, tmp_path: Path, spark, own_redis: LocalRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 item 4: a Redis with `requirepass`; the sink's URL takes the password from ${ENV}.
    No task function the driver pickles for the executors holds it (they carry the variable
    CDC_SECRET_CACHE_PASSWORD, which the local Python workers get in their environment); the
    apply still ends identical (redis-py, verify 0)."""
    password = "rp-" + secrets.token_hex(12)
    redis.Redis.from_url(own_redis.url).config_set("requirepass", password)
    authed = own_redis.url.replace("redis://", f"redis://:{password}@")
    monkeypatch.setenv("CDC_TEST_REDIS_PASSWORD", password)
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 40) g",
    )
    url = own_redis.url.replace("redis://", "redis://:${CDC_TEST_REDIS_PASSWORD}@")
    file = write_pipeline(
        tmp_path,
        pg_db,
        ["public.t"],
        sinks=[{"name": "cache", "redis": {"url": url, "tables": ["public.t"]}}],
    )
    snapshot(file)
    with shipped_tasks(monkeypatch) as shipped:
        apply_once(file, spark)
        sql(pg_db, "UPDATE t SET v = 'changed' WHERE id <= 10", "DELETE FROM t WHERE id > 35")
        stream(file, pg_db)
        runs = apply_once(file, spark)
    assert stats_of(runs, "cache") == {"public.t": (0, 10, 5)}
    assert shipped.containing("CDC_SECRET_CACHE_PASSWORD"), "the Redis writer was not among the shipped tasks"
    assert not shipped.containing(password), "the password is inside a pickled task function"
    assert any(e.get("CDC_SECRET_CACHE_PASSWORD") == password for e in shipped.environments)  # local master
    assert_verified(file, spark, "cache")
    assert_cache_is_source(authed, pg_db)


def test_bad_key_template_is_refused(pg_db: str, tmp_path: Path, spark, redis_db: str) -> None:
    sql(pg_db, "CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)")
    file = write_pipeline(
        tmp_path,
        pg_db,
        ["public.a", "public.b"],
        sinks=[{"name": "cache", "redis": {"url": redis_db, "tables": ["public.*"], "key": "{schema}:{pk}"}}],
    )
    snapshot(file)
    with pytest.raises(SinkError, match="can be the same"):
        apply_once(file, spark)
    with pytest.raises(SinkError, match="exactly once"):
        KeyTemplate("{schema}.{table}", "cache")
    with pytest.raises(SinkError, match=r"unknown placeholder\(s\) \{tenant\}"):
        KeyTemplate("{tenant}:{pk}", "cache")


# ---- 5. Delta next to Redis: only the cache fails -----------------------------------------------
def test_redis_down_fails_only_the_cache_sink(
    pg_db: str, tmp_path: Path, spark, own_redis: LocalRedis
) -> None:
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 1000) g",
    )
    file = write_pipeline(
        tmp_path,
        pg_db,
        ["public.t"],
        sinks=[
            {"name": "lake", "delta": {"path": "lake"}},
            {"name": "cache", "redis": {"url": own_redis.url, "tables": ["public.t"]}},
        ],
    )
    state = load_pipeline(file).state_path
    snapshot(file)
    apply_once(file, spark)
    sql(pg_db, "UPDATE t SET v = 'changed' WHERE id <= 100", "DELETE FROM t WHERE id > 900")
    stream(file, pg_db)
    lake_before, cache_before = load_checkpoint(state, "lake").cut_id, load_checkpoint(state, "cache").cut_id

    own_redis.stop()
    run = cdc_here("apply", file, "--once")  # in-process: exit code and output as printed
    assert run.code == 4, run.out + run.err
    assert "sink cache: FAILED" in run.out and own_redis.url in run.out and "fix:" in run.out, run.out
    assert "Traceback" not in run.out + run.err and "Py4J" not in run.out + run.err
    assert load_checkpoint(state, "lake").cut_id > lake_before
    cache = load_checkpoint(state, "cache")
    assert cache.cut_id == cache_before and cache.pending is None  # Redis checked before the cut starts

    own_redis.start()
    runs = apply_once(file, spark)
    by_sink = {r.sink: r for r in runs}
    assert by_sink["lake"].up_to_date and not by_sink["cache"].up_to_date
    assert load_checkpoint(state, "cache").pending is None
    assert_verified(file, spark, "cache")
    assert_verified(file, spark, "lake")
    assert_cache_is_source(own_redis.url, pg_db)
    lake = delta_rows(spark, tmp_path / "lake" / "public" / "t")  # plain Spark SQL on the Delta path
    assert {k: r["v"] for k, r in lake.items()} == {
        k: r["v"] for k, r in source_rows(pg_db, "public.t", ("id",)).items()
    }
