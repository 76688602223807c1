"""Load test of issue 33.1 (make test-slow): a Redis follower of a join view keeps advancing while a
stream writes many small transactions and every apply round is held at the view stage (a slow
apply) until the log has written several times more cuts than it keeps by count. Before: `sink
cache: FAILED: its views stand at cut N, which the log no longer has`. Each round `cdc status` and
the metrics are read: any follower error would show there, and none may."""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import threading
import time

import pytest

from pipelines.metrics import StateCollector
from pipelines.status import collect_status
from sinks.registry import load_pipeline
from tests.fixtures.capture import start_stream, stop_stream
from tests.fixtures.lake import apply, apply_ok, ckpt, make_pipe, snapshot, stream, verified
from tests.fixtures.workload import Writer, make_table
from tests.harness import sql

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(3600)]  # minutes of Spark rounds

KEEP = 10  # log.local.keep_cuts
DOCS = "SELECT t.id, t.v, g.label FROM public.t t JOIN public.g g ON g.id = t.id % 5"


def _latest_cut_id(pipe) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{pipe.log / 'log.db'}?mode=ro", uri=True)) as db:
        return db.execute("SELECT coalesce(max(id), 0) FROM cuts").fetchone()[0]


def test_a_view_follower_advances_through_small_transactions_while_applies_are_slow(
    tmp_path, pg_db, spark, redis_db, monkeypatch
):
    make_table(pg_db, "public.t", 300)
    sql(
        pg_db,
        "CREATE TABLE g(id int PRIMARY KEY, label text)",
        "INSERT INTO g SELECT i, 'g' || i FROM generate_series(0, 4) i",
    )
    cache = {"name": "cache", "redis": {"url": redis_db, "views": ["docs"]}}
    pipe = make_pipe(
        tmp_path,
        pg_db,
        ["public.t", "public.g"],
        sinks=[cache],
        views=[{"name": "docs", "sql": DOCS, "key": ["id"]}],
        log={"local": {"keep_cuts": KEEP}},
    )
    snapshot(pipe)
    apply_ok(pipe, spark)
    first = _latest_cut_id(pipe)

    proc = start_stream(pipe)
    writer = Writer(pg_db, "public.t", list(range(1, 301)), 301, seed=7, pause=0.01)
    writer.start()
    marker = tmp_path / "held-at-view-stage"
    monkeypatch.setenv("CDC_PAUSE", "views:after-merge")
    monkeypatch.setenv("CDC_PAUSE_FILE", str(marker))
    done = threading.Event()
    passed: list[int] = []  # cuts written while each round was held

    def slow_apply() -> None:
        """Hold each round at the view stage until 3 * KEEP more cuts are in the log."""
        while not done.is_set():
            if marker.exists():
                start, deadline = _latest_cut_id(pipe), time.monotonic() + 60
                while _latest_cut_id(pipe) - start < 3 * KEEP and time.monotonic() < deadline:
                    time.sleep(0.1)
                passed.append(_latest_cut_id(pipe) - start)
                marker.unlink()
            time.sleep(0.05)

    holder = threading.Thread(target=slow_apply, daemon=True)
    holder.start()
    cuts = [ckpt(pipe, "cache")["cut_id"]]
    try:
        for round_ in range(4):
            if round_ == 2:
                sql(pg_db, "UPDATE g SET label = label || '+'")  # a join-side change among the small ones
            runs, lines = apply(pipe, spark)
            assert not [r for r in runs if r.error is not None], "\n".join(lines)
            cuts.append(ckpt(pipe, "cache")["cut_id"])
            data = collect_status(load_pipeline(pipe.file))
            (follower,) = data["followers"]
            assert "last_error" not in follower, follower
            assert "alarm" not in data["log"]["cut_retention"], data["log"]["cut_retention"]
            samples = {
                (s.name, s.labels.get("sink")): s.value
                for family in StateCollector(load_pipeline(pipe.file)).collect()
                for s in family.samples
            }
            assert samples[("pgcdc_follower_failing_since_timestamp_seconds", "cache")] == 0
    finally:
        done.set()
        monkeypatch.delenv("CDC_PAUSE")
        marker.unlink(missing_ok=True)
        writer.finish()
        stop_stream(proc)
    assert all(a < b for a, b in itertools.pairwise(cuts)), (
        f"the follower did not advance every round: {cuts}"
    )
    assert len(passed) >= 4 and min(passed) >= 3 * KEEP, f"cuts written while held: {passed}"
    assert _latest_cut_id(pipe) - first > 12 * KEEP
    assert len(writer.txns) > 100
    stream(pipe)
    apply_ok(pipe, spark)
    verified(pipe, spark, "cache")  # the view follower is exactly the view's SQL over the source
