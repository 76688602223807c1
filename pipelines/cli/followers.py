"""The verbs that apply the log to the followers and check them: `apply`, `verify`, `wait`,
`reset` and `maintain`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from pipelines.cli.common import LOG_FORMAT, METRICS_PORT, PIPELINE, load
from pipelines.cli.failures import handle_errors
from pipelines.cli.output import report_error

logger = logging.getLogger(__name__)


@click.command()
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
        serving(p, "apply", metrics_port, one_shot=once),
        reporting(),
    ):  # stage lines on stderr (pipelines/stages.py)
        job = ApplyJob(p, spark_session(p, short_lived=once), lock_wait_s=lock_wait_s)
        job.guard_stalls(report_error)
        if not once:
            job.run_forever(sink_name)
            return 0
        runs = job.run_once(sink_name)
    job.report(runs)
    failed = [r.error for r in runs if r.error is not None]
    return max((int(e.exit_code) for e in failed), default=0)


@click.command()
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
        return run_verify(p, spark_session(p), list(dict.fromkeys(sink_names)) or None, wait_s)


@click.command()
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
    return run_wait(p, target, list(dict.fromkeys(sink_names)) or None, timeout_s)


@click.command()
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
    run_reset(p, sink_name, to_cut, rebuild)


@click.command()
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
            p, spark_session(p), names, retain_hours, keep_cuts, not no_optimize, not no_vacuum
        )
