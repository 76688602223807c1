"""`cdc run`: snapshot if needed, then stream and apply continuously until Ctrl-C.

The stream runs as a child process (`cdc stream`), so WAL reading never competes with the
Spark driver for the GIL; this process runs the apply loop and watches the child. Ctrl-C or
SIGTERM stops both cleanly; if the stream dies, the apply loop stops and its exit code is
passed on.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cdc.ground.config import Pipeline
from cdc.ground.errors import CdcError, ExitCode

logger = logging.getLogger(__name__)


def run_pipeline(
    pipeline: Pipeline,
    pipeline_file: Path,
    report: Callable[[str, str, int], None],  # an error line and its fix (pipelines/cli.py report_error)
    metrics_port: int | None = None,
) -> int:
    from pipelines.metrics import free_port, serving

    port = metrics_port or pipeline.metrics.port
    # the stream child serves its own series on a private port; ours merges them in (one endpoint)
    child_port = free_port() if port else None
    with serving(pipeline, "run", port, child_port=child_port):
        return _run(pipeline, pipeline_file, child_port, report)


def _run(
    pipeline: Pipeline,
    pipeline_file: Path,
    child_port: int | None,
    report: Callable[[str, str, int], None],
) -> int:
    from cdc import health
    from cdc.ground import logsetup
    from snapshot.runner import run_snapshot

    # /readyz (pipelines/endpoint.py): not ready until the stream runs
    health.register("snapshot", lambda: {"live": True, "ready": False, "reason": "taking the snapshot"})
    try:
        result = run_snapshot(pipeline, progress=not logsetup.is_json())  # no bar between JSON lines
    finally:
        health.unregister("snapshot")
    if not result.skipped:
        logger.info(f"snapshot: {result.total_rows:,} rows in {result.seconds:.1f}s")
    command = [sys.executable, "-m", "pipelines.cli", "stream", str(pipeline_file)]
    if child_port is not None:
        command += ["--metrics-port", str(child_port), "--metrics-child"]
    child = subprocess.Popen(command, env=logsetup.child_env())
    if child_port is not None:  # the stream's health, read from the child's private endpoint
        from pipelines.endpoint import child_check

        health.register("stream", child_check(child_port))
    logger.info(
        f"streaming in process {child.pid}; applying every {pipeline.spark.trigger_interval_s:g}s (Ctrl-C stops both)"
    )
    # Caught from here on: a SIGTERM while Spark starts (tens of seconds) used to kill this
    # process at once and leave the stream child running, holding the slot.
    stopping = False

    def stop(*_args) -> None:
        nonlocal stopping
        stopping = True

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if pipeline.sinks:
            from pipelines.apply.job import ApplyJob
            from pipelines.spark import spark_session

            job = ApplyJob(pipeline, spark_session(pipeline, short_lived=False))  # long-running: uses one
            job.guard_stalls(report, before_exit=lambda: _stop(child))  # the stream must not outlive us
            if not stopping:
                job.run_forever(keep_going=lambda: child.poll() is None and not stopping)
        else:
            _wait_for_signal(child)
    except CdcError:
        _stop(child)
        raise
    finally:
        code = _stop(child)
        health.unregister("stream")
        for s, h in old.items():
            signal.signal(s, h)
    if code not in (0, -signal.SIGTERM, -signal.SIGINT):
        logger.info(f"the stream stopped with exit code {code}")
        return code if code > 0 else int(ExitCode.RUNTIME)
    return int(ExitCode.OK)


def _wait_for_signal(child: subprocess.Popen) -> None:
    stop = False

    def handler(*_args) -> None:
        nonlocal stop
        stop = True

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop and child.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=0.5)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _stop(child: subprocess.Popen) -> int:
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return child.returncode
