"""An apply that stops moving ends `cdc run` for its supervisor (pipelines/apply/stall.py).

The crash campaign found a `cdc run` whose Spark driver had broken without failing (its scheduler
threads died on "Out of space in CodeCache"): every later job waited forever, the followers fell
behind, and the process looked alive. Here a real `cdc run` is held inside a cut (CDC_PAUSE at the
sink's lock: no Spark task, job or step moves, as with that hang) with `spark.stall_timeout_s: 10`.
It must end by itself with exit 4, an error line and its fix on stderr and no traceback, taking its
stream child and Spark's JVM with it (nothing may hold the slot or the sink's lock); started again,
the pending cut is applied and the follower equals the source.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.fixtures.lake import FAST_JVM, LAKE, apply_ok, descendants, make_pipe, snapshot, stream, verified
from tests.harness import cdc_popen, sql

pytestmark = [pytest.mark.integration]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def test_a_cut_that_stops_moving_ends_cdc_run(pg_db: str, tmp_path: Path, spark) -> None:
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 200) g",
    )
    pipe = make_pipe(
        tmp_path, pg_db, ["public.t"], sinks=[LAKE], spark={"conf": FAST_JVM, "stall_timeout_s": 10}
    )
    snapshot(pipe)
    marker = tmp_path / "held"
    run = cdc_popen(
        "run",
        pipe.file,
        env={"CDC_PAUSE": "apply:locked", "CDC_PAUSE_FILE": str(marker), "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert run.poll() is None, f"cdc run exited {run.returncode} before its cut: {run.communicate()}"
            assert time.monotonic() < deadline, "cdc run never reached its cut"
            time.sleep(0.1)
        below = descendants(run.pid)
        assert any("pipelines.cli stream" in c for c in below.values()), below
        assert any("java" in c for c in below.values()), below
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 4, (out, err)
    assert "error: the apply has not moved for 1" in err, err  # 10-19 s: polled every 2 s
    assert "  fix: " in err and "spark.stall_timeout_s" in err, err
    assert "Traceback" not in err + out, err
    time.sleep(2)  # the JVM notices its Python side is gone
    assert not [p for p in below if alive(p)], {p: below[p] for p in below if alive(p)}

    # Started again (its supervisor): the held cut is applied, then a change after it.
    marker.unlink()
    sql(pg_db, "UPDATE t SET v = 'after' WHERE id <= 50", "DELETE FROM t WHERE id > 190")
    stream(pipe)
    apply_ok(pipe, spark)
    verified(pipe, spark)
    assert os.path.exists(pipe.dir / "lake" / "public" / "t" / "_delta_log")
