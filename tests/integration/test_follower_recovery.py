"""Followers that lost their data, and `cdc reset` (issue 23 items 1-4, 6).

Every test removes data behind the tool's back with the engine's own client (redis-py FLUSHALL,
the tantivy directory, the OpenSearch index, the Delta table directory), then shows the follower
rebuilt by the next apply (or stopped with a remedy the test follows as printed), read back with
an independent reader (tests/fixtures/readers.py) and `cdc verify` exit 0.

CLI commands run in-process through click's test runner on the session's SparkSession: the same
code path (argument parsing, messages, exit codes) as a terminal, without a JVM per command.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from deltalake import DeltaTable

from cdc.ground.tables import TableName
from pipelines.checkpoints import checkpoint_path, load_checkpoint
from pipelines.cli import cli
from pipelines.devservices.redis import LocalRedis
from sinks.delta.paths import table_path
from sinks.registry import load_pipeline
from tests.fixtures.lake import cut_operations
from tests.fixtures.readers import delta_rows, opensearch_docs, redis_rows, tantivy_docs
from tests.harness import (
    cdc,
    cdc_popen,
    source_rows,
    sql,
    stop_process,
    stream_changes,
    verify,
    wait_for,
    write_pipeline,
)

pytestmark = pytest.mark.integration

ROWS = 300
LAKE = {"name": "lake", "delta": {"path": "lake"}}


def make_items(dsn: str) -> None:
    sql(
        dsn,
        "CREATE TABLE items (id int PRIMARY KEY, title text, n int)",
        f"INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, {ROWS}) g",
    )


def run(*args: str | Path) -> tuple[int, str]:
    """`cdc ARGS` in-process: (exit code, stdout and stderr)."""
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.output


def follow(fix: str) -> None:
    """Run every `cdc ...` command quoted in a `fix:` text, in order, as printed; each must succeed."""
    commands = re.findall(r"`(cdc [^`]+)`", fix)
    assert commands, fix
    for command in commands:
        code, out = run(*shlex.split(command)[1:])
        assert code == 0, (command, out)


def fix_line(output: str) -> str:
    return next(line for line in output.splitlines() if "fix:" in line)


def snapshot_and_apply(file: Path) -> None:
    code, out = run("snapshot", file, "--no-progress")
    assert code == 0, out
    code, out = run("apply", file, "--once")
    assert code == 0, out


def cache_sink(url: str, **extra: str) -> dict:
    """A Redis follower `cache` of public.items (`extra`: sink settings such as on_lost)."""
    return {"name": "cache", **extra, "redis": {"url": url, "tables": ["public.items"]}}


def items_applied(tmp_path: Path, dsn: str, *sinks: dict) -> Path:
    """make_items, then the pipeline file with these followers, snapshotted and applied."""
    make_items(dsn)
    file = write_pipeline(tmp_path, dsn, ["public.items"], sinks=list(sinks))
    snapshot_and_apply(file)
    return file


def change_and_stream(dsn: str, file: Path) -> None:
    sql(dsn, "UPDATE items SET title = 'changed' WHERE id IN (1, 2)", "DELETE FROM items WHERE id = 3")
    stream_changes(file, dsn)


def source(dsn: str) -> dict:
    return source_rows(dsn, "items", ["id"])


def rebuilt_by_the_next_apply(file: Path, dsn: str, client: redis.Redis, spark) -> None:
    """`cdc apply --once` of the cache follower finds the loss and rebuilds: read back with redis-py
    equal to the source, and `cdc verify`."""
    code, out = run("apply", file, "--once", "--sink", "cache")
    assert code == 0, out
    assert "lost data it had applied" in out and "rebuilding from the log's base" in out, out
    cached = redis_rows(client, "public.items:")
    want = source(dsn)
    assert len(cached) == len(want) == ROWS - 1
    assert {(str(v["id"]),): v["title"] for v in cached.values()} == {k: r["title"] for k, r in want.items()}
    assert verify(file, spark, "cache")[0] == 0


# ---- Redis ---------------------------------------------------------------------------------------
def test_redis_flushed_is_rebuilt_and_status_says_so(
    tmp_path: Path, pg_db: str, redis_db: str, spark
) -> None:
    file = items_applied(tmp_path, pg_db, cache_sink(redis_db))
    client = redis.Redis.from_url(redis_db)
    assert len(redis_rows(client, "public.items:")) == ROWS
    client.flushall()  # a restart without persistence looks the same
    change_and_stream(pg_db, file)

    rebuilt_by_the_next_apply(file, pg_db, client, spark)

    code, out = run("status", file)
    assert code == 0, out
    assert "follower cache lost data at" in out and "rebuilt from the log's base" in out, out
    assert "up to date with the log" in out, out


def test_redis_flushed_with_on_lost_stop_follows_the_fix(
    tmp_path: Path, pg_db: str, redis_db: str, spark
) -> None:
    file = items_applied(tmp_path, pg_db, cache_sink(redis_db, on_lost="stop"))
    client = redis.Redis.from_url(redis_db)
    client.flushall()
    change_and_stream(pg_db, file)

    code, out = run("apply", file, "--once")
    assert code == 4, out
    assert "lost data it had applied" in out and "on_lost: stop" in out, out
    assert redis_rows(client, "public.items:") == {}  # nothing applied on top of the loss
    code, status = run("status", file)
    assert "LOST DATA" in status and "cdc reset" in status, status

    follow(fix_line(out))  # cdc reset ... --rebuild --yes, then cdc apply ... --once --sink cache
    assert len(redis_rows(client, "public.items:")) == ROWS - 1
    assert verify(file, spark, "cache")[0] == 0
    code, status = run("status", file)
    assert "LOST DATA" not in status, status


def test_redis_flushed_during_an_apply_is_not_covered_up(
    tmp_path: Path, pg_db: str, redis_db: str, spark, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis wiped while a cut is applied, its rows written and its markers not yet: the markers
    must not then be written over the loss (the follower would look whole and stay empty). The cut
    fails naming the loss, leaves no marker, and the next apply rebuilds the table."""
    file = items_applied(tmp_path, pg_db, cache_sink(redis_db))
    client = redis.Redis.from_url(redis_db)
    change_and_stream(pg_db, file)
    held = tmp_path / "held"
    monkeypatch.setenv("CDC_PAUSE", "apply:after-merge")  # pipelines/faults.py: holds the apply there
    monkeypatch.setenv("CDC_PAUSE_FILE", str(held))
    done: list[tuple[int, str]] = []
    applying = threading.Thread(
        target=lambda: done.append(run("apply", file, "--once", "--sink", "cache")), daemon=True
    )
    applying.start()
    wait_for("the apply held with the cut's rows written", held.exists, timeout=240)
    assert redis_rows(client, "public.items:")["public.items:1"]["title"] == "changed"
    client.flushall()
    monkeypatch.delenv("CDC_PAUSE")
    held.unlink()
    applying.join(timeout=240)
    [(code, out)] = done
    assert code == 4, out
    assert "lost this follower's data while cut" in out and "no marker was written over the loss" in out, out
    assert client.keys("__cdc:m:*") == []

    rebuilt_by_the_next_apply(file, pg_db, client, spark)


