"""/healthz and /readyz of a real running `cdc run` (issue 34 item 5; README "Monitoring", "Health").

The pipeline reads as its own login role, so the test can take the source away for real: the role
made NOLOGIN and its walsender terminated, the stream retries (live, not ready); given back, ready
again. A stream child frozen with SIGSTOP (a hung process) makes the parent's /healthz fail."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from pipelines.devservices.postgres import LocalPostgres
from pipelines.metrics import free_port
from tests.fixtures.capture import no_traceback
from tests.harness import cdc_popen, sql, stop_process, wait_for, write_pipeline

pytestmark = pytest.mark.integration


def health(port: int, path: str) -> tuple[int, dict] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return None


def stream_child(parent: int) -> int:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def test_cdc_run_health_follows_the_source_and_a_hung_stream(
    pg: LocalPostgres, pg_db: str, tmp_path: Path
) -> None:
    role, password = f"h_{uuid.uuid4().hex[:8]}", f"Pw{uuid.uuid4().hex}"
    dbname = pg_db.rsplit("/", 1)[1]
    sql(pg.dsn(), f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{password}'")
    sql(pg_db, "CREATE TABLE t (id int PRIMARY KEY)", f"ALTER TABLE t OWNER TO {role}")
    sql(pg_db, f"GRANT CREATE ON DATABASE {dbname} TO {role}")
    pipe = write_pipeline(
        tmp_path,
        pg.dsn(dbname, user=role, password=password),
        ["public.t"],
        name="health_run",
        state_dir=str(tmp_path / "state"),
    )
    port = free_port()
    proc = cdc_popen("run", pipe, "--metrics-port", str(port))
    child = None
    try:
        ready = wait_for(
            "/readyz 200", lambda: (h := health(port, "/readyz")) and h[0] == 200 and h, proc, timeout=180
        )
        body = ready[1]
        assert body["status"] == "ok" and body["live"] and body["pipeline"] == "health_run"
        assert set(body["components"]) == {"stream"}  # no sinks: no apply
        stream = body["components"]["stream"]
        assert stream["connected"] and stream["reason"] == "streaming from slot cdc_health_run", stream
        assert health(port, "/healthz")[0] == 200

        # The source goes away: the stream retries (alive) and is not ready, saying why.
        sql(pg.dsn(), f"ALTER ROLE {role} NOLOGIN")
        sql(pg.dsn(), f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        down = wait_for("/readyz 503", lambda: (h := health(port, "/readyz")) and h[0] == 503 and h, proc)
        stream = down[1]["components"]["stream"]
        assert not stream["connected"] and stream["reason"].startswith("reconnecting to the source"), stream
        assert password not in json.dumps(down[1])
        live = health(port, "/healthz")
        assert live is not None and live[0] == 200 and live[1]["live"], live

        # Back: ready again.
        sql(pg.dsn(), f"ALTER ROLE {role} LOGIN")
        wait_for("/readyz 200 again", lambda: (h := health(port, "/readyz")) and h[0] == 200, proc)

        # A hung stream (frozen: its loop and its endpoint stop): the parent's /healthz fails.
        child = stream_child(proc.pid)
        os.kill(child, signal.SIGSTOP)
        hung = wait_for("/healthz 503", lambda: (h := health(port, "/healthz")) and h[0] == 503 and h, proc)
        assert "does not answer" in hung[1]["components"]["stream"]["reason"], hung
        os.kill(child, signal.SIGCONT)
        child = None
        wait_for("/healthz 200 again", lambda: (h := health(port, "/healthz")) and h[0] == 200, proc)
    finally:
        if child is not None:
            os.kill(child, signal.SIGCONT)
        out, err = stop_process(proc)
        sql(pg.dsn(), f"ALTER ROLE {role} LOGIN")
        sql(pg_db, f"DROP OWNED BY {role}")
    assert proc.returncode == 0, (proc.returncode, out, err)
    no_traceback((out, err))
    assert password not in out + err
