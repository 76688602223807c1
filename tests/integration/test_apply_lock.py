"""Overlapping `cdc apply` runs on one follower (pipelines/locks.py), with real processes.

A `cdc apply --once` is held right after taking the sink's lock (CDC_PAUSE); a second run leaves
the sink to it (exit 4, naming the holder's pid); a third, `cdc apply --lock-wait`, says it waits
for that pid; the holder killed with SIGKILL releases the lock (the kernel drops an flock with its
process), so the waiting run takes the sink and applies. A run waiting behind it in turn finds
the follower up to date once it is done (the cut re-read after the wait: never applied twice).
The follower then equals the source.

Two `cdc apply` processes (two JVMs): the holder that is killed and the waiting CLI run; the
other runs are the apply job in the test's process (the same flock, taken on a file description
of its own, so it conflicts with the subprocesses' as another process's would).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cdc.ground import logsetup
from pipelines.apply.job import ApplyJob
from pipelines.checkpoints import checkpoint_dir
from pipelines.locks import LockBusy
from sinks.registry import load_pipeline
from tests.fixtures.lake import FAST_JVM, LAKE, apply, make_pipe, snapshot, stream
from tests.harness import cdc_popen, sql, verify

pytestmark = [pytest.mark.integration]

UNBUFFERED = {"PYTHONUNBUFFERED": "1"}


def wait_for_file(path: Path, proc: subprocess.Popen, limit_s: float = 300) -> None:
    """Until the paused process created `path` (fails if it exits first)."""
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"apply exited {proc.returncode} before pausing:\n{out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("apply did not reach the pause point")
        time.sleep(0.1)


def read_until(proc: subprocess.Popen, text: str) -> list[str]:
    """stdout lines of `proc` up to and including the first one containing `text`."""
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if text in line:
            return lines
    pytest.fail(f"{text!r} never printed; got {lines}; stderr: {proc.stderr.read() if proc.stderr else ''}")


def cut_of(state: Path, sink: str) -> int:
    path = checkpoint_dir(state) / f"{sink}.json"
    return json.loads(path.read_text())["cut_id"] if path.exists() else 0


def test_overlapping_applies(pg_db: str, tmp_path: Path, spark) -> None:
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.t"], sinks=[LAKE], spark={"conf": FAST_JVM})
    state = load_pipeline(pipe.file).state_path
    snapshot(pipe)
    sql(pg_db, "INSERT INTO t VALUES (21, 'new')", "UPDATE t SET v = 'changed' WHERE id = 1")
    stream(pipe)

    held, resumed = tmp_path / "held", tmp_path / "resumed"
    holder = cdc_popen(
        "apply", pipe.file, "--once", env={"CDC_PAUSE": "apply:locked", "CDC_PAUSE_FILE": str(held)}
    )
    waiting: subprocess.Popen | None = None
    try:
        wait_for_file(held, holder)
        # a second run while the holder has the sink: it leaves the sink alone and says who has it
        (run,), lines = apply(pipe, spark)
        assert isinstance(run.error, LockBusy) and int(run.error.exit_code) == 4, lines  # `cdc apply` exits 4
        text = "\n".join(lines)
        assert "another cdc apply is applying this follower" in text and f"pid {holder.pid}" in text, text
        assert "--lock-wait" in text and "Traceback" not in text
        assert cut_of(state, "lake") == 0  # nothing written by either yet

        # a third run that waits says so; the holder killed with SIGKILL lets it have the sink
        waiting = cdc_popen(
            "apply",
            pipe.file,
            "--once",
            "--lock-wait",
            "600",
            env={"CDC_PAUSE": "apply:locked", "CDC_PAUSE_FILE": str(resumed), **UNBUFFERED},
        )
        said = read_until(waiting, "waiting up to 600s for another cdc apply")
        assert f"pid {holder.pid}" in said[-1]
        os.kill(holder.pid, 9)
        holder.wait(timeout=60)
        wait_for_file(resumed, waiting)  # it holds the lock now (paused before writing anything)

        # a run waiting behind it finds the follower up to date once it is done (not applied twice)
        with logsetup.collected() as behind:  # the job's lines, from its thread
            job = ApplyJob(load_pipeline(pipe.file), spark, lock_wait_s=600)
            result: list = []
            thread = threading.Thread(target=lambda: result.extend(job.run_once()), daemon=True)
            thread.start()
            deadline = time.monotonic() + 300
            while not any("waiting up to 600s for another cdc apply" in line for line in behind):
                assert thread.is_alive() and time.monotonic() < deadline, ("it did not wait", behind, result)
                time.sleep(0.1)
            assert any(f"pid {waiting.pid}" in line for line in behind), behind
            resumed.unlink()  # let the waiting CLI run go on
            out, err = waiting.communicate(timeout=600)
            assert waiting.returncode == 0, (out, err)
            assert "sink lake: applied cut" in out
            applied = cut_of(state, "lake")
            assert applied > 0
            thread.join(timeout=600)
            (run,) = result
            job.report(result)
        assert run.error is None and run.up_to_date, behind
        assert any(line.startswith("sink lake: up to date") for line in behind), behind
        assert cut_of(state, "lake") == applied
    finally:
        held.unlink(missing_ok=True)
        resumed.unlink(missing_ok=True)
        for proc in (holder, waiting):
            if proc is not None and proc.poll() is None:
                proc.kill()
    code, report = verify(pipe.file, spark, "lake")
    assert code == 0, report