# ---- search --------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["tantivy", "opensearch"])
def test_search_index_deleted_is_rebuilt(tmp_path: Path, pg_db: str, engine: str, request, spark) -> None:
    make_items(pg_db)
    settings: dict = {"engine": engine, "tables": ["public.items"]}
    if engine == "opensearch":
        node = request.getfixturevalue("opensearch")
        settings |= {
            "hosts": [node.url],
            "index_prefix": f"rec{abs(hash(request.node.name)) % 10**6}",
            "replicas": 0,
        }
    else:
        settings["path"] = str(tmp_path / "search")
    lake = {"name": "lake", "delta": {"path": str(tmp_path / "lake")}}
    file = write_pipeline(tmp_path, pg_db, ["public.items"], sinks=[{"name": "s", "search": settings}, lake])
    snapshot_and_apply(file)
    lake_before = load_checkpoint(load_pipeline(file).state_path, "lake").cut_id

    if engine == "opensearch":
        from opensearchpy import OpenSearch

        client = OpenSearch([settings["hosts"][0]])
        alias = f"{settings['index_prefix']}.public.items"
        client.indices.delete(index=list(client.indices.get_alias(index=alias)))  # the index behind the alias
        client.close()

        def docs() -> dict:
            return opensearch_docs(settings["hosts"][0], alias)
    else:
        shutil.rmtree(tmp_path / "search")

        def docs() -> dict:
            return tantivy_docs(tmp_path / "search" / "public" / "items")

    change_and_stream(pg_db, file)
    code, out = run("apply", file, "--once", "--sink", "s")
    assert code == 0, out
    assert "sink s: the follower lost data it had applied (public.items: the table is gone" in out, out
    got = docs()
    want = source(pg_db)
    assert len(got) == len(want) == ROWS - 1
    assert {(str(d["id"]),): d["title"] for d in got.values()} == {k: r["title"] for k, r in want.items()}
    assert verify(file, spark, "s")[0] == 0
    if (
        engine == "tantivy"
    ):  # the direct reader of docs/follower-search.md, as written (only the path changed)
        readme = (Path(__file__).resolve().parents[2] / "docs" / "follower-search.md").read_text()
        block = readme.split("*Reading a tantivy follower without `cdc`*", 1)[1].split("```python\n", 1)[1]
        code = block.split("```", 1)[0].replace(
            ".cdc/shop/search/public/customers", str(tmp_path / "search/public/items")
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
        )
        assert done.returncode == 0, done.stderr
        printed = done.stdout.splitlines()
        assert len(printed) == ROWS - 1 and "'title': 'changed'" in done.stdout, done.stdout[:500]
    # the other follower was not touched: it applies the change on its own next run
    assert load_checkpoint(load_pipeline(file).state_path, "lake").cut_id == lake_before


