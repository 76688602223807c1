"""/healthz and /readyz on the metrics server (issue 34 item 5; README "Monitoring", "Health"):
the real HTTP server of pipelines/endpoint.py with components registered in cdc/health.py, and the
continuous apply's rules (pipelines/apply/health.py) on real SinkRun results."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge

from cdc import health
from cdc.ground.errors import SinkError
from pipelines.apply.health import ApplyHealth
from pipelines.apply.job import SinkRun
from pipelines.endpoint import child_check, start
from pipelines.metrics import free_port

pytestmark = pytest.mark.unit


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def server() -> Iterator[int]:
    registry = CollectorRegistry()
    Gauge("pgcdc_up", "up", ["pipeline"], registry=registry).labels("shop").set(1)
    port = free_port()
    httpd, thread = start("127.0.0.1", port, "shop", registry)
    try:
        yield port
    finally:
        for name in ("stream", "apply", "child"):
            health.unregister(name)
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def test_live_and_ready_codes_and_json(server: int) -> None:
    # nothing registered yet (a verb starting, or a batch verb): alive, not ready
    assert get(server, "/healthz")[0] == 200 and get(server, "/readyz")[0] == 503
    state = {"live": True, "ready": True, "reason": "streaming from slot cdc_shop"}
    health.register("stream", lambda: dict(state))
    code, text = get(server, "/readyz")
    body = json.loads(text)
    assert code == 200 and body["status"] == "ok" and body["pipeline"] == "shop"
    assert body["live"] is True and body["ready"] is True and body["components"]["stream"] == state

    state.update(ready=False, reason="reconnecting to the source (lost: terminated)")  # live, not ready
    assert get(server, "/healthz")[0] == 200
    code, text = get(server, "/readyz")
    assert code == 503 and json.loads(text)["status"] == "failing"
    assert json.loads(text)["components"]["stream"]["reason"].startswith("reconnecting")

    state.update(live=False)  # hung: neither
    assert get(server, "/healthz")[0] == 503 and get(server, "/readyz")[0] == 503

    # the metrics page is still served on every other path, as before
    code, text = get(server, "/metrics")
    assert code == 200 and 'pgcdc_up{pipeline="shop"} 1.0' in text


def test_a_failing_check_is_not_ready_but_does_not_break_the_endpoint(server: int) -> None:
    def broken() -> dict:
        raise RuntimeError("boom")

    health.register("apply", broken)
    code, text = get(server, "/readyz")
    assert code == 503 and "health check failed: RuntimeError" in text
    assert get(server, "/healthz")[0] == 200


def test_child_check_reads_the_child_endpoint(server: int) -> None:
    """cdc run reads its stream child's component over HTTP; a child that stops answering after it
    answered once is not live (no start grace any more)."""
    health.register("stream", lambda: {"live": True, "ready": True, "reason": "streaming"})
    check = child_check(server)
    assert check() == {"live": True, "ready": True, "reason": "streaming"}
    gone = child_check(free_port(), started=time.monotonic())
    assert gone()["reason"] == "the stream child is starting" and gone()["live"] is True
    late = child_check(free_port(), started=time.monotonic() - 3600)
    assert late()["live"] is False and "does not answer" in late()["reason"]


def test_apply_readiness_follows_the_rounds() -> None:
    watch = ApplyHealth(["lake", "cache"], trigger_interval_s=5.0, guard=None)
    assert watch.check()["live"] and not watch.check()["ready"]  # no round yet
    watch.round_started()
    assert watch.check()["ready"]  # a round under way moves (no guard: never declared stuck)
    watch.round_ended(
        [SinkRun("lake", up_to_date=True), SinkRun("cache", error=SinkError("Redis down", "start it"))]
    )
    state = watch.check()
    assert (
        state["live"]
        and not state["ready"]
        and "sink cache: its last round failed: Redis down" in state["reason"]
    )
    watch.round_ended([SinkRun("lake"), SinkRun("cache")])
    assert watch.check()["ready"] and watch.check()["reason"] == "every follower advances"
    watch.last_ok["lake"] -= 301  # no good round of lake for longer than max(300 s, 10 intervals)
    assert "sink lake: no round ended without error" in watch.check()["reason"]
    watch.loop.at -= 121  # the loop between rounds has not moved for over 2 minutes: hung
    assert not watch.check()["live"]
