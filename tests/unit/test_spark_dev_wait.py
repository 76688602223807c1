"""`cdc dev up spark` waits through a half-started master web UI (issue 34 item 8): a real local
HTTP server (http.server in a thread) plays the master's `/json/`, answering as a Jetty that is
still starting does, before (or instead of) the real answer."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cdc.ground.errors import ServiceError
from pipelines.devservices.spark import LocalSparkCluster

pytestmark = pytest.mark.unit

READY = json.dumps({"workers": [{"id": "w1", "state": "ALIVE"}, {"id": "w2", "state": "ALIVE"}]}).encode()
HALF_STARTED = [
    (200, b""),  # an empty body: JSONDecodeError, the reported failure
    (200, b"<html><body>Spark Master at spark://127.0.0.1:7077</body></html>"),
    (200, b'{"url": "spark://127.0.0.1:7077", "workers": ['),  # cut off
    (200, b'{"url": "spark://127.0.0.1:7077"}'),  # no workers list yet
    (200, b'{"workers": null}'),
    (503, b"Service Unavailable"),
]


@contextmanager
def master_ui(answers: list[tuple[int, bytes]], then: bytes | None) -> Iterator[tuple[int, list[str]]]:
    """Serve `answers` in turn on /json/, then `then` for ever (None: the last answer again)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            i = len(seen) - 1
            status, body = answers[i] if i < len(answers) else (200, then) if then else answers[-1]
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def cluster_at(tmp_path: Path, port: int, timeout: float) -> LocalSparkCluster:
    cluster = LocalSparkCluster(tmp_path / "spark", start_timeout=timeout)
    cluster.ports["master_ui"] = port  # the daemons are never launched: only the wait runs
    return cluster


def test_wait_keeps_waiting_through_half_started_answers(tmp_path: Path) -> None:
    with master_ui(HALF_STARTED, then=READY) as (port, seen):
        cluster_at(tmp_path, port, timeout=30)._wait_ready()
    # every half-started answer was taken as "not ready yet", and the wait went on to the real one
    assert len(seen) == len(HALF_STARTED) + 1 and set(seen) == {"/json/"}


def test_wait_ends_with_a_clear_error_at_the_deadline(tmp_path: Path) -> None:
    with master_ui([(200, b'{"workers": [')], then=None) as (port, seen):
        started = time.monotonic()
        with pytest.raises(ServiceError) as err:
            cluster_at(tmp_path, port, timeout=2)._wait_ready()
    assert 2 <= time.monotonic() - started < 10
    assert len(seen) >= 2  # it asked again, not gave up on the first bad answer
    assert "not ready within 2s (JSONDecodeError" in err.value.problem
    assert err.value.fix


def test_workers_not_alive_yet_are_waited_for(tmp_path: Path) -> None:
    one = json.dumps({"workers": [{"state": "ALIVE"}, {"state": "UNKNOWN"}]}).encode()
    with master_ui([(200, one)], then=None) as (port, _seen), pytest.raises(ServiceError) as err:
        cluster_at(tmp_path, port, timeout=1.5)._wait_ready()
    assert "1 of 2 workers registered" in err.value.problem