@pytest.mark.parametrize("engine", ["opensearch", "tantivy"])
def test_rejected_document_fix_rebuilds_only_that_follower(
    tmp_path: Path, pg_db: str, engine: str, request, spark
) -> None:
    """A value the configured field type cannot take stops the follower; the fix line, followed as
    printed once the cause is fixed, rebuilds only it (no `cdc snapshot`: the log keeps its base)."""
    make_items(pg_db)
    sql(pg_db, "ALTER TABLE items ADD COLUMN code text", "UPDATE items SET code = id::text")
    settings: dict = {"engine": engine, "tables": ["public.items"]}
    if engine == "opensearch":
        node = request.getfixturevalue("opensearch")
        prefix = f"rej{abs(hash(request.node.name)) % 10**6}"
        settings |= {"hosts": [node.url], "index_prefix": prefix, "replicas": 0}

        def docs() -> dict:
            return opensearch_docs(node.url, f"{prefix}.public.items")
    else:
        settings["path"] = str(tmp_path / "search")

        def docs() -> dict:
            return tantivy_docs(tmp_path / "search" / "public" / "items")

    def pipeline(code_field: str) -> Path:
        fields = {"fields": {"public.items": {"code": code_field}}}
        return write_pipeline(
            tmp_path, pg_db, ["public.items"], sinks=[{"name": "s", "search": settings | fields}]
        )

    file = pipeline("long")  # the codes were numbers so far
    snapshot_and_apply(file)
    base = load_pipeline(file).state_path
    sql(
        pg_db, "UPDATE items SET code = 'n/a' WHERE id = 4", "UPDATE items SET title = 'changed' WHERE id = 5"
    )
    stream_changes(file, pg_db)
    code, out = run("apply", file, "--once", "--sink", "s")
    assert code == 4, out
    assert "rejected" in out and "key id=4" in out, out
    fix = fix_line(out)
    assert "cdc snapshot" not in fix and "--sink s --rebuild --yes" in fix, fix
    assert load_checkpoint(base, "s").pending, "the batch must not be recorded as applied"

    pipeline("keyword")  # the cause: `fields:` made to fit the values
    follow(fix)  # cdc reset FILE --sink s --rebuild --yes, then cdc apply FILE --once --sink s
    got = {(str(d["id"]),): (d["title"], d["code"]) for d in docs().values()}
    want = source(pg_db)
    assert len(got) == ROWS and got == {k: (r["title"], r["code"]) for k, r in want.items()}
    assert got[("4",)] == ("item 4", "n/a") and got[("5",)] == ("changed", "5")
    assert verify(file, spark, "s")[0] == 0


