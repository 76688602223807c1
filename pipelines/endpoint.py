"""The HTTP server on the metrics port: /metrics, /healthz and /readyz (docs/monitoring.md, health).

prometheus_client's own server answers every path with the metrics page; this one routes the two
health paths to cdc/health.py's report first. Both answer JSON, 200 when live (/healthz) or
ready (/readyz), 503 when not:

    {"status": "ok"|"failing", "pipeline": "shop", "live": true, "ready": false,
     "components": {"stream": {"live": true, "ready": false, "reason": "...", ...}, "apply": {...}}}

In `cdc run` the stream runs in a child process: its component is read from the child's private
endpoint (child_check), so the parent's answer covers the whole pipeline.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from cdc import health

HEALTH_PATHS = ("/healthz", "/readyz")
CHILD_START_GRACE_S = 60.0  # a child that does not answer yet right after it started is starting, not dead


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log line per scrape on stderr."""


def health_answer(pipeline: str, path: str) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON body) of /healthz or /readyz."""
    body = {"pipeline": pipeline, **health.report()}
    good = body["live"] if path == "/healthz" else body["ready"]
    body = {"status": "ok" if good else "failing", **body}
    return (200 if good else 503), body


def app(pipeline: str, registry: Any) -> Callable[..., Iterable[bytes]]:
    metrics_app = make_wsgi_app(registry)

    def route(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in HEALTH_PATHS:
            return metrics_app(environ, start_response)
        code, body = health_answer(pipeline, path)
        data = json.dumps(body).encode()
        start_response(
            "200 OK" if code == 200 else "503 Service Unavailable",
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
        )
        return [data]

    return route


def start(host: str, port: int, pipeline: str, registry: Any) -> tuple[WSGIServer, threading.Thread]:
    """Serve on host:port in a daemon thread (OSError when the port is taken)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(_Server):
        address_family = family

    server = make_server(host, port, app(pipeline, registry), Server, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="cdc-metrics", daemon=True)
    thread.start()
    return server, thread


def child_check(port: int, started: float | None = None) -> health.Check:
    """`cdc run`: the stream child's component, from its /healthz on 127.0.0.1:port."""
    started = time.monotonic() if started is None else started
    answered = False  # the grace ends once it has answered: after that, silence means hung or gone

    def check() -> dict[str, Any]:
        nonlocal answered
        url = f"http://127.0.0.1:{port}/healthz"
        try:
            try:
                with urllib.request.urlopen(url, timeout=3) as response:
                    body = json.loads(response.read())
            except urllib.error.HTTPError as exc:  # 503: its answer is in the body
                body = json.loads(exc.read())
            answered = True
        except (OSError, ValueError):
            if not answered and time.monotonic() - started < CHILD_START_GRACE_S:
                return {"live": True, "ready": False, "reason": "the stream child is starting"}
            return {
                "live": False,
                "ready": False,
                "reason": "cdc run's stream child does not answer on its private endpoint (hung or gone)",
            }
        stream = body.get("components", {}).get("stream")
        if stream is None:  # answering, but its read loop has not begun (catalog checks, re-bases)
            return {"live": True, "ready": False, "reason": "the stream child is starting"}
        return stream

    return check
