"""Run `cdc serve`: check the options, bind, run uvicorn; record the running server for `cdc status`."""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import time
from pathlib import Path

from cdc.ground.config import Pipeline, pipeline_tables
from cdc.ground.errors import UsageError
from pipelines.serve import metrics
from pipelines.serve.app import build_app
from pipelines.serve.clients import Options
from pipelines.serve.feed import Hub
from pipelines.serve.logview import Access, LogAccess
from pipelines.serve.registry import record_server
from pipelines.serve.shape import table_shapes
from pipelines.serve.tokens import load_grants
from pipelines.serve.viewfeed import ViewAccess, ViewHub

logger = logging.getLogger(__name__)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "serve" / "index.html"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve(
    pipeline: Pipeline,
    *,
    bind: str,
    port: int,
    tokens: Path | None,
    sink: str | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    example: bool,
    options: Options,
    poll_s: float,
    ring: int,
) -> int:
    import uvicorn

    kafka = pipeline.log_config.kafka
    if kafka is not None and kafka.format == "debezium":
        raise UsageError(
            "cdc serve serves logs written by cdc; this pipeline's log is a Debezium connector's topics",
            "read them with any Kafka consumer (their records are the same envelope)",
        )
    if kafka is not None and sink:
        raise UsageError(
            "--sink is for the local log: a Kafka log's records are served as they are", "leave out --sink"
        )
    if (tls_cert is None) != (tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together", "pass both files (PEM) or neither")
    for path in (tls_cert, tls_key):
        if path is not None and not path.is_file():
            raise UsageError(f"TLS file {path} does not exist", "pass the PEM certificate and key files")
    grants = load_grants(tokens)
    access: Access
    if kafka is not None:
        from pipelines.serve.kafkaview import KafkaAccess

        access = KafkaAccess(pipeline)
    else:
        if not pipeline.local_log_path.exists():
            raise UsageError("the pipeline has no log yet", f"run `{pipeline.command('snapshot')}` first")
        access = LogAccess(pipeline)
    cut, _ = access.latest()
    sink_cfg = pipeline.sink(sink) if sink else None
    shapes = table_shapes(
        pipeline, sink_cfg, pipeline_tables(pipeline, sorted(cut.tables, key=str) if cut else [])
    )
    metrics.PIPELINE.name = pipeline.name
    if example:
        if not EXAMPLE.is_file():  # examples/ is in the source tree, not in an installed wheel
            raise UsageError(
                f"--example: the page {EXAMPLE} is not here",
                "run cdc serve from a checkout of pgcdc, or leave out --example",
            )
        options.example = EXAMPLE
    hub = Hub(access, shapes, pipeline.name, poll_s, ring)
    names = [v.name for v in pipeline.views]
    if sink_cfg is not None:
        names = [n for n in names if n in sink_cfg.settings.views]
    views = ViewHub(ViewAccess(pipeline.state_path, names), poll_s) if names else None
    app = build_app(hub, grants, options, views)
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind, port))
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {bind}:{port}: {exc.strerror or exc}", "choose a free port with --port"
        ) from None
    port = sock.getsockname()[1]
    scheme = "https" if tls_cert else "http"
    host = f"[{bind}]" if ":" in bind else bind
    url = f"{scheme}://{host}:{port}"
    if not _loopback(bind) and tls_cert is None:
        logger.warning(
            f"serving on {bind} without TLS: tokens and rows cross the network in clear (pass --tls-cert/--tls-key)"
        )
    logger.info(
        f"serving {len(shapes)} table(s) and {len(names)} view(s) of {pipeline.name} at {url}/v1/tables"
        + (f" (example page: {url}/)" if example else "")
    )
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,  # a URL may carry ?access_token=: never written anywhere
        ssl_certfile=str(tls_cert) if tls_cert else None,
        ssl_keyfile=str(tls_key) if tls_key else None,
        timeout_graceful_shutdown=2,
    )
    record = record_server(
        pipeline.state_path, {"url": url, "tables": len(shapes), "started": int(time.time())}
    )
    # uvicorn stops gracefully on SIGINT/SIGTERM, then raises the signal again with the handler it
    # found: ours ends the process with 0, as every long-running verb that is told to stop
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except _Stop:
        pass
    finally:
        record.unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


class _Stop(Exception):
    pass


def _stopped(signum: int, frame: object) -> None:
    raise _Stop
