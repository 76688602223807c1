"""Slot failover (issue 14 item 4): with `source.postgres.failover: true` on PostgreSQL >= 17 the
slot is a failover slot, which a physical standby with sync_replication_slots keeps a copy of; after
the primary dies and the standby is promoted, the pipeline pointed at it goes on with nothing lost
or doubled. Before 17 the setting is refused with what a failover does to the slot and the remedy.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc.keys import key_texts
from cdc.log.local import LocalLog
from pipelines.devservices.base import as_user, give_to
from pipelines.devservices.postgres import LocalPostgres
from sinks.registry import load_pipeline
from snapshot.runner import run_snapshot
from tests.fixtures.readers import delta_rows
from tests.harness import (
    apply_once,
    cdc,
    flush_wal,
    materialize,
    source_rows,
    sql,
    stream_in_process,
    verify,
    wait_for,
    write_pipeline,
)

pytestmark = pytest.mark.integration

STANDBY_SLOT = "standby1"


def _pipeline(tmp_path: Path, dsn: str) -> Path:
    return write_pipeline(
        tmp_path,
        dsn,
        ["public.t"],
        name="fo",
        postgres={"failover": True},
        sinks=[{"name": "lake", "delta": {"path": "lake"}}],
    )


@pytest.fixture
def primary_and_standby() -> Iterator[tuple[LocalPostgres, LocalPostgres]]:
    """A PostgreSQL 18 primary and a physical standby of it (pg_basebackup, streaming replication
    through a physical slot, hot_standby_feedback, sync_replication_slots), each in its own dir."""
    bases = [Path(tempfile.mkdtemp(prefix=f"cdc-test-{role}-")) for role in ("primary", "standby")]
    # synchronized_standby_slots: no logical change reaches `cdc stream` before the standby has it
    primary = LocalPostgres(
        bases[0], durable=False, version=18, settings={"synchronized_standby_slots": f"'{STANDBY_SLOT}'"}
    )
    standby: LocalPostgres | None = None
    try:
        primary.start()
        sql(primary.dsn(), f"SELECT pg_create_physical_replication_slot('{STANDBY_SLOT}', true)")
        base = bases[1]
        (base / "sock").mkdir()
        shutil.copy(primary.password_file, base / "password")  # the same cluster: the same superuser password
        give_to(primary.user, base, base / "sock", base / "password")
        backup = [
            str(primary.bin_dir() / "pg_basebackup"),
            "-D",
            str(base / "data"),
            "-h",
            str(primary.socket_dir),
        ]
        backup += ["-p", str(primary.port), "-U", "postgres", "-X", "stream", "-c", "fast"]
        subprocess.run(as_user(primary.user, backup), check=True, capture_output=True, timeout=300)
        (base / "data" / "standby.signal").touch()
        conninfo = (
            f"host=127.0.0.1 port={primary.port} user=postgres password={primary.password} dbname=postgres"
        )
        standby = LocalPostgres(
            base,
            durable=False,
            version=18,
            settings={
                "primary_conninfo": f"'{conninfo}'",
                "primary_slot_name": f"'{STANDBY_SLOT}'",
                "hot_standby_feedback": "on",
                "sync_replication_slots": "on",
            },
        )
        standby.start()
        yield primary, standby
    finally:
        for server in (standby, primary):
            if server is not None:
                server.stop()
        for base in bases:
            shutil.rmtree(base, ignore_errors=True)


def _kill(server: LocalPostgres) -> None:
    """The primary dies: an immediate shutdown (no checkpoint, no goodbye to the standby)."""
    argv = [str(server.bin_dir() / "pg_ctl"), "-D", str(server.data_dir), "-m", "immediate", "-w", "stop"]
    subprocess.run(as_user(server.user, argv), check=True, capture_output=True, timeout=120)


def _insert_counts(log_path: Path) -> Counter:
    """How many create events each key has in the log (a doubled transaction shows up here; the
    replayed rows would hide it)."""
    log = LocalLog(log_path, readonly=True)
    try:
        cut = log.latest_cut()
        assert cut is not None
        counts: Counter = Counter()
        for name, rng in cut.tables.items():
            for rec in log.read(name, rng.base - 1, rng.end):
                if rec.op == "c":
                    counts[tuple(key_texts(rec.key))] += 1
        return counts
    finally:
        log.close()


def test_failover_slot_survives_promotion_of_the_standby(
    primary_and_standby: tuple[LocalPostgres, LocalPostgres], tmp_path: Path, spark
) -> None:
    primary, standby = primary_and_standby
    sql(primary.dsn(), "CREATE DATABASE shop")
    dsn = primary.dsn("shop")
    sql(
        dsn,
        "CREATE TABLE t(id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'snap' FROM generate_series(1, 20) g",
        "CREATE TABLE hb(n int)",
    )
    file = _pipeline(tmp_path, dsn)
    run_snapshot(load_pipeline(file), progress=False)
    assert sql(dsn, "SELECT failover FROM pg_replication_slots WHERE slot_name = 'cdc_fo'") == [(True,)]

    # streamed from the primary
    sql(
        dsn,
        "INSERT INTO t SELECT g, 'a' FROM generate_series(21, 40) g",
        "UPDATE t SET v = 'a' WHERE id <= 5",
        "DELETE FROM t WHERE id = 6",
    )
    flush_wal(dsn)
    stream_in_process(file)
    # The standby keeps a synchronized copy only once the primary's slot has moved past what the
    # standby has (until then the copy stays temporary): let the stream go on acknowledging.
    standby_dsn = standby.dsn("shop")
    synced = (
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdc_fo' AND synced AND NOT temporary"
    )
    for beat in range(120):
        if sql(standby_dsn, synced)[0][0] == 1:
            break
        sql(dsn, "SELECT pg_log_standby_snapshot()", f"INSERT INTO hb VALUES ({beat})")  # hb: not captured
        flush_wal(dsn)
        stream_in_process(file)
        time.sleep(0.5)
    else:
        raise AssertionError("the standby never got a persistent synchronized copy of the slot")
    # committed on the primary, replicated to the standby, but not streamed before the primary dies
    sql(
        dsn, "INSERT INTO t SELECT g, 'b' FROM generate_series(41, 50) g", "UPDATE t SET v = 'b' WHERE id = 7"
    )
    flush_wal(dsn)
    sent = sql(primary.dsn(), "SELECT pg_current_wal_lsn()")[0][0]
    wait_for(
        "the standby replays the primary's WAL",
        lambda: sql(standby_dsn, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", params=(sent,))[0][0],
    )

    _kill(primary)
    sql(standby.dsn(), "SELECT pg_promote(true, 60)")
    sql(
        standby_dsn,
        "INSERT INTO t SELECT g, 'c' FROM generate_series(51, 60) g",
        "UPDATE t SET v = 'c' WHERE id = 8",
    )
    flush_wal(standby_dsn)

    # the pipeline pointed at the promoted standby goes on from the synchronized slot
    file = _pipeline(tmp_path, standby_dsn)
    validate = cdc("validate", file)
    assert validate.code == 0, validate.out + validate.err
    stream_in_process(file)
    log_path = tmp_path / ".cdc" / "fo" / "log"
    want = source_rows(standby_dsn, "public.t", ["id"])
    assert materialize(log_path)["public.t"] == want  # nothing lost
    doubled = {k: n for k, n in _insert_counts(log_path).items() if n > 1}
    assert not doubled, f"create events twice in the log: {doubled}"  # nothing doubled
    apply_once(file, spark)
    code, report = verify(file, spark)
    assert code == 0, report
    got = delta_rows(spark, tmp_path / "lake" / "public" / "t", ("id",))
    assert {k: r["v"] for k, r in got.items()} == {k: row["v"] for k, row in want.items()}


def test_failover_before_17_is_refused_with_the_remedy(pg_db: str, tmp_path: Path) -> None:
    """PostgreSQL 15 has no failover slots: validate and snapshot say what a failover does to the slot
    and what to do (exit 3), instead of creating an ordinary slot the user thinks is safe."""
    sql(pg_db, "CREATE TABLE t(id int PRIMARY KEY, v text)")
    file = _pipeline(tmp_path, pg_db)
    for verb in ("validate", "snapshot"):
        run = cdc(verb, file)
        assert run.code == 3, (verb, run)
        text = run.out + run.err
        assert "source.postgres.failover: true needs PostgreSQL 17 or later (the source runs 15)" in text, (
            text
        )
        assert "a failover to a standby loses it" in text and "run `cdc snapshot`" in text, text
        assert "Traceback" not in text
    assert sql(pg_db, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdc_fo'") == [(0,)]


def test_existing_slot_is_made_a_failover_slot(pg18: LocalPostgres, tmp_path: Path) -> None:
    """A pipeline whose slot was made before `failover: true` was set: validate notes it, and
    `cdc stream` turns the slot into a failover slot before streaming (PostgreSQL 18)."""
    db = "fo_" + uuid.uuid4().hex[:8]
    sql(pg18.dsn(), f"CREATE DATABASE {db}")
    dsn = pg18.dsn(db)
    try:
        sql(dsn, "CREATE TABLE t(id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a')")
        run = cdc("snapshot", write_pipeline(tmp_path, dsn, ["public.t"], name="fo"))
        assert run.code == 0, run.out + run.err
        failover = "SELECT failover FROM pg_replication_slots WHERE slot_name = 'cdc_fo'"
        assert sql(dsn, failover) == [(False,)]
        file = _pipeline(tmp_path, dsn)
        run = cdc("validate", file)
        assert run.code == 0 and "replication slot cdc_fo is not a failover slot yet" in run.out, (
            run.out + run.err
        )
        run = cdc("stream", file, "--until", "current")
        assert run.code == 0, run.out + run.err
        assert "replication slot cdc_fo is now a failover slot" in run.out, run.out
        assert sql(dsn, failover) == [(True,)]
    finally:
        sql(
            pg18.dsn(),
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
            params=(db,),
        )
        sql(pg18.dsn(), f"DROP DATABASE {db} WITH (FORCE)")
