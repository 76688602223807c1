"""Issue 33.1 on real PostgreSQL, Spark, Delta and Redis: the local log keeps the cuts a lagging
follower still needs (many small transactions, each its own cut, far past the newest-cuts bound),
so `cdc reset --to-cut` reaches back to it and the follower applies fine; and `cdc status` (text,
--json) and the metrics show a failing follower's last error and since when."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time

import pytest

from cdc.ground import logsetup
from cdc.log import open_log
from pipelines.metrics import StateCollector
from pipelines.status import collect_status, print_status
from sinks.registry import load_pipeline
from tests.fixtures.capture import start_stream, stop_stream
from tests.fixtures.lake import LAKE, apply, apply_ok, ckpt, make_pipe, snapshot, stream, verified
from tests.fixtures.workload import Writer, make_table
from tests.harness import cdc

pytestmark = pytest.mark.integration

KEEP = 10  # log.local.keep_cuts: the newest-cuts bound, small so a few dozen transactions pass it


def _latest_cut_id(pipe) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{pipe.log / 'log.db'}?mode=ro", uri=True)) as db:
        return db.execute("SELECT coalesce(max(id), 0) FROM cuts").fetchone()[0]


def test_a_lagging_follower_holds_its_cuts_and_status_shows_errors(tmp_path, pg_db, spark, redis_db):
    make_table(pg_db, "public.t", 50)
    cache = {"name": "cache", "redis": {"url": redis_db, "tables": ["public.t"]}}
    broken = {"name": "broken", "redis": {"url": "redis://127.0.0.1:1/0", "tables": ["public.t"]}}
    pipe = make_pipe(
        tmp_path, pg_db, ["public.t"], sinks=[LAKE, cache, broken], log={"local": {"keep_cuts": KEEP}}
    )
    snapshot(pipe)
    apply_ok(pipe, spark, "lake")
    apply_ok(pipe, spark, "cache")
    held = ckpt(pipe, "cache")["cut_id"]

    # small transactions while a stream runs, until the log has written far more cuts than it
    # keeps by count (a busy stream puts several transactions in one cut: so count cuts, not txns)
    proc = start_stream(pipe)
    writer = Writer(pg_db, "public.t", list(range(1, 51)), 51, seed=3, pause=0.02)
    writer.start()
    deadline = time.monotonic() + 120
    while _latest_cut_id(pipe) - held <= 6 * KEEP:
        assert time.monotonic() < deadline, f"only {_latest_cut_id(pipe) - held} cuts in 120 s"
        assert writer.error is None, writer.error
        time.sleep(0.2)
    writer.finish()
    stop_stream(proc)
    stream(pipe)
    log = open_log(load_pipeline(pipe.file), readonly=True)
    try:
        latest = log.latest_cut()
        assert latest is not None and latest.id - held > 6 * KEEP
        assert log.cut(held) is not None, "the cut the cache follower stands at was dropped"
        kept = log.retention()["oldest_cut"]["id"]
        assert kept <= held and "alarm" not in log.retention()
    finally:
        log.close()

    apply_ok(pipe, spark, "lake")
    assert ckpt(pipe, "lake")["cut_id"] == latest.id
    # the cache still holds its cut: the lake can be rewound that far back, then moves on again
    reset = cdc("reset", pipe.file, "--sink", "lake", "--to-cut", str(held), "--yes")
    assert reset.code == 0, reset.err
    assert ckpt(pipe, "lake")["cut_id"] == held
    apply_ok(pipe, spark, "lake")
    apply_ok(pipe, spark, "cache")  # the lagging follower applies everything after its cut
    assert ckpt(pipe, "cache")["cut_id"] == latest.id
    verified(pipe, spark, "lake")
    verified(pipe, spark, "cache")

    # a failing follower: status shows its error and since when, in text, --json and the metrics
    runs, _ = apply(pipe, spark, "broken")
    assert runs[0].error is not None
    first = collect_status(load_pipeline(pipe.file))
    (entry,) = [f for f in first["followers"] if f["sink"] == "broken"]
    err = entry["last_error"]
    assert "127.0.0.1:1" in err["problem"] or "connect" in err["problem"].lower(), err
    assert err["count"] == 1 and err["since_ms"] == err["last_ms"]
    apply(pipe, spark, "broken")
    data = collect_status(load_pipeline(pipe.file))
    (entry,) = [f for f in data["followers"] if f["sink"] == "broken"]
    assert entry["last_error"]["count"] == 2
    assert entry["last_error"]["since_ms"] == err["since_ms"] < entry["last_error"]["last_ms"]
    assert all("last_error" not in f for f in data["followers"] if f["sink"] != "broken")
    with logsetup.collected() as lines:
        print_status(data)
    text = "\n".join(lines)
    assert "follower broken FAILING since" in text and "2 failed round(s)" in text, text
    assert "cuts kept from cut " in text
    shown = cdc("status", pipe.file, "--json")
    assert json.loads(shown.out)["followers"][2]["last_error"]["count"] == 2
    samples = {
        (s.name, s.labels.get("sink")): s.value
        for family in StateCollector(load_pipeline(pipe.file)).collect()
        for s in family.samples
    }
    assert samples[("pgcdc_follower_failing_since_timestamp_seconds", "broken")] == err["since_ms"] / 1000
    assert samples[("pgcdc_follower_failing_since_timestamp_seconds", "lake")] == 0
    assert samples[("pgcdc_log_cut_retention_alarm", None)] == 0
