"""`cdc status` per-follower lag (pipelines/status.py) through the real CLI.

* a follower of some tables counts only its own tables' events (a follower of `a` is not behind
  on changes to `b`);
* a follower that never applied shows its backlog (snapshot rows + events to apply), on the
  local and the Kafka log;
* lag in seconds: since the source committed the oldest event not applied yet (0 when none).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.harness import apply_once, cdc, sql, write_pipeline
from tests.harness import stream_changes as stream

pytestmark = pytest.mark.integration

TABLES_A_B = (  # two tables, 5 and 7 rows
    "CREATE TABLE a (id int PRIMARY KEY, v text)",
    "CREATE TABLE b (id int PRIMARY KEY, v text)",
    "INSERT INTO a SELECT g, 'a' FROM generate_series(1, 5) g",
    "INSERT INTO b SELECT g, 'b' FROM generate_series(1, 7) g",
)


def followers(file: Path) -> dict[str, dict]:
    run = cdc("status", file, "--json")
    assert run.code == 0, run
    return {f["sink"]: f for f in json.loads(run.out)["followers"]}


def test_status_lag_per_follower(pg_db: str, tmp_path: Path, spark) -> None:
    sql(pg_db, *TABLES_A_B)
    file = write_pipeline(
        tmp_path,
        pg_db,
        ["public.a", "public.b"],
        sinks=[
            {"name": "all", "delta": {"path": str(tmp_path / "all")}},
            {"name": "only_a", "delta": {"path": str(tmp_path / "only_a"), "tables": ["public.a"]}},
            {"name": "fresh", "delta": {"path": str(tmp_path / "fresh"), "tables": ["public.b"]}},
        ],
    )
    assert cdc("snapshot", file).code == 0
    apply_once(file, spark, "all")
    apply_once(file, spark, "only_a")

    sql(pg_db, "INSERT INTO b SELECT g, 'new' FROM generate_series(8, 10) g")  # changes to b only
    stream(file, pg_db)
    f = followers(file)
    assert f["only_a"]["events_behind_log"] == 0 and f["only_a"]["lag_s"] == 0  # b's events are not its own
    assert f["all"]["events_behind_log"] == 3 and f["all"]["lag_s"] is not None and f["all"]["lag_s"] >= 0
    # never applied: its backlog is b's 7 snapshot rows and 3 events; the oldest are snapshot rows,
    # which count from the time their snapshot started
    assert (
        f["fresh"]["position"] is None
        and f["fresh"]["events_behind_log"] == 10
        and f["fresh"]["lag_s"] is not None
    )

    text = cdc("status", file)
    assert text.code == 0, text
    lines = {line.split(":")[0].strip(): line for line in text.out.splitlines() if "follower" in line}
    assert "up to date with the log" in lines["follower only_a (delta)"]
    assert "3 events behind the log (oldest committed " in lines["follower all (delta)"]
    assert "never applied; 10 events to apply" in lines["follower fresh (delta)"]

    apply_once(file, spark, "all")
    sql(pg_db, "UPDATE a SET v = 'changed' WHERE id = 1")
    stream(file, pg_db)
    f = followers(file)
    assert f["all"]["events_behind_log"] == 1 and f["only_a"]["events_behind_log"] == 1
    assert f["only_a"]["lag_s"] is not None and f["only_a"]["lag_s"] >= 0
    apply_once(file, spark)
    f = followers(file)
    assert all(x["events_behind_log"] == 0 and x["lag_s"] == 0 for x in f.values()), f


def test_status_backlog_of_a_never_applied_follower_with_the_kafka_log(
    pg_db: str, tmp_path: Path, kafka
) -> None:
    """`log: kafka`: a follower that never applied shows its backlog over its own tables (snapshot
    records + events to apply, read from the topics), with a lag in seconds; no Spark needed."""
    from tests.fixtures.kafka_log import make_kpipe, snapshot, stream_until_current

    sql(pg_db, *TABLES_A_B)
    sinks = [
        {"name": "all", "delta": {"path": str(tmp_path / "all")}},
        {"name": "fresh", "delta": {"path": str(tmp_path / "fresh"), "tables": ["public.b"]}},
    ]
    pipe = make_kpipe(tmp_path, pg_db, ["public.a", "public.b"], kafka.bootstrap, sinks=sinks)
    snapshot(pipe)
    sql(
        pg_db,
        "INSERT INTO b SELECT g, 'new' FROM generate_series(8, 10) g",
        "UPDATE a SET v = 'x' WHERE id = 1",
    )
    stream_until_current(pipe)

    f = followers(pipe.file)
    # b: 7 snapshot records and 3 inserts; `all` also a's 5 and its update
    assert f["fresh"]["position"] is None and f["fresh"]["events_behind_log"] == 10, f
    assert f["all"]["position"] is None and f["all"]["events_behind_log"] == 16, f
    assert all(x["lag_s"] is not None and x["lag_s"] >= 0 for x in f.values()), f

    text = cdc("status", pipe.file)
    assert text.code == 0, text
    lines = {line.split(":")[0].strip(): line for line in text.out.splitlines() if "follower" in line}
    assert "never applied; 10 events to apply (oldest committed " in lines["follower fresh (delta)"], text.out
    assert "never applied; 16 events to apply (oldest committed " in lines["follower all (delta)"], text.out


def in_terminal(*args: str | Path, stop_when: str | None = None, timeout: float = 300) -> tuple[int, str]:
    """`cdc ARGS` with a pseudo-terminal as stdin/stdout/stderr, as a person runs it: (exit code,
    everything it printed). With `stop_when`, Ctrl-C (SIGINT) once that text has been printed twice
    (a refresh after the first view)."""
    import os
    import pty
    import select
    import signal
    import sys
    import time

    pid, fd = pty.fork()
    if pid == 0:  # the child: the real console entry on the terminal
        env = {**os.environ, "COLUMNS": "160", "LINES": "50", "TERM": "xterm-256color"}
        os.execve(sys.executable, [sys.executable, "-m", "pipelines.cli", *map(str, args)], env)
    out = b""
    deadline = time.monotonic() + timeout  # hang guard only
    interrupted = False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal: it has exited
                break
            if not chunk:
                break
            out += chunk
        if stop_when and not interrupted and out.decode(errors="replace").count(stop_when) >= 2:
            os.kill(pid, signal.SIGINT)
            interrupted = True
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def test_status_on_a_terminal_is_a_table_and_watch_refreshes_it(pg_db: str, tmp_path: Path) -> None:
    """Issue 16 item 7: on a terminal `cdc status` draws rich tables; `--watch` redraws them until
    Ctrl-C, which ends it with exit 0. Piped, the output stays the plain lines."""
    sql(pg_db, "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1), (2)")
    cache = {"name": "cache", "redis": {"url": "redis://127.0.0.1:1/0", "tables": ["public.t"]}}
    file = write_pipeline(tmp_path, pg_db, ["public.t"], sinks=[cache])
    assert cdc("snapshot", file, "--no-progress").code == 0

    code, out = in_terminal("status", file)
    assert code == 0, out
    assert "\x1b[" in out, out  # with colours
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
    for text in (
        "pipeline test",
        "WAL position",
        "slot confirmed",
        "log (local): cut 1",
        "followers",
        "never applied",
    ):
        assert text in out, (text, out)
    assert "┃" in out or "│" in out, out  # drawn as a table

    code, out = in_terminal("status", file, "--watch", "--interval", "0.2", stop_when="followers")
    assert code == 0, out
    assert out.count("followers") >= 2 and "Traceback" not in out, out

    piped = cdc("status", file)
    assert (
        piped.code == 0 and "│" not in piped.out and "follower cache (redis): never applied" in piped.out
    ), piped