# ---- Delta ---------------------------------------------------------------------------------------
def test_delta_table_deleted_is_rebuilt(tmp_path: Path, pg_db: str, spark) -> None:
    file = items_applied(tmp_path, pg_db, LAKE)
    path = table_path(tmp_path / "lake", TableName("public", "items"))
    props = spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
    marker = json.loads(next(r["value"] for r in props if r["key"] == "cdc.follower"))
    assert marker["sink"] == "lake" and marker["pipeline"] == "test"
    shutil.rmtree(path)
    change_and_stream(pg_db, file)
    code, out = run("apply", file, "--once")
    assert code == 0, out
    assert "lost data it had applied" in out, out
    rows = delta_rows(spark, path)
    want = source(pg_db)
    assert {k: r["title"] for k, r in rows.items()} == {k: r["title"] for k, r in want.items()}
    assert verify(file, spark)[0] == 0


# ---- checkpoints ---------------------------------------------------------------------------------
def test_corrupt_checkpoint_named_with_a_working_fix(
    tmp_path: Path, pg_db: str, redis_db: str, spark
) -> None:
    file = items_applied(tmp_path, pg_db, cache_sink(redis_db), LAKE)
    ckpt = checkpoint_path(load_pipeline(file).state_path, "cache")
    ckpt.write_text(ckpt.read_text()[:20])  # truncated, as a full disk or a hand edit leaves it

    code, out = run("status", file)
    assert code == 4, out
    assert f"follower cache (redis): ERROR: sink cache: its checkpoint {ckpt} cannot be read" in out, out
    assert "follower lake (delta): at" in out, out  # the others are still shown
    code, out = run("apply", file, "--once")
    assert code == 4, out
    assert str(ckpt) in out and "keeps its checkpoint" not in out, out
    assert "sink lake: up to date" in out, out
    change_and_stream(pg_db, file)
    follow(fix_line(out))  # cdc reset ... --sink cache --rebuild --yes
    code, out = run("apply", file, "--once", "--sink", "cache", "--sink", "lake")  # repeated --sink: both
    assert code == 0, out
    assert "sink cache: applied" in out and "sink lake: applied" in out, out
    assert len(redis_rows(redis.Redis.from_url(redis_db), "public.items:")) == ROWS - 1
    assert verify(file, spark, "cache")[0] == 0


def test_reset_to_cut_brings_back_what_a_restore_lost(
    tmp_path: Path, pg_db: str, redis_db: str, spark
) -> None:
    file = items_applied(tmp_path, pg_db, cache_sink(redis_db), LAKE)
    state = load_pipeline(file).state_path
    first = load_checkpoint(state, "cache").cut_id
    change_and_stream(pg_db, file)
    code, out = run("apply", file, "--once")
    assert code == 0, out
    lake = load_checkpoint(state, "lake")
    # rows changed after the first cut are lost by hand (a restore of the rows only: the markers stay)
    client = redis.Redis.from_url(redis_db)
    client.delete("public.items:1", "public.items:2")

    code, out = run("reset", file, "--sink", "cache", "--to-cut", str(first))
    assert code == 2 and "no terminal" in out and "fix: pass --yes" in out, out
    code, out = run("reset", file, "--sink", "cache", "--to-cut", str(first + 100), "--yes")
    assert code == 2 and "would skip changes" in out, out
    code, out = run("reset", file, "--sink", "cache", "--to-cut", str(first), "--yes")
    assert code == 0 and f"rewound from cut {lake.cut_id} to cut {first}" in out, out
    assert load_checkpoint(state, "lake") == lake  # no other follower touched

    code, out = run("apply", file, "--once", "--sink", "cache")
    assert code == 0, out
    cached = redis_rows(client, "public.items:")
    assert cached["public.items:1"]["title"] == "changed" and cached["public.items:2"]["title"] == "changed"
    assert "public.items:3" not in cached and len(cached) == ROWS - 1
    assert verify(file, spark, "cache")[0] == 0

    # rows changed by hand, markers intact: verify finds it, and its fix works as printed
    client.delete("public.items:5")
    client.set("public.items:6", client.get("public.items:6").replace(b'"item 6"', b'"tampered"'))
    code, report = verify(file, spark, "cache")
    assert code == 1 and "missing 1, extra 0, different 1" in report, report
    follow(fix_line(report))
    assert verify(file, spark, "cache")[0] == 0
    assert load_checkpoint(state, "lake") == lake

    # The Delta follower appends a cut of inserts alone (sinks/delta/sink.py _appends). Rewound to the
    # cut before it, the follower holds rows the next range inserts again: it MERGEs (the table's
    # marker ends after its checkpoint), no row twice.
    path = table_path(tmp_path / "lake", TableName("public", "items"))
    sql(pg_db, "INSERT INTO items SELECT g, 'new ' || g, g FROM generate_series(1001, 1010) g")
    stream_changes(file, pg_db)
    code, out = run("apply", file, "--once", "--sink", "lake")
    assert code == 0, out
    appended = load_checkpoint(state, "lake").cut_id
    assert cut_operations(path, appended) == ["WRITE"]
    code, out = run("reset", file, "--sink", "lake", "--to-cut", str(lake.cut_id), "--yes")
    assert code == 0, out
    sql(pg_db, "INSERT INTO items SELECT g, 'new ' || g, g FROM generate_series(1011, 1015) g")
    stream_changes(file, pg_db)
    code, out = run("apply", file, "--once", "--sink", "lake")
    assert code == 0, out
    merged = load_checkpoint(state, "lake").cut_id
    assert merged > appended and cut_operations(path, merged) == ["MERGE"]
    rows = delta_rows(spark, path)  # delta-rs: fails on a key held twice
    assert {k: r["title"] for k, r in rows.items()} == {k: r["title"] for k, r in source(pg_db).items()}


