"""The verbs that keep the pipeline's state_dir: `log` (read, compact, remove-table), `upgrade`
and `teardown`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from pipelines.cli.common import PIPELINE, load
from pipelines.cli.failures import handle_errors

logger = logging.getLogger(__name__)


@click.group()
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
    logger.info(report)


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
    remove_table(load(pipeline), table)


@click.command()
@PIPELINE
@click.option(
    "--rollback",
    is_flag=True,
    help="write the state back in the formats cdc 0.1.0 reads (before going back to it)",
)
@handle_errors
def upgrade(pipeline: Path, rollback: bool) -> None:
    """Bring the pipeline's state_dir to this release's formats and show them (every verb does the
    upgrade by itself at start; a state from a newer cdc is refused with exit 5). docs/upgrades.md."""
    from pipelines.upgrade import describe, rollback_state, upgrade_state

    p = load(pipeline, upgrade=False)
    if rollback:
        rollback_state(p)
        return
    if not upgrade_state(p):
        logger.info(f"{p.state_path}: nothing to upgrade")
    describe(p)


@click.command()
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
    run_teardown(p, drop_slot, delete_topics)
