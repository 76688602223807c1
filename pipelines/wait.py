"""`cdc wait PIPELINE (--lsn LSN | --current) [--sink NAME]... [--timeout S]`: read your own writes.

An application that wrote to the source and then reads a follower (a cache, a search index)
would see the state before its write until the pipeline carries it over. `cdc wait` returns
once every named follower (default: every sink) has applied everything committed up to a
position: exit 0, or 1 when `--timeout` passes first (docs/run-continuously.md, read your own writes).

A follower's checkpoint holds the LSN of the cut it applied last; a cut at LSN L holds every
transaction committed before L (the stream also makes cuts at the server's position while the
source is idle, so L reaches any position without another write). So "applied up to P" is
`checkpoint.lsn >= P`, read from the checkpoint files (written atomically): no Spark, no lock,
nothing written to the followers or the log.

`--current` is the source's position now, taken as `cdc stream --until current` takes it (a
synchronous logical-decoding message, so commits made with `synchronous_commit = off` lie before
it too). `--lsn` is a position the application read itself (`SELECT pg_current_wal_lsn()` after
its commit).
"""

from __future__ import annotations

import logging
import time

from cdc.ground.config import Pipeline
from cdc.ground.errors import CdcError, UsageError, WaitTimeout
from cdc.ground.lsn import format_lsn, parse_lsn
from cdc.source import connect, flushed_wal_lsn, slot_state
from pipelines.checkpoints import Checkpoint, load_checkpoint

logger = logging.getLogger(__name__)

POLL_S = 0.1  # a checkpoint read is one small file: polling often keeps the wait close to the apply


def target_lsn(pipeline: Pipeline, lsn: str | None, current: bool) -> int:
    """The position to wait for: `--lsn` parsed, or the source's position now (`--current`)."""
    if (lsn is None) == (not current):
        raise UsageError(
            "cdc wait needs exactly one of --lsn LSN and --current", "pass --lsn 16/B374D848 or --current"
        )
    if lsn is not None:
        try:
            return parse_lsn(lsn)
        except ValueError as exc:
            raise UsageError(
                str(exc), "give the LSN as PostgreSQL prints it (SELECT pg_current_wal_lsn())"
            ) from None
    conn = connect(pipeline.source.postgres.dsn, application_name="cdc wait")
    try:
        return flushed_wal_lsn(conn)
    finally:
        conn.close()


def run_wait(pipeline: Pipeline, target: int, sinks: list[str] | None, timeout_s: float) -> int:
    names = sinks or [s.name for s in pipeline.sinks]
    if not names:
        raise UsageError(
            f"pipeline {pipeline.name} has no sinks to wait for",
            "add one under `sinks:` in the pipeline file",
        )
    for name in names:
        pipeline.sink(name)  # an unknown sink is exit 2
    started = time.monotonic()
    while True:
        ckpts = {name: load_checkpoint(pipeline.state_path, name, pipeline.file) for name in names}
        behind = {name: c for name, c in ckpts.items() if c.lsn < target}
        if not behind:
            logger.info(
                f"every follower ({', '.join(names)}) has applied everything committed up to {format_lsn(target)} "
                f"(after {time.monotonic() - started:.1f}s)"
            )
            return 0
        if time.monotonic() - started >= timeout_s:
            raise WaitTimeout(_late(pipeline, target, behind, timeout_s), _why(pipeline, target, behind))
        time.sleep(POLL_S)


def _late(pipeline: Pipeline, target: int, behind: dict[str, Checkpoint], timeout_s: float) -> str:
    where = "; ".join(
        f"sink {name} at {format_lsn(c.lsn)} (cut {c.cut_id})" if c.cut_id else f"sink {name} never applied"
        for name, c in behind.items()
    )
    return f"not every follower applied {format_lsn(target)} within {timeout_s:g}s: {where}"


def _why(pipeline: Pipeline, target: int, behind: dict[str, Checkpoint]) -> str:
    """What holds the followers back: nothing streaming, the stream not there yet, or no apply."""
    run = f"`{pipeline.command('run')}`"
    log_lsn = _log_lsn(pipeline)
    if log_lsn is not None and log_lsn >= target:
        sinks = " ".join(f"--sink {name}" for name in behind)
        return (
            f"the log holds it (cut at {format_lsn(log_lsn)}), the follower has not applied it yet: keep {run} "
            f"(or a continuous `{pipeline.command('apply')}`) running, or run `{pipeline.command('apply', '--once', sinks)}`; "
            "or wait longer (--timeout)"
        )
    active = _stream_running(pipeline)
    if active is False:
        return (
            f"nothing is streaming the source into the log (slot {pipeline.slot} is not in use): start {run} "
            f"(or `{pipeline.command('stream')}` with an apply), then wait again"
        )
    return f"the log is at {format_lsn(log_lsn or 0)} and has not reached it yet: wait longer (--timeout), or see `{pipeline.command('status')}`"


def _log_lsn(pipeline: Pipeline) -> int | None:
    from cdc.log import open_log_view

    try:
        log = open_log_view(pipeline)
    except CdcError:
        return None
    try:
        cut = log.latest_cut()
        return cut.lsn if cut is not None else None
    except CdcError:
        return None
    finally:
        log.close()


def _stream_running(pipeline: Pipeline) -> bool | None:
    """Is the pipeline's slot in use (a `cdc stream` reading it)? None: cannot tell."""
    try:
        conn = connect(pipeline.source.postgres.dsn, application_name="cdc wait")
    except CdcError:
        return None
    try:
        slot = slot_state(conn, pipeline.slot)
    finally:
        conn.close()
    return slot is not None and slot["active_pid"] is not None