def test_reset_to_cut_on_the_kafka_log(tmp_path: Path, pg_db: str, redis_db: str, kafka, spark) -> None:
    """`cdc reset --to-cut N` with `log: kafka`: cut N is read back from the cuts topic, and the
    next apply re-reads the table topic after it (issue 23 item 3)."""
    make_items(pg_db)
    log = {"kafka": {"bootstrap_servers": kafka.bootstrap, "topic_prefix": f"rw{uuid.uuid4().hex[:8]}"}}
    file = write_pipeline(tmp_path, pg_db, ["public.items"], log=log, sinks=[cache_sink(redis_db)])
    snapshot_and_apply(file)
    state = load_pipeline(file).state_path
    first = load_checkpoint(state, "cache").cut_id
    change_and_stream(pg_db, file)
    code, out = run("apply", file, "--once")
    assert code == 0, out
    latest = load_checkpoint(state, "cache").cut_id
    assert latest > first, out
    client = redis.Redis.from_url(redis_db)
    client.delete("public.items:1", "public.items:2")  # lost after cut `first`, markers intact

    code, out = run("reset", file, "--sink", "cache", "--to-cut", str(first), "--yes")
    assert code == 0 and f"rewound from cut {latest} to cut {first}" in out, out
    code, out = run("apply", file, "--once", "--sink", "cache")
    assert code == 0, out
    cached = {k: v["title"] for k, v in redis_rows(client, "public.items:").items()}
    assert cached == {f"public.items:{k[0]}": r["title"] for k, r in source(pg_db).items()}
    assert cached["public.items:1"] == "changed" and "public.items:3" not in cached
    assert verify(file, spark, "cache")[0] == 0
    client.close()


def test_status_follower_at_latest_cut_is_up_to_date(tmp_path: Path, pg_db: str, spark) -> None:
    """A table the log holds but the file no longer names is not a backlog (issue 23 item 9)."""
    make_items(pg_db)
    sql(pg_db, "CREATE TABLE other (id int PRIMARY KEY)", "INSERT INTO other SELECT generate_series(1, 5)")
    lake = [{"name": "lake", "delta": {"path": "lake"}}]
    file = write_pipeline(tmp_path, pg_db, ["public.items", "public.other"], sinks=lake)
    code, out = run("snapshot", file, "--no-progress")
    assert code == 0, out
    file = write_pipeline(tmp_path, pg_db, ["public.items"], sinks=lake)  # public.other taken out of the file
    code, out = run("apply", file, "--once")
    assert code == 0, out
    code, out = run("status", file, "--json")
    assert code == 0, out
    (follower,) = json.loads(out)["followers"]
    assert follower["events_behind_log"] == 0, follower
    code, out = run("status", file)
    assert "follower lake (delta): at" in out and "up to date with the log" in out, out


