"""The example Airflow DAGs (examples/airflow/cdc_dag.py) in a real Airflow 3 (.venv-airflow, its
own virtualenv made by scripts/setup.sh), against the local PostgreSQL and real `cdc` commands.

One Airflow process (its start-up, the in-process execution API, costs most of the time) runs a
DAG run of each DAG, as `airflow dags test` does (`DAG.test()`, its code path). The pipeline file
is the DAG's default, pipeline.yml beside it; the cdc executable and the lag threshold come from
Airflow Variables (AIRFLOW_VAR_* in the environment). Its two followers:

* `lake` (Delta) is applied by the DAG's `apply` task: verified afterwards with `cdc verify` and
  read back with delta-rs; the lag alert does not name it;
* `cache` (Redis, nobody listens on its port) fails: so `cdc apply` exits 4 and the task fails
  with the exit code's meaning and cdc's own error and fix lines, and the lag alert
  (`check_lag`, threshold 0 s) fires for that follower, also through the on_failure_callback,
  and for the slot (WAL written while no stream reads it: over the 0-byte threshold, and inactive);
* `cdc_log_compact` compacts the log (its run succeeds).

One `cdc apply` (one Spark start) serves both followers: a failing sink does not stop the others.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.fixtures.capture import Pipe
from tests.fixtures.lake import FAST_JVM, snapshot
from tests.fixtures.readers import delta_rows
from tests.harness import REPO, source_rows, sql, stream_changes, verify, write_pipeline

pytestmark = [pytest.mark.integration]

AIRFLOW_BIN = REPO / ".venv-airflow" / "bin"
DAG_FILE = REPO / "examples" / "airflow" / "cdc_dag.py"

# Runs in .venv-airflow: parse the dags folder as the scheduler does, one DagRun per DAG
# (DAG.test(), what `airflow dags test` calls), then every task instance's state as JSON.
RUNNER = textwrap.dedent(
    """
    import json, sys
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(sys.argv[1])
    assert not bag.import_errors, bag.import_errors
    states = {}
    for dag_id in sys.argv[2:]:
        run = bag.get_dag(dag_id).test()
        states[dag_id] = {"run": str(run.state)} | {
            f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in run.get_task_instances()
        }
    print("STATES " + json.dumps(states), flush=True)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_airflow_dags_apply_alert_and_compact(pg_db: str, tmp_path: Path, spark) -> None:
    assert (AIRFLOW_BIN / "airflow").exists(), (
        "Airflow is missing: scripts/setup.sh installs it into .venv-airflow (unless CDC_SKIP_AIRFLOW is set)"
    )
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 40) g",
    )
    home = tmp_path / "airflow"
    dags = home / "dags"
    dags.mkdir(parents=True)
    shutil.copy(DAG_FILE, dags)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_VAR_CDC_BIN": str(REPO / ".venv" / "bin" / "cdc"),
        "AIRFLOW_VAR_CDC_MAX_LAG_S": "0",  # any follower with changes to apply is over it
        "AIRFLOW_VAR_CDC_MAX_SLOT_LAG_BYTES": "0",  # WAL written after the stream stopped is over it
    }
    # Airflow's metadata DB (SQLite in AIRFLOW_HOME) is made while the pipeline is set up
    migrate = subprocess.Popen(
        [AIRFLOW_BIN / "airflow", "db", "migrate"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    sinks = [
        {"name": "lake", "delta": {"path": str(tmp_path / "delta")}},
        {"name": "cache", "redis": {"url": dead, "tables": ["public.t"]}},
    ]
    # the DAG's default file; the apply task's JVM with C1-only JIT (a short-lived JVM)
    file = write_pipeline(dags, pg_db, ["public.t"], name="pipeline", sinks=sinks, spark={"conf": FAST_JVM})
    snapshot(Pipe(dags, file, pg_db, "pipeline"))  # in-process: the DAG runs the `cdc` commands under test
    sql(
        pg_db,
        "UPDATE t SET v = 'new' WHERE id <= 5",
        "DELETE FROM t WHERE id > 35",
        "UPDATE t SET v = 'x' WHERE id = 1",
    )
    stream_changes(file, pg_db)  # updates, deletes and an older event of key 1 for compaction
    # the stream is not running now (as if `cdc stream` died): WAL the slot has not confirmed
    sql(
        pg_db, "CREATE TABLE not_captured (id int)", "INSERT INTO not_captured SELECT generate_series(1, 100)"
    )

    out, _ = migrate.communicate(timeout=600)
    assert migrate.returncode == 0, out
    run = subprocess.run(
        [AIRFLOW_BIN / "python", "-c", RUNNER, str(dags), "cdc_apply", "cdc_log_compact"],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,  # under pytest's 900 s: a hung Airflow fails with its output
        check=False,
    )
    out = run.stdout + run.stderr
    (tmp_path / "airflow.log").write_text(out)  # for a failing assert: the whole Airflow output
    assert run.returncode == 0, out[-5000:]
    states = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("STATES "))[7:])
    assert states == {
        "cdc_apply": {
            "run": "failed",
            "pipelines[-1]": "success",
            "apply[0]": "failed",
            "check_lag[0]": "failed",
        },
        "cdc_log_compact": {"run": "success", "pipelines[-1]": "success", "compact[0]": "success"},
    }, out[-5000:]

    # apply's failure says what exit 4 means, with cdc's own lines (the Redis URL, the fix)
    failed = f"`cdc apply {file} --once` exited 4: runtime failure"
    assert failed in out, out[-5000:]
    said = out[out.index(failed) :].splitlines()[1:3]
    assert said[0].startswith("  sink cache: FAILED: ") and dead in said[0], said
    assert said[1].startswith("  fix: check that Redis is running"), said
    # the lag alert names the lagging follower only; the failure callback ran for both tasks
    assert "CDC LAG ALERT: " in out and "follower cache (redis) of pipeline pipeline: lag " in out
    assert "follower lake (delta) of pipeline" not in out
    # the slot's lag too: the log behind the source, and no stream reading the slot
    slot = f"slot {Pipe(dags, file, pg_db, 'pipeline').slot} of pipeline pipeline"
    assert f"{slot}: lag " in out and " bytes > 0 bytes of WAL" in out, out[-5000:]
    assert f"{slot}: no stream reads it (is `cdc stream` running?)" in out, out[-5000:]
    assert "CDC ALERT: cdc_apply.apply[0] failed" in out and "CDC ALERT: cdc_apply.check_lag[0] failed" in out
    assert "public.t: events 11 -> 10" in out  # cdc log compact's report: key 1's older event went

    # the follower the DAG applied: cdc verify and delta-rs agree with the source
    code, report = verify(file, spark, "lake")
    assert code == 0, report
    got = delta_rows(spark, tmp_path / "delta" / "public" / "t")
    want = source_rows(pg_db, "public.t", ["id"])
    assert {k: r["v"] for k, r in got.items()} == {k: r["v"] for k, r in want.items()}
    assert len(got) == 35 and got[("1",)]["v"] == "x"
