"""The verbs that read what is captured and applied: `status`, `sql`, `search` and `serve`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from pipelines.cli.common import PIPELINE, load
from pipelines.cli.failures import handle_errors
from pipelines.cli.output import err

logger = logging.getLogger(__name__)


@click.command()
@PIPELINE
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option(
    "--watch", is_flag=True, help="show it again every --interval seconds until Ctrl-C (then exit 0)"
)
@click.option(
    "--interval",
    "interval_s",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="seconds between refreshes of --watch",
)
@handle_errors
def status(pipeline: Path, as_json: bool, watch: bool, interval_s: float) -> int:
    """Slot lag, log end and each follower's position (exit 1 if a follower lost data it had applied,
    4 if a follower's checkpoint is unreadable)."""
    import time

    from rich.console import Console

    from pipelines.status import collect_status, print_status, status_exit
    from pipelines.status_view import status_view
    from pipelines.status_view import watch as watch_live

    loaded = load(pipeline)
    snapshot_cmd = loaded.command("snapshot")
    console = Console()
    if console.is_terminal and not as_json:  # a person reading: rich tables (docs/reference/cli.md)
        if watch:
            watch_live(lambda: collect_status(loaded), snapshot_cmd, interval_s, console)
            return 0
        data = collect_status(loaded)
        console.print(status_view(data, snapshot_cmd))
        return status_exit(data)
    while True:
        data = collect_status(loaded)
        if as_json:
            import json

            click.echo(json.dumps(data, indent=2, default=str))
        else:
            print_status(data, snapshot_cmd)
        if not watch:
            return status_exit(data)
        sys.stdout.flush()
        try:
            time.sleep(interval_s)
        except KeyboardInterrupt:
            return 0  # watching ends with Ctrl-C: not a failure
        click.echo("")


@click.command()
@PIPELINE
@click.argument("query", required=False)
@click.option(
    "--sink", "sink_name", help="the delta or iceberg sink to read (default: the first one of those)"
)
@click.option(
    "--cut",
    "cut",
    type=click.IntRange(min=1),
    help="read every table as of this applied cut (default: the latest complete one)",
)
@click.option(
    "--limit", default=1000, show_default=True, type=click.IntRange(min=1), help="rows to print at most"
)
@click.option("--json", "as_json", is_flag=True, help="one JSON object per row")
@click.option(
    "--cuts", "list_only", is_flag=True, help="list the recorded cuts (id, LSN, time, table versions) instead"
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "datafusion", "polars", "spark"]),
    default="auto",
    show_default=True,
    help="datafusion (Delta) or polars (Iceberg): no JVM; spark: Spark SQL; auto: the one without a JVM, "
    "and Spark for a query it cannot run",
)
@handle_errors
def sql(
    pipeline: Path,
    query: str | None,
    sink_name: str | None,
    cut: int | None,
    limit: int,
    as_json: bool,
    list_only: bool,
    engine: str,
) -> int:
    """SQL over a Delta or Iceberg follower, every table as of the same cut (tables named as in the source)."""
    from pipelines.lakesql import lake_sink, run_sql

    p = load(pipeline)
    lake_sink(p, sink_name, engine)  # unknown or other kind of sink: exit 2 before any engine starts

    def spark():  # started only when Spark runs the query
        from pipelines.spark import spark_session

        return spark_session(p)

    return run_sql(p, spark, query, sink_name, cut, limit, as_json, list_only, logger.info, err, engine)


@click.command()
@PIPELINE
@click.argument("table")
@click.argument("query")
@click.option("--sink", "sink_name", help="the search sink to query (default: the first one)")
@click.option("--limit", default=10, show_default=True, type=click.IntRange(1, 1000))
@handle_errors
def search(pipeline: Path, table: str, query: str, sink_name: str | None, limit: int) -> None:
    """Print the top hits of QUERY in the search follower's index of TABLE."""
    from sinks.search.query import run_search

    for line in run_search(load(pipeline), table, query, sink_name, limit):
        click.echo(line)


@click.command()
@PIPELINE
@click.option(
    "--bind", default="127.0.0.1", show_default=True, help="address to listen on (loopback by default)"
)
@click.option(
    "--port",
    default=8765,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="port to listen on (0: any free port, printed)",
)
@click.option(
    "--tokens",
    "tokens",
    type=click.Path(path_type=Path),
    help="file of `sha256:<digest> TABLES` lines (default: $CDC_SERVE_TOKENS_FILE; plus $CDC_SERVE_TOKENS)",
)
@click.option("--sink", "sink", help="serve what this sink gets: its tables, columns, masks and renames")
@click.option(
    "--tls-cert", type=click.Path(path_type=Path), help="PEM certificate: serve HTTPS (with --tls-key)"
)
@click.option("--tls-key", type=click.Path(path_type=Path), help="PEM private key of --tls-cert")
@click.option("--example", is_flag=True, help="serve the example page (examples/serve/index.html) at /")
@click.option(
    "--heartbeat",
    "heartbeat_s",
    default=15.0,
    show_default=True,
    type=click.FloatRange(min=0.05),
    help="seconds between heartbeat events of an idle stream",
)
@click.option(
    "--client-queue",
    "queue",
    default=256,
    show_default=True,
    type=click.IntRange(1),
    help="transactions buffered per SSE client; a client further behind is cut off with its position",
)
@click.option(
    "--ring",
    default=1024,
    show_default=True,
    type=click.IntRange(1),
    help="recent transactions per table kept in memory for resuming clients",
)
@click.option(
    "--poll",
    "poll_s",
    default=0.02,
    show_default=True,
    type=click.FloatRange(min=0.01),
    help="seconds between looks at the log's latest cut",
)
@click.option(
    "--max-clients",
    default=1000,
    show_default=True,
    type=click.IntRange(1),
    help="SSE clients at a time (tables and views); more are refused with 503",
)
@handle_errors
def serve(
    pipeline: Path,
    bind: str,
    port: int,
    tokens: Path | None,
    sink: str | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    example: bool,
    heartbeat_s: float,
    queue: int,
    ring: int,
    poll_s: float,
    max_clients: int,
) -> int:
    """Serve the captured tables and derived views to applications over HTTP: initial rows, then live changes (SSE, long-poll)."""
    from pipelines.serve.clients import Options
    from pipelines.serve.server import serve as run_server

    options = Options(heartbeat_s=heartbeat_s, queue=queue, max_clients=max_clients)
    return run_server(
        load(pipeline), bind=bind, port=port, tokens=tokens, sink=sink, tls_cert=tls_cert, tls_key=tls_key,
        example=example, options=options, poll_s=poll_s, ring=ring,
    )  # fmt: skip