# ---- Redis eviction (issue 23 item 5) ------------------------------------------------------------
def test_redis_that_may_evict_is_refused_with_a_fix_that_works(
    tmp_path: Path, pg_db: str, own_redis: LocalRedis, spark
) -> None:
    make_items(pg_db)
    sink = {"name": "cache", "redis": {"url": own_redis.url, "tables": ["public.items"]}}
    file = write_pipeline(tmp_path, pg_db, ["public.items"], sinks=[sink])
    client = redis.Redis.from_url(own_redis.url)
    client.config_set("maxmemory", 64 * 1024 * 1024)
    client.config_set("maxmemory-policy", "allkeys-lru")

    code, out = run("validate", file)
    assert code == 3, out
    assert "FAIL sink cache: Redis at" in out and "maxmemory-policy is allkeys-lru" in out, out
    code, out = run("snapshot", file, "--no-progress")
    assert code == 0, out
    code, out = run("apply", file, "--once")
    assert code == 3, out
    assert "maxmemory-policy is allkeys-lru" in out and "CONFIG SET maxmemory-policy noeviction" in out, out
    assert redis_rows(client, "public.items:") == {}  # refused before anything was written

    # the fix as printed: `CONFIG SET maxmemory-policy noeviction` on that Redis
    command = re.search(r"`(CONFIG SET [^`]+)`", fix_line(out)).group(1).split()
    client.execute_command(*command)
    code, out = run("validate", file)
    assert code == 0 and "ok   sink cache: Redis at" in out, out
    code, out = run("apply", file, "--once")
    assert code == 0, out
    assert len(redis_rows(client, "public.items:")) == ROWS
    assert verify(file, spark, "cache")[0] == 0

    # or accept it is a cache: allow_eviction: true
    client.config_set("maxmemory-policy", "allkeys-lru")
    sink["redis"]["allow_eviction"] = True
    file = write_pipeline(tmp_path, pg_db, ["public.items"], sinks=[sink])
    change_and_stream(pg_db, file)
    code, out = run("apply", file, "--once")
    assert code == 0, out
    code, out = run("validate", file)
    assert code == 0 and "(accepted: allow_eviction: true)" in out, out


def test_redis_out_of_memory_is_one_line_with_the_fix(
    tmp_path: Path, pg_db: str, own_redis: LocalRedis, spark
) -> None:
    make_items(pg_db)
    sql(pg_db, f"INSERT INTO items SELECT g, repeat('x', 2000), g FROM generate_series({ROWS + 1}, 3000) g")
    sink = {"name": "cache", "redis": {"url": own_redis.url, "tables": ["public.items"]}}
    file = write_pipeline(tmp_path, pg_db, ["public.items"], sinks=[sink])
    client = redis.Redis.from_url(own_redis.url)
    client.config_set("maxmemory", 2 * 1024 * 1024)
    client.config_set("maxmemory-policy", "noeviction")
    code, out = run("snapshot", file, "--no-progress")
    assert code == 0, out
    done = cdc("apply", file, "--once")  # a process of its own: what the JVM prints reaches its stderr
    out = done.out + done.err
    assert done.code == 4, out
    assert "OutOfMemoryError" in out and "CONFIG SET maxmemory" in fix_line(out), out
    # no Java or Python stack: one line for the sink, with the fix
    assert not re.search(r"^\s+at [\w.$]+\(", out, re.M) and "Traceback" not in out, out
    assert len([line for line in done.out.splitlines() if line.startswith("sink cache")]) == 1, out
    client.config_set("maxmemory", 0)  # the fix: more memory
    code, out = run("apply", file, "--once")
    assert code == 0, out
    assert verify(file, spark, "cache")[0] == 0


