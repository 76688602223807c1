"""The verbs on the source side: `validate`, `snapshot`, `stream`, `run`, `migrate` and `ddl`."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from cdc.ground import logsetup
from cdc.ground.errors import ExitCode
from pipelines.cli.common import LOG_FORMAT, METRICS_PORT, PIPELINE, load
from pipelines.cli.failures import handle_errors
from pipelines.cli.output import err, report_error

logger = logging.getLogger(__name__)


@click.command()
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

    return run_validate(load(pipeline, check_state_dir=False), spark_views)


@click.command()
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
    with serving(loaded, "snapshot", metrics_port, one_shot=True):
        progress = not no_progress and not logsetup.is_json()  # no bar between JSON lines
        result = run_snapshot(loaded, only, parallel, progress=progress)
    if not result.skipped:
        rate = result.total_rows / max(result.seconds, 1e-6)
        logger.info(
            f"snapshot done: {result.total_rows:,} rows from {len(result.rows)} table(s) in {result.seconds:.1f}s ({rate:,.0f} rows/s)"
        )
        for table, rows in sorted(result.rows.items()):
            logger.info(f"  {table}: {rows:,} rows")


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


@click.command()
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
    with serving(loaded, "stream", metrics_port, internal=metrics_child, one_shot=until is not None):
        # tables rewritten without change events (ALTER COLUMN TYPE, volatile defaults, ...) are re-based
        stats = run_stream(loaded, until=target, rebaser=ThreadRebaser(loaded))
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


@click.command()
@PIPELINE
@METRICS_PORT
@LOG_FORMAT
@handle_errors
def run(pipeline: Path, metrics_port: int | None) -> int:
    """Snapshot if needed, then stream and apply continuously until Ctrl-C."""
    from pipelines.run import run_pipeline

    return run_pipeline(load(pipeline), pipeline, report_error, metrics_port)


@click.command()
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

    run_migrate(load(pipeline), sql_file)


@click.group()
def ddl() -> None:
    """DDL capture: the event trigger that writes each schema change of a captured table into the WAL."""


@ddl.command("install")
@PIPELINE
@handle_errors
def ddl_install(pipeline: Path) -> None:
    """Install the event trigger (needs a superuser DSN); schema changes then reach the log at their commit."""
    from pipelines.ddl import run_install

    run_install(load(pipeline))


@ddl.command("remove")
@PIPELINE
@handle_errors
def ddl_remove(pipeline: Path) -> None:
    """Remove the event trigger; schema changes then reach the log with each table's next change."""
    from pipelines.ddl import run_remove

    run_remove(load(pipeline))
