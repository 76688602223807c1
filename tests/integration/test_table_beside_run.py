"""Issue 33.4 with a real `cdc run`: a table added to the pipeline file and snapshotted with
`cdc snapshot --tables` beside the running `cdc run` (which holds the file's metrics.port) is
snapshotted without binding that port, and the running `cdc run` applies it, and its later
changes, with no restart and no separate `cdc apply`."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines.metrics import free_port
from tests.fixtures.capture import make_pipe, no_traceback
from tests.fixtures.workload import make_table
from tests.harness import cdc, cdc_popen, edit_pipeline, sql, stop_process, verify, wait_for

pytestmark = pytest.mark.integration


def test_a_table_snapshotted_beside_a_running_cdc_run_is_applied(tmp_path: Path, pg_db, spark):
    make_table(pg_db, "public.t", 20)
    make_table(pg_db, "public.usage_events", 30)
    port = free_port()
    pipe = make_pipe(
        tmp_path,
        pg_db,
        ["public.t"],
        sinks=[{"name": "lake", "delta": {"path": "lake"}}],
        metrics={"port": port},
        spark={"master": "local[1]", "trigger_interval_s": 1},
    )

    def rows(table: str) -> dict:
        """The Delta follower's {id: v} read with delta-rs ({} before the table exists)."""
        path = tmp_path / "lake" / "public" / table.split(".")[1]
        try:
            found = DeltaTable(str(path)).to_pyarrow_table(columns=["id", "v"]).to_pylist()
        except Exception:  # not created yet (no table, or no commit in it yet)
            return {}
        return {str(r["id"]): r["v"] for r in found}

    proc = cdc_popen("run", pipe.file)
    try:
        wait_for("public.t in the lake", lambda: len(rows("public.t")) == 20, proc, timeout=300)
        edit_pipeline(
            pipe.file, lambda doc: doc["source"]["postgres"]["tables"].append("public.usage_events")
        )
        snap = cdc("snapshot", pipe.file, "--tables", "public.usage_events")
        assert snap.code == 0, snap.out + snap.err
        no_traceback(snap)
        assert f"port {port} (metrics.port) is in use" in snap.out + snap.err
        sql(
            pg_db,
            "UPDATE usage_events SET v = 'changed' WHERE id = 1",
            "UPDATE t SET v = 'also' WHERE id = 2",
        )
        wait_for(
            "public.usage_events and its change in the lake",
            lambda: (
                len(rows("public.usage_events")) == 30 and rows("public.usage_events").get("1") == "changed"
            ),
            proc,
            timeout=300,
        )
        wait_for("the change of public.t", lambda: rows("public.t").get("2") == "also", proc, timeout=300)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as page:
            assert b"pgcdc_up" in page.read()  # cdc run kept its endpoint
    finally:
        out, err = stop_process(proc, 180)
    assert proc.returncode == 0, f"cdc run exited {proc.returncode}:\n{out}\n{err}"
    assert "following tables public.t, public.usage_events" in out + err, out + err
    code, report = verify(pipe.file, spark)
    assert code == 0, report