# ---- lost while the source is idle (issue 34 item 1) ---------------------------------------------
def lost_while_idle(file: Path, sink: str, what: str, behind: int = ROWS) -> None:
    """With nothing new in the log, `cdc status` finds the loss (exit 1, the fix), and the fix it
    prints (`cdc apply --once --sink ...`) rebuilds the follower; status is then clean again.
    `behind`: the rebuild's backlog, every event of the table from its base."""
    code, out = run("status", file)
    assert code == 1, out
    assert f"follower {sink} LOST DATA it had applied (found now): public.items ({what}" in out, out
    assert f"fix: run `cdc apply {file} --once --sink {sink}`: it rebuilds the lost tables" in out, out
    assert f"{behind:,} events behind the log" in out, out
    code, out = run("status", file, "--json")
    assert code == 1, out
    (follower,) = json.loads(out)["followers"]
    assert follower["self_check"]["lost"]["public.items"].startswith(what), follower
    assert follower["events_behind_log"] == behind, follower

    follow(fix_line(run("status", file)[1]))  # cdc apply ... --once --sink NAME, as printed
    code, out = run("status", file)
    assert code == 0, out
    assert "LOST DATA" not in out and f"follower {sink} lost data at" in out, out  # the rebuild, recorded
    assert "up to date with the log" in out, out


def test_redis_flushed_while_idle_is_found_by_status_and_apply(
    tmp_path: Path, pg_db: str, redis_db: str, spark
) -> None:
    file = items_applied(tmp_path, pg_db, cache_sink(redis_db))
    client = redis.Redis.from_url(redis_db)
    code, out = run("status", file)
    assert code == 0 and "LOST DATA" not in out, out  # markers read by status match the checkpoint
    client.flushall()
    lost_while_idle(file, "cache", "its marker is gone from the engine")
    assert len(redis_rows(client, "public.items:")) == ROWS
    assert verify(file, spark, "cache")[0] == 0

    client.flushall()  # and `apply --once` itself, with no new cut, notices and restores
    code, out = run("apply", file, "--once", "--sink", "cache")
    assert code == 0, out
    assert "lost data it had applied (public.items: its marker is gone" in out, out
    assert "up to date" not in out, out
    cached = redis_rows(client, "public.items:")
    assert {(str(v["id"]),): v["title"] for v in cached.values()} == {
        k: r["title"] for k, r in source(pg_db).items()
    }
    assert verify(file, spark, "cache")[0] == 0
    code, out = run("apply", file, "--once", "--sink", "cache")
    assert code == 0 and "sink cache: up to date" in out, out


def test_delta_table_deleted_while_idle_is_found_by_status_and_apply(
    tmp_path: Path, pg_db: str, spark
) -> None:
    file = items_applied(tmp_path, pg_db, LAKE)
    path = table_path(tmp_path / "lake", TableName("public", "items"))
    code, out = run("status", file)
    assert code == 0 and "LOST DATA" not in out, out  # the marker read from _delta_log matches
    shutil.rmtree(path)
    lost_while_idle(file, "lake", "the table is gone from the engine")
    rows = delta_rows(spark, path)  # delta-rs
    assert {k: r["title"] for k, r in rows.items()} == {k: r["title"] for k, r in source(pg_db).items()}
    assert len(rows) == ROWS
    assert verify(file, spark)[0] == 0

    shutil.rmtree(path)
    code, out = run("apply", file, "--once")
    assert code == 0, out
    assert "sink lake: the follower lost data it had applied (public.items: the table is gone" in out, out
    assert len(delta_rows(spark, path)) == ROWS
    assert verify(file, spark)[0] == 0

    # One commit per written table per cut (issue 37 item 1): the MERGE carries the cut as Delta's
    # txn version, the table property `cdc.follower` only the fixed parts (made with the table).
    backup = tmp_path / "backup"
    shutil.copytree(path, backup)  # the table as of this cut, restored below
    state = load_pipeline(file).state_path
    before = delta_commits(path)
    change_and_stream(pg_db, file)
    code, out = run("apply", file, "--once")
    assert code == 0, out
    assert delta_commits(path) == before + 1, out
    ckpt = load_checkpoint(state, "lake")
    app_id = f"cdc:test:lake:{log_id(file)}"
    assert DeltaTable(str(path)).transaction_version(app_id) == ckpt.cut_id  # delta-rs reads the position
    assert ckpt.written["public.items"] == ckpt.cut_id
    marker = json.loads(DeltaTable(str(path)).metadata().configuration["cdc.follower"])
    assert "end" not in marker and "cut_id" not in marker and marker["pipeline"] == "test", marker
    assert run("status", file)[0] == 0
    # idle: no cut, no commit
    assert run("apply", file, "--once")[0] == 0 and delta_commits(path) == before + 1

    # restored from the older backup while idle: its commits carry an older cut than the checkpoint's
    shutil.rmtree(path)
    shutil.copytree(backup, path)
    lost_while_idle(file, "lake", "the engine holds the table with commits up to cut", behind=ROWS + 3)
    assert {k: r["title"] for k, r in delta_rows(spark, path).items()} == {
        k: r["title"] for k, r in source(pg_db).items()
    }
    assert verify(file, spark)[0] == 0

    # replaced by another pipeline's table at the same path (its marker says so)
    DeltaTable(str(path)).alter.set_table_properties(
        {"cdc.follower": json.dumps({**marker, "pipeline": "other"})}, raise_if_not_exists=False
    )
    lost_while_idle(file, "lake", "the engine holds pipeline other sink lake there", behind=ROWS + 3)
    assert verify(file, spark)[0] == 0


