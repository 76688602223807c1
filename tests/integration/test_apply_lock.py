"""Overlapping `cdc apply` runs on one follower (pipelines/locks.py), with real processes.

A first `cdc apply --once` is held right after taking the sink's lock (CDC_PAUSE); a second one
leaves the sink to it (exit 4, naming the holder's pid), a third with --lock-wait waits and then
finds the follower up to date; a holder killed with SIGKILL releases the lock (the kernel drops an
flock with its process) and the next run applies. The follower then equals the source.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from cdc.ground.config import load_pipeline
from pipelines.checkpoints import checkpoint_dir
from tests.harness import cdc, cdc_popen, flush_wal, sql, stream_until_current, verify, write_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.slow]

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
    file = write_pipeline(
        tmp_path, pg_db, ["public.t"], sinks=[{"name": "lake", "delta": {"path": str(tmp_path / "lake")}}]
    )
    state = load_pipeline(file).state_path
    assert cdc("snapshot", file).code == 0

    marker = tmp_path / "paused"
    first = cdc_popen(
        "apply",
        file,
        "--once",
        env={"CDC_PAUSE": "apply:locked", "CDC_PAUSE_FILE": str(marker), **UNBUFFERED},
    )
    try:
        wait_for_file(marker, first)
        # a second run while the first holds the sink: it leaves the sink alone and says who has it
        second = cdc("apply", file, "--once")
        assert second.code == 4, second
        text = second.out + second.err
        assert "another cdc apply is applying this follower" in text and f"pid {first.pid}" in text, text
        assert "--lock-wait" in text and "Traceback" not in text
        assert cut_of(state, "lake") == 0  # nothing written by either yet

        # a third run that waits: it says so, and gets the sink once the first is done
        third = cdc_popen("apply", file, "--once", "--lock-wait", "600", env=UNBUFFERED)
        try:
            waiting = read_until(third, "waiting up to 600s for another cdc apply")
            assert f"pid {first.pid}" in waiting[-1]
            marker.unlink()  # let the first run go on
            out, err = first.communicate(timeout=600)
            assert first.returncode == 0, (out, err)
            assert "sink lake: applied cut" in out
            applied = cut_of(state, "lake")
            assert applied > 0
            out, err = third.communicate(timeout=600)
            assert third.returncode == 0, (out, err)
            assert "sink lake: up to date" in out  # the cut the first run applied, not applied twice
            assert cut_of(state, "lake") == applied
        finally:
            if third.poll() is None:
                third.kill()
    finally:
        marker.unlink(missing_ok=True)
        if first.poll() is None:
            first.kill()

    # a holder that dies (kill -9) releases the lock: the next run applies
    sql(pg_db, "INSERT INTO t VALUES (21, 'new')", "UPDATE t SET v = 'changed' WHERE id = 1")
    flush_wal(pg_db)
    stream_until_current(file)
    crashed = cdc_popen(
        "apply", file, "--once", env={"CDC_PAUSE": "apply:locked", "CDC_PAUSE_FILE": str(marker)}
    )
    try:
        wait_for_file(marker, crashed)
        os.kill(crashed.pid, 9)
        crashed.wait(timeout=60)
    finally:
        marker.unlink(missing_ok=True)
    after = cdc("apply", file, "--once")
    assert after.code == 0, after
    assert "sink lake: applied cut" in after.out
    code, report = verify(file, spark, "lake")
    assert code == 0, report
