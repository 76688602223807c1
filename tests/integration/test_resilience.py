"""Resilience and operations of `cdc stream`/`cdc run`/`cdc teardown` against real PostgreSQL:
reconnecting after a lost connection, exit codes, who holds a slot, teardown rights, state_dir
problems, validate's statements for the owner, `dev up` output and closed pipes."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from pipelines.devservices.postgres import LocalPostgres
from tests.fixtures.capture import (
    assert_log_well_formed,
    assert_same,
    assert_txns_streamed,
    make_pipe,
    no_traceback,
    slot_info,
    snapshot,
    start_stream,
    stop_stream,
    stream_until_current,
    wait_slot,
)
from tests.fixtures.readers import delta_rows
from tests.fixtures.services import postgres
from tests.fixtures.workload import Writer, make_table
from tests.harness import apply_once, cdc, cdc_popen, materialize, source_rows, sql, verify, wait_for

pytestmark = pytest.mark.integration


def stream_walsender(dsn: str, slot: str) -> int | None:
    """The server process of the `cdc stream` reading the slot (not a snapshot's connection)."""
    rows = sql(
        dsn,
        "SELECT s.active_pid FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid "
        "WHERE s.slot_name = %s AND a.application_name LIKE 'cdc stream %%'",
        params=(slot,),
    )
    return rows[0][0] if rows else None


def marker_in_log(log: Path, table: str, key: tuple) -> bool:
    try:
        return key in materialize(log, table).get(table, {})
    except Exception:  # the log may not exist or be mid-commit yet
        return False


# ---- issue 11 item 9: reconnect --------------------------------------------------------------------
def test_stream_reconnects_after_walsender_is_terminated(pg_db: str, tmp_path: Path) -> None:
    """pg_terminate_backend of the walsender (twice) under write load: `cdc stream` says it lost
    the connection, reconnects, resumes from the slot; the log ends identical to the source with
    every transaction exactly once."""
    make_table(pg_db, "t", 200)
    sql(pg_db, "CREATE TABLE m (id int PRIMARY KEY, v text)")  # the last write goes here (not the writer's)
    pipe = make_pipe(tmp_path, pg_db, ["public.t", "public.m"], stream={"reconnect_timeout_s": 120})
    snapshot(pipe)
    writer = Writer(
        pg_db, "t", list(range(1, 201)), next_id=1001, seed=11, inserts=(0, 5), updates=(0, 5), deletes=(0, 2)
    )
    writer.start()
    proc = start_stream(pipe)
    try:
        for _ in range(2):
            writer.wait_txns(len(writer.txns) + 100)
            walsender = slot_info(pg_db, pipe.slot)[0]
            assert walsender is not None
            sql(pg_db, "SELECT pg_terminate_backend(%s)", params=(walsender,))
            wait_for(
                "the stream to take the slot again",
                lambda w=walsender: (
                    (info := slot_info(pg_db, pipe.slot)) is not None and info[0] not in (None, w)
                ),
                proc,
            )
        writer.finish()
        sql(pg_db, "INSERT INTO m VALUES (1, 'last')")
        wait_for("the last insert in the log", lambda: marker_in_log(pipe.log, "public.m", ("1",)), proc)
        out, _err = stop_stream(proc)
    finally:
        writer.halt.set()
        if proc.poll() is None:
            proc.kill()
    assert out.count("lost the connection to the source") == 2, out
    assert out.count("reconnected after") == 2, out
    # transactions resent after a reconnect are counted once
    assert f"streamed {writer.changes + 1:,} events in {len(writer.txns) + 1:,} transactions" in out, out
    assert_txns_streamed(pipe, "public.t", writer.txns)
    assert_same(
        pipe, {"public.t": ["id"], "public.m": ["id"]}
    )  # no catch-up run: the reconnected stream did it all
    assert_log_well_formed(pipe)


@pytest.fixture
def own_pg():
    """A PostgreSQL cluster of this test alone (it gets restarted; the session's `pg` is shared)."""
    with postgres("cdc-test-own-pg-") as server:
        yield server


def test_server_restart_during_cdc_run(own_pg: LocalPostgres, tmp_path: Path, spark) -> None:
    """The source server restarts while `cdc run` streams and applies: the stream reconnects by
    itself, `cdc run` keeps going, and afterwards the log and the Delta follower equal the source
    (cdc verify exit 0) with every transaction exactly once."""
    dsn = own_pg.dsn()
    make_table(dsn, "t", 300)
    sql(dsn, "CREATE TABLE m (id int PRIMARY KEY, v text)")
    pipe = make_pipe(
        tmp_path,
        dsn,
        ["public.t", "public.m"],
        sinks=[{"name": "lake", "delta": {"path": str(tmp_path / "lake")}}],
        spark={"master": "local[1]", "trigger_interval_s": 1},
        stream={"reconnect_timeout_s": 180},
    )
    before = Writer(
        dsn,
        "t",
        list(range(1, 301)),
        next_id=10_001,
        seed=12,
        inserts=(0, 5),
        updates=(0, 5),
        deletes=(0, 2),
        max_txns=300,
    )
    proc = cdc_popen("run", pipe.file)
    try:
        wait_for("cdc run to stream", lambda: stream_walsender(dsn, pipe.slot) is not None, proc, 300)
        before.start()
        before.finish()
        own_pg.stop()
        own_pg.start()
        wait_for(
            "the stream to take the slot again",
            lambda: stream_walsender(dsn, pipe.slot) is not None,
            proc,
            300,
        )
        after = Writer(
            dsn,
            "t",
            before.live,
            next_id=before.next_id,
            seed=13,
            inserts=(0, 5),
            updates=(0, 5),
            deletes=(0, 2),
            max_txns=300,
        )
        after.start()
        after.finish()
        sql(dsn, "INSERT INTO m VALUES (1, 'last')")
        wait_for("the last insert in the log", lambda: marker_in_log(pipe.log, "public.m", ("1",)), proc, 300)
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"cdc run did not stop within 180s of SIGTERM:\n{out}\n{err}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"cdc run exited {proc.returncode}:\n{out}\n{err}"
    no_traceback((out, err))
    assert "lost the connection to the source" in out and "reconnected after" in out, out
    assert_txns_streamed(pipe, "public.t", before.txns + after.txns)
    assert_same(pipe, {"public.t": ["id"], "public.m": ["id"]})
    assert_log_well_formed(pipe)
    apply_once(pipe.file, spark)
    code, report = verify(pipe.file, spark)
    assert code == 0, report


def test_reconnect_timeout_zero_gives_up_at_once_with_a_fix(pg_db: str, tmp_path: Path) -> None:
    """stream.reconnect_timeout_s: 0 and the walsender terminated: exit 3 at once, with the lost
    connection and a fix line; the next `cdc stream` resumes from the slot and loses nothing."""
    make_table(pg_db, "t", 20)
    pipe = make_pipe(tmp_path, pg_db, ["public.t"], stream={"reconnect_timeout_s": 0})
    snapshot(pipe)
    proc = start_stream(pipe)
    try:
        sql(pg_db, "UPDATE t SET v = 'before' WHERE id <= 5")
        sql(pg_db, "SELECT pg_terminate_backend(%s)", params=(slot_info(pg_db, pipe.slot)[0],))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, (proc.returncode, out, err)
    assert "error: lost the connection to the source: " in err, err
    assert "  fix: run `cdc stream` again once the server is reachable: it resumes from the slot" in err, err
    assert "stream.reconnect_timeout_s" in err and "reconnecting for up to" not in out, (out, err)
    no_traceback((out, err))
    sql(pg_db, "DELETE FROM t WHERE id > 15")
    stream_until_current(pipe)
    assert_same(pipe, {"public.t": ["id"]})
    assert_log_well_formed(pipe)


def test_stream_gives_up_when_the_server_stays_down(own_pg: LocalPostgres, tmp_path: Path) -> None:
    """The source server stops and stays down longer than stream.reconnect_timeout_s (3 s): exit 3
    saying it gave up after 3 s, with a fix; once the server is back, `cdc stream --until current`
    brings the log to the source (nothing lost, every transaction once)."""
    dsn = own_pg.dsn()
    make_table(dsn, "t", 50)
    pipe = make_pipe(tmp_path, dsn, ["public.t"], stream={"reconnect_timeout_s": 3})
    snapshot(pipe)
    proc = start_stream(pipe)
    try:
        sql(dsn, "UPDATE t SET v = 'before the stop' WHERE id <= 10", "DELETE FROM t WHERE id > 45")
        own_pg.stop()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        if not own_pg.running():
            own_pg.start()
    assert proc.returncode == 3, (proc.returncode, out, err)
    assert "lost the connection to the source" in out and "reconnecting for up to 3s" in out, out
    assert "error: lost the connection to the source and could not reconnect within 3s (" in err, err
    assert "  fix: check that the server is up and reachable, then run `cdc stream` again" in err, err
    assert "raise stream.reconnect_timeout_s to wait longer" in err, err
    no_traceback((out, err))
    sql(dsn, "INSERT INTO t SELECT g, 'after the restart' FROM generate_series(100, 110) g")
    stream_until_current(pipe)
    assert_same(pipe, {"public.t": ["id"]})
    assert_log_well_formed(pipe)


def test_slot_dropped_while_disconnected_is_a_clear_error(
    pg_db: str, lp_role: tuple[str, str], least_privilege: str, tmp_path: Path
) -> None:
    """The stream lost its connection and, while it retries, its slot is dropped: the reconnect
    stops retrying and exits 3 with the remedy (`cdc snapshot`). The stream's role is kept from
    logging in meanwhile, so the slot is dropped for sure before it comes back."""
    role, dsn = lp_role[0], least_privilege
    pipe = make_pipe(tmp_path, dsn, ["public.t"], stream={"reconnect_timeout_s": 300})
    snapshot(pipe)
    proc = start_stream(pipe)
    try:
        sql(pg_db, f"ALTER ROLE {role} NOLOGIN")
        sql(pg_db, "SELECT pg_terminate_backend(%s)", params=(slot_info(pg_db, pipe.slot)[0],))
        wait_slot(pg_db, pipe.slot, active=False)
        sql(pg_db, "SELECT pg_drop_replication_slot(%s)", params=(pipe.slot,))
        sql(pg_db, f"ALTER ROLE {role} LOGIN")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, (proc.returncode, out, err)
    assert "lost the connection to the source" in out and "reconnect attempt 1 failed" in out, out
    assert f"error: replication slot {pipe.slot} no longer exists" in err, err
    assert f"  fix: run `cdc snapshot {pipe.file}`: it creates the slot again" in err, err
    no_traceback((out, err))


def test_invalidated_slot_is_a_clear_error(pg: LocalPostgres, pg_db: str, tmp_path: Path) -> None:
    """A stopped pipeline whose slot the server invalidated (max_slot_wal_keep_size, README Managed
    PostgreSQL): `cdc stream` exits 3 saying so, and the printed remedy (drop the slot, `cdc
    snapshot`) brings the log back to the source."""
    make_table(pg_db, "t", 10)
    pipe = make_pipe(tmp_path, pg_db, ["public.t"])
    snapshot(pipe)
    sql(pg.dsn(), "ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()")
    try:  # the slot's WAL falls out of the 1 MB it may keep, and a checkpoint invalidates it
        for i in range(4):
            sql(pg_db, f"INSERT INTO t VALUES ({100 + i}, 'while stopped')", "SELECT pg_switch_wal()")
        sql(pg_db, "CHECKPOINT")
        status = sql(
            pg_db, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", params=(pipe.slot,)
        )
        assert status == [("lost",)], status
    finally:
        sql(pg.dsn(), "ALTER SYSTEM RESET max_slot_wal_keep_size", "SELECT pg_reload_conf()")
    run = cdc("stream", pipe.file, "--until", "current")
    assert run.code == 3, run
    assert f"error: replication slot {pipe.slot} was invalidated (the server removed WAL" in run.err, run.err
    assert (
        f"drop it (SELECT pg_drop_replication_slot('{pipe.slot}');), then run `cdc snapshot {pipe.file}`"
        in run.err
    ), run.err
    no_traceback(run)
    sql(pg_db, "SELECT pg_drop_replication_slot(%s)", params=(pipe.slot,))  # the remedy, as printed
    snapshot(pipe)
    stream_until_current(pipe)
    assert_same(pipe, {"public.t": ["id"]})


# ---- issue 11 item 7: exit codes ---------------------------------------------------------------------
def test_stream_exit_codes(pg_db: str, tmp_path: Path) -> None:
    """SIGTERM of a continuous stream: 0 (a requested stop, as systemd expects); of a stream with
    --until that has not reached its target: 130 with a fix; a slot dropped since: 3 with the remedy."""
    make_table(pg_db, "t", 10)
    pipe = make_pipe(tmp_path, pg_db, ["public.t"])
    snapshot(pipe)
    stop_stream(start_stream(pipe), signal.SIGTERM)  # asserts exit 0

    proc = cdc_popen("stream", pipe.file, "--until", "FF/0")  # far ahead: never reached
    wait_for(
        "the stream to start",
        lambda: (info := slot_info(pg_db, pipe.slot)) is not None and info[0] is not None,
        proc,
    )
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert (
        "interrupted before --until FF/0 was reached" in err and "  fix: run the same command again" in err
    ), err
    no_traceback((out, err))

    sql(pg_db, "SELECT pg_drop_replication_slot(%s)", params=(pipe.slot,))
    run = cdc("stream", pipe.file, "--until", "current")
    assert run.code == 3, run
    assert f"error: replication slot {pipe.slot} no longer exists" in run.err, run.err
    assert f"  fix: run `cdc snapshot {pipe.file}`: it creates the slot again" in run.err, run.err
    no_traceback(run)


def test_stream_before_any_snapshot_is_a_slot_problem(pg_db: str, tmp_path: Path) -> None:
    make_table(pg_db, "t", 1)
    pipe = make_pipe(tmp_path, pg_db, ["public.t"])
    run = cdc("stream", pipe.file, "--until", "current")
    assert run.code == 3, run
    assert "does not exist yet" in run.err and f"  fix: run `cdc snapshot {pipe.file}` first" in run.err, (
        run.err
    )


# ---- issue 11 item 13: who holds the slot ---------------------------------------------------------------
def test_slot_in_use_names_the_holder(pg_db: str, tmp_path: Path) -> None:
    """A second `cdc stream` names the first one's process and host (from the walsender's
    application_name); a slot held by another client names it and says how to find and end it."""
    import socket

    import psycopg2
    import psycopg2.extras

    make_table(pg_db, "t", 10)
    pipe = make_pipe(tmp_path, pg_db, ["public.t"])
    snapshot(pipe)
    proc = start_stream(pipe)
    try:
        run = cdc("stream", pipe.file)
        validate = cdc("validate", pipe.file)
    finally:
        stop_stream(proc)
    assert run.code == 3, run
    holder = f"`cdc stream` process {proc.pid} on host {socket.gethostname()} (pipeline test"
    assert holder in run.err, run.err
    assert f"kill -TERM {proc.pid}" in run.err and "pg_terminate_backend(" in run.err, run.err
    assert holder in validate.out, validate.out

    other = psycopg2.connect(
        pg_db, connection_factory=psycopg2.extras.LogicalReplicationConnection, application_name="other-tool"
    )
    try:
        other.cursor().start_replication(
            slot_name=pipe.slot, decode=False, options={"proto_version": "1", "publication_names": "cdc_test"}
        )
        walsender = slot_info(pg_db, pipe.slot)[0]
        run = cdc("stream", pipe.file)
    finally:
        other.close()
    assert run.code == 3, run
    assert f"in use by server process {walsender}, application_name 'other-tool'" in run.err, run.err
    assert f"WHERE pid = {walsender}" in run.err and f"pg_terminate_backend({walsender})" in run.err, run.err


# ---- issue 11 item 11: teardown ------------------------------------------------------------------------
@pytest.fixture
def lp_role(pg_db: str):
    """A least-privilege role: LOGIN REPLICATION, nothing else yet. Yields (role, its DSN)."""
    import uuid

    from psycopg2.extensions import make_dsn

    role = "cdc_lp_" + uuid.uuid4().hex[:8]
    sql(pg_db, f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'lp-secret'")
    try:
        yield role, make_dsn(pg_db, user=role, password="lp-secret")
    finally:
        sql(pg_db, f"DROP OWNED BY {role}", f"DROP ROLE {role}")


@pytest.fixture
def least_privilege(pg_db: str, lp_role: tuple[str, str]) -> str:
    """The role with SELECT on public.t only; the table and the publication belong to the superuser
    (as the README's Operations section sets it up). Returns its DSN."""
    role, dsn = lp_role
    make_table(pg_db, "t", 20)
    sql(
        pg_db,
        "CREATE PUBLICATION cdc_test FOR TABLE public.t WITH (publish_via_partition_root = true)",
        f"GRANT SELECT ON public.t TO {role}",
    )
    return dsn


def run_cdc_no_tty(*args) -> subprocess.CompletedProcess:
    """`cdc` with stdin not a terminal (as under cron or CI)."""
    import os
    import sys

    from tests.harness import REPO

    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=dict(os.environ),
        check=False,
    )


def test_teardown_refuses_without_terminal_and_checks_rights_first(
    pg_db: str, least_privilege: str, tmp_path: Path
) -> None:
    pipe = make_pipe(tmp_path, least_privilege, ["public.t"])
    snapshot(pipe)
    assert (pipe.log / "log.db").exists()

    run = run_cdc_no_tty("teardown", pipe.file, "--drop-slot")
    assert run.returncode == 2, run
    assert "no terminal to confirm" in run.stderr and "  fix: pass --yes" in run.stderr, run.stderr
    assert (pipe.log / "log.db").exists() and slot_info(pg_db, pipe.slot) is not None

    run = run_cdc_no_tty("teardown", pipe.file, "--drop-slot", "--yes")
    assert run.returncode == 3, run
    assert (
        "nothing was changed" in run.stderr
        and "cannot drop publication cdc_test (owned by postgres)" in run.stderr
    ), run.stderr
    assert "  fix: ask postgres (or a superuser) to run DROP PUBLICATION cdc_test;" in run.stderr, run.stderr
    no_traceback((run.stdout, run.stderr))
    assert (pipe.log / "log.db").exists() and slot_info(pg_db, pipe.slot) is not None  # nothing half-done
    again = run_cdc_no_tty("teardown", pipe.file, "--drop-slot", "--yes")
    assert (again.returncode, again.stderr) == (run.returncode, run.stderr)  # the same, not worse

    sql(pg_db, "DROP PUBLICATION cdc_test;")  # what the fix line says the owner must run
    run = run_cdc_no_tty("teardown", pipe.file, "--drop-slot", "--yes")
    assert run.returncode == 0, run
    assert "dropped replication slot cdc_test" in run.stdout, run.stdout
    assert slot_info(pg_db, pipe.slot) is None and not (pipe.log / "log.db").exists()


# ---- issue 11 item 12: a state_dir that cannot be used ---------------------------------------------------
@pytest.mark.parametrize("layout", ["below_a_file", "is_a_file"])
def test_unusable_state_dir_is_a_clear_error_for_every_verb(pg_db: str, tmp_path: Path, layout: str) -> None:
    """As root, chmod does not stop writes, so the state_dir is made unusable with a regular file:
    every verb exits 2 naming the path with a fix (not "internal error", exit 4); validate reports
    it as a FAIL line."""
    make_table(pg_db, "t", 3)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory\n")
    state = blocker / "state" if layout == "below_a_file" else blocker
    pipe = make_pipe(tmp_path, pg_db, ["public.t"], state_dir=str(state))
    run = cdc("validate", pipe.file)
    assert run.code == 2, run
    assert f"FAIL state_dir {state}:" in run.out and "is a file, not a directory" in run.out, run.out
    assert "fix: set state_dir in the pipeline file" in run.out, run.out
    verbs = [
        (["snapshot"], ["--no-progress"]),
        (["stream"], ["--until", "current"]),
        (["apply"], ["--once"]),
        (["run"], []),
        (["verify"], []),
        (["status"], []),
        (["log", "read"], []),
        (["log", "compact"], []),
        (["teardown"], ["--yes"]),
    ]
    for verb, options in verbs:
        args = [*verb, pipe.file, *options]
        run = cdc(*args)
        assert run.code == 2, (args, run)
        assert f"error: state_dir {state}:" in run.err and "  fix: set state_dir" in run.err, (args, run.err)
        no_traceback(run)


# ---- issue 11 item 6: validate's statements for a role that does not own the tables --------------------------
def printed_statements(output: str) -> list[str]:
    import re

    return re.findall(r"((?:CREATE|ALTER) PUBLICATION .*?;)", output)


def test_validate_prints_publication_statements_that_work(
    pg_db: str, lp_role: tuple[str, str], tmp_path: Path
) -> None:
    """Tables owned by someone else, one of them partitioned: validate prints one statement per
    problem, never GRANT CREATE ON DATABASE; the owner runs them as printed and validate passes;
    then the partitioned table's changes reach the log."""
    role, dsn = lp_role
    sql(
        pg_db,
        "CREATE TABLE a (id int PRIMARY KEY, v text)",
        "CREATE TABLE p (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region)",
        "CREATE TABLE p_eu PARTITION OF p FOR VALUES IN ('eu')",
        "CREATE TABLE p_us PARTITION OF p FOR VALUES IN ('us')",
        f"GRANT SELECT ON a, p, p_eu, p_us TO {role}",
    )
    pipe = make_pipe(tmp_path, dsn, ["public.a", "public.p"])

    run = cdc("validate", pipe.file)  # no publication: one CREATE PUBLICATION for both tables
    assert run.code == 3, run
    assert "GRANT CREATE ON DATABASE" not in run.out, run.out
    statements = printed_statements(run.out)
    assert statements == [
        "CREATE PUBLICATION cdc_test FOR TABLE public.a, public.p WITH (publish_via_partition_root = true);"
    ], run.out
    sql(pg_db, *statements)
    ok_run = cdc("validate", pipe.file)
    assert ok_run.code == 0, ok_run

    # a publication made by hand: the partitioned table in it without publish_via_partition_root, `a` missing
    sql(pg_db, "DROP PUBLICATION cdc_test", "CREATE PUBLICATION cdc_test FOR TABLE p")
    run = cdc("validate", pipe.file)
    assert run.code == 3, run
    statements = printed_statements(run.out)
    assert statements == [
        "ALTER PUBLICATION cdc_test ADD TABLE public.a;",
        "ALTER PUBLICATION cdc_test SET (publish_via_partition_root = true);",
    ], run.out
    assert "ADD TABLE public.p" not in run.out and "GRANT CREATE ON DATABASE" not in run.out, run.out
    sql(pg_db, *statements)
    ok_run = cdc("validate", pipe.file)
    assert ok_run.code == 0, ok_run

    snapshot(pipe)
    sql(pg_db, "INSERT INTO p VALUES (1, 'eu', 'x'), (2, 'us', 'y')", "INSERT INTO a VALUES (1, 'a')")
    sql(pg_db, "SET synchronous_commit = on", "CREATE TEMP TABLE flush_it(x int)")
    run = cdc("stream", pipe.file, "--until", "current")
    assert run.code == 0, run
    assert_same(pipe, {"public.a": ["id"], "public.p": ["id", "region"]})


# ---- issue 22 item 9: the reader of stdout goes away --------------------------------------------------------
def test_closed_stdout_exits_quietly(pg_db: str, tmp_path: Path) -> None:
    """`cdc log read ... | head -1` and `cdc status | head -2`: no "internal error", no traceback,
    the exit status of a process ended by SIGPIPE (141), like cat or grep."""
    make_table(pg_db, "t", 3000)  # far more than a pipe buffer of JSON lines
    pipe = make_pipe(tmp_path, pg_db, ["public.t"])
    snapshot(pipe)
    assert_quiet_when_stdout_closes(pipe.file)


def test_closed_stdout_exits_quietly_with_the_kafka_log(pg_db: str, tmp_path: Path, kafka) -> None:
    """The same with `log: kafka` (records read from the topics, status from the cuts topic)."""
    from tests.fixtures import kafka_log as kl

    make_table(pg_db, "t", 3000)
    pipe = kl.make_kpipe(tmp_path, pg_db, ["public.t"], kafka.bootstrap, sinks=[])
    kl.snapshot(pipe)
    assert_quiet_when_stdout_closes(pipe.file)


def assert_quiet_when_stdout_closes(file: Path) -> None:
    """`cdc log read | head -1`, `cdc status | head -2` and both with stdout closed at once."""
    import os
    import sys

    from tests.harness import REPO

    cdc_cmd = f"{sys.executable} -m pipelines.cli"
    for command, lines in ((f"log read {file}", 1), (f"status {file}", 2)):
        done = subprocess.run(
            ["bash", "-c", f"set -o pipefail; {cdc_cmd} {command} | head -{lines}"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
            check=False,
        )
        assert len(done.stdout.splitlines()) == lines, done
        assert done.stderr == "", done.stderr
        assert done.returncode in (0, 141), done  # 0 when all output fit in the pipe before head left
    # the reader is gone before anything is written: always the broken pipe
    for command in (["log", "read", file], ["status", file]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", *map(str, command)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=dict(os.environ),
        )
        proc.stdout.close()
        err = proc.stderr.read()
        proc.wait(timeout=120)
        assert err == "" and proc.returncode == 141, (command, proc.returncode, err)


# ---- issue 22 item 10: `cdc stream` says when the Kafka broker is away ------------------------------------------
def test_stream_says_when_the_kafka_broker_is_unreachable(
    pg_db: str, tmp_path: Path, own_kafka, spark
) -> None:
    """While the broker is down `cdc stream` warns that it is unreachable and that it waits (slot
    held, nothing lost), says when it is back, and every change reaches Kafka afterwards, and from
    there a Delta follower (read with plain Spark SQL; cdc verify exit 0)."""
    import threading

    from tests.fixtures import kafka_log as kl

    broker = own_kafka
    make_table(pg_db, "t", 20)
    pipe = kl.make_kpipe(tmp_path, pg_db, ["public.t"], broker.bootstrap, sinks=[])
    kl.snapshot(pipe)
    proc = kl.start_stream(pipe)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        broker.stop()
        sql(
            pg_db,
            "INSERT INTO t SELECT g, 'while down' FROM generate_series(21, 40) g",
            "DELETE FROM t WHERE id <= 5",
        )
        wait_for(
            "the unreachable warning",
            lambda: any("Kafka broker is unreachable" in line for line in lines),
            proc,
        )
        warning = next(line for line in lines if "Kafka broker is unreachable" in line)
        assert broker.bootstrap in warning and "waiting for it" in warning and "nothing is lost" in warning, (
            warning
        )
        assert kl.published_lsn(pipe) < kl.staged_lsn(pipe)
        broker.start()
        wait_for("the broker to be back", lambda: any("Kafka is back" in line for line in lines), proc, 180)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        reader.join(10)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            kl.kill_tree(proc)
        if not broker.running():
            broker.start()
    assert proc.returncode == 0, (proc.returncode, "".join(lines), err)
    no_traceback(("".join(lines), err))
    kl.stream_until_current(pipe)
    records = kl.table_records(broker.bootstrap, pipe.topic("public.t"))
    kl.check_shape(
        kl.deduplicated(kl.check_complete(pipe, "public.t", records, 20)), pipe.topic("public.t"), ["id"]
    )
    pipe.write(sinks=[kl.LAKE])  # a follower added after the outage builds from the topics
    kl.apply_ok(pipe, spark)
    kl.verified(pipe, spark)
    lake = delta_rows(spark, tmp_path / "lake" / "public" / "t")
    source = source_rows(pg_db, "public.t", ("id",))
    assert {k: r["v"] for k, r in lake.items()} == {k: r["v"] for k, r in source.items()}