def delta_commits(path: Path) -> int:
    return len(list((path / "_delta_log").glob("*.json")))


def log_id(file: Path) -> str:
    from cdc.log import open_log_view

    log = open_log_view(load_pipeline(file))
    try:
        return log.log_id
    finally:
        log.close()


def test_cdc_run_finds_a_follower_flushed_while_idle(
    tmp_path: Path, pg_db: str, redis_db: str, spark
) -> None:
    """A running `cdc run` with an idle source rebuilds a flushed Redis follower by itself, within
    spark.follower_check_interval_s (1 s here)."""
    make_items(pg_db)
    sql(pg_db, "CREATE TABLE unfollowed(n int)")
    file = write_pipeline(
        tmp_path,
        pg_db,
        ["public.items"],
        sinks=[cache_sink(redis_db)],
        spark={"master": "local[1]", "trigger_interval_s": 1, "follower_check_interval_s": 1},
    )
    client = redis.Redis.from_url(redis_db)
    proc = cdc_popen("run", file)
    failed: AssertionError | None = None
    try:
        until(lambda: len(redis_rows(client, "public.items:")) == ROWS, proc, "the first apply")
        # the rows are in before the cut's marker and checkpoint: a flush in between would leave a
        # marker written after it (an engine wiped during an apply, not while idle)
        # The stream's first cut after the snapshot's carries the table's schema, so its apply writes
        # the table's marker again (with no rows): a flush during that apply would be hidden by it.
        # Wait until the follower's checkpoint is past it: later cuts of the idle source write none.
        checkpoint = tmp_path / ".cdc" / "test" / "checkpoints" / "cache.json"
        until(lambda: cut_saved(checkpoint), proc, "the checkpoint")
        first = json.loads(checkpoint.read_text())["cut_id"]

        def past_the_first_stream_cut() -> bool:
            sql(pg_db, "INSERT INTO unfollowed VALUES (1)")  # the WAL moves on: the stream cuts again
            return cut_saved(checkpoint, after=first + 1)

        until(past_the_first_stream_cut, proc, "the stream's first cut applied")
        until(lambda: run("status", file)[0] == 0, proc, "status clean")
        client.flushall()
        until(lambda: len(redis_rows(client, "public.items:")) == ROWS, proc, "the rebuild")
    except AssertionError as exc:
        failed = exc
    finally:
        # SIGTERM, not SIGKILL, also when a step above failed: cdc run stops its stream child, which
        # would otherwise outlive it holding the output pipes (communicate() would never return)
        out, err = stop_process(proc, timeout=180)
    assert failed is None, f"{failed}\ncdc run printed:\n{out}\n{err}"  # what it did meanwhile
    assert proc.returncode == 0, (out, err)
    assert "sink cache: the follower lost data it had applied (public.items: its marker is gone" in out, out
    assert verify(file, spark, "cache")[0] == 0


def cut_saved(checkpoint: Path, after: int = 0) -> bool:
    """The follower's checkpoint records an applied cut (past cut `after`) with none pending."""
    try:
        saved = json.loads(checkpoint.read_text())
    except (FileNotFoundError, ValueError):
        return False
    return (saved.get("cut_id") or 0) > after and saved.get("pending") is None


def until(check, proc: subprocess.Popen, what: str, timeout: float = 240) -> None:
    """Poll `check()` until true; fail at once if `proc` exits."""
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"cdc run exited {proc.returncode} before {what}:\n{out}\n{err}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.5)
