"""`cdc wait` (issue 16 item 3; README "Operations: read your own writes"): an application writes to
the source, runs `cdc wait`, then reads the follower and finds its write.

The pipeline runs as a service would: `cdc stream` as its own process, and the continuous apply
(ApplyJob.run_forever, what `cdc apply` without `--once` and `cdc run` run) on the test session's
Spark in this process's main thread. The "application" is a thread: its writes, the `cdc wait`
processes (the real console entry) and its reads of the follower with redis-py.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from pipelines.apply.job import ApplyJob
from pipelines.checkpoints import load_checkpoint
from sinks.registry import load_pipeline
from tests.harness import cdc, cdc_popen, sql, write_pipeline

pytestmark = pytest.mark.integration

HANG_GUARD_S = "600"  # only against a hang: a pass never waits that long


def cached_title(client: redis.Redis, key: int) -> str | None:
    value = client.get(f"public.items:{key}")
    return None if value is None else json.loads(value)["title"]


def test_cdc_wait_reads_your_own_writes(tmp_path: Path, pg_db: str, redis_db: str, spark) -> None:
    sql(
        pg_db,
        "CREATE TABLE items (id int PRIMARY KEY, title text)",
        "INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 50) g",
    )
    cache = {"name": "cache", "redis": {"url": redis_db, "tables": ["public.items"]}}
    file = write_pipeline(tmp_path, pg_db, ["public.items"], sinks=[cache], spark={"trigger_interval_s": 0.5})
    assert cdc("snapshot", file, "--no-progress").code == 0
    stream = cdc_popen("stream", file)
    client = redis.Redis.from_url(redis_db)
    seen: dict[str, Any] = {}
    done = threading.Event()

    def application() -> None:
        try:
            sql(pg_db, "UPDATE items SET title = 'mine' WHERE id = 7")
            seen["current"] = cdc("wait", file, "--current", "--sink", "cache", "--timeout", HANG_GUARD_S)
            seen["read after --current"] = cached_title(client, 7)
            # --lsn: the position the application reads in its own session, after its commit. The test
            # cluster runs synchronous_commit=off for speed; the README's pattern assumes the default (on),
            # under which the commit's WAL is written before pg_current_wal_lsn() is read.
            lsn = sql(
                pg_db,
                "SET synchronous_commit = on",
                "UPDATE items SET title = 'mine too' WHERE id = 8",
                "SELECT pg_current_wal_lsn()::text",
            )
            seen["lsn"] = lsn[0][0]
            seen["by lsn"] = cdc("wait", file, "--lsn", seen["lsn"], "--timeout", HANG_GUARD_S)
            seen["read after --lsn"] = cached_title(client, 8)
        except BaseException as exc:  # reported by the main thread
            seen["error"] = exc
        finally:
            done.set()

    app = threading.Thread(target=application)
    app.start()
    try:
        ApplyJob(load_pipeline(file), spark).run_forever(keep_going=lambda: not done.is_set())
    finally:
        done.wait(int(HANG_GUARD_S))
        app.join()
        stream.send_signal(signal.SIGTERM)
        stream.communicate(timeout=120)
    assert "error" not in seen, seen
    assert seen["current"].code == 0, seen["current"]
    assert "every follower (cache) has applied everything committed up to" in seen["current"].out
    assert seen["read after --current"] == "mine"
    assert seen["by lsn"].code == 0, seen["by lsn"]
    assert seen["read after --lsn"] == "mine too"

    # Nothing streams any more: a new write cannot arrive; --timeout 0 answers at once with exit 1.
    sql(pg_db, "UPDATE items SET title = 'late' WHERE id = 9")
    late = cdc("wait", file, "--current", "--timeout", "0")
    assert late.code == 1, late
    at = load_checkpoint(load_pipeline(file).state_path, "cache")
    assert "error: not every follower applied" in late.err and "sink cache at " in late.err, late.err
    assert f"(cut {at.cut_id})" in late.err and "nothing is streaming the source into the log" in late.err, (
        late.err
    )
    assert cached_title(client, 9) == "item 9"
    # a position the follower has passed: at once, exit 0
    assert cdc("wait", file, "--lsn", seen["lsn"], "--timeout", "0").code == 0
    # usage errors: exit 2 with the fix
    for args in (
        [],
        ["--lsn", "nonsense"],
        ["--lsn", seen["lsn"], "--current"],
        ["--current", "--sink", "nope"],
    ):
        bad = cdc("wait", file, *args)
        assert bad.code == 2 and "error:" in bad.err and "Traceback" not in bad.err, (args, bad)
    client.close()
