"""Captured tables renamed, dropped or removed from the pipeline file (issue 22 items 4-6), on
both logs (local and Kafka), against real PostgreSQL, Spark/Delta and a Kafka 4 broker.

Each test reads the result back independently (the log's SQLite file or the Kafka topics with
plain kafka-python, Delta tables with the test's Spark session) and ends with `cdc verify` exit
0. No test runs `cdc snapshot` after the first one: the tool handles every change itself.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cdc.ground.lsn import format_lsn
from tests.fixtures.capture import no_traceback, ok, slot_info, start_stream
from tests.fixtures.workload import make_table
from tests.harness import CdcRun, cdc, flush_wal, materialize, sql, verify, write_pipeline

pytestmark = pytest.mark.integration

LAKE = {"name": "lake", "delta": {"path": "lake"}}


@dataclass
class Setup:
    """A pipeline on the local or the Kafka log; `tables`/`sinks` are rewritten with write()."""

    dir: Path
    dsn: str
    tables: list[str]
    kafka: str | None = None  # bootstrap servers; None: the local log
    prefix: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:10]}")
    sinks: list[dict] = field(default_factory=lambda: [LAKE])
    name: str = "test"

    @property
    def file(self) -> Path:
        return self.dir / f"{self.name}.yml"

    @property
    def slot(self) -> str:
        return f"cdc_{self.name}"

    @property
    def log_db(self) -> Path:
        """The embedded log (with Kafka: the staging log capture writes)."""
        return self.dir / ".cdc" / self.name / ("staging" if self.kafka else "log")

    def write(self) -> None:
        extra: dict[str, Any] = {"sinks": self.sinks}
        if self.kafka:
            extra["log"] = {"kafka": {"bootstrap_servers": self.kafka, "topic_prefix": self.prefix}}
        write_pipeline(self.dir, self.dsn, self.tables, name=self.name, **extra)


def stream(s: Setup) -> CdcRun:
    flush_wal(s.dsn)
    return cdc("stream", s.file, "--until", "current")


def log_tables(s: Setup) -> dict[str, tuple[str, int | None]]:
    """{schema.table: (state, relid)} straight from the log's SQLite file."""
    db = sqlite3.connect(f"file:{s.log_db / 'log.db'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT schema_name, table_name, state, relid FROM tables").fetchall()
    finally:
        db.close()
    return {f"{sch}.{t}": (st, relid) for sch, t, st, relid in rows}


def kafka_cut(s: Setup) -> dict:
    import orjson
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=[s.kafka], enable_auto_commit=False, consumer_timeout_ms=10_000
    )
    try:
        tp = TopicPartition(f"{s.prefix}._cdc_cuts", 0)
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        consumer.seek(tp, end - 1)
        records = [
            r
            for batch in iter(lambda: consumer.poll(timeout_ms=5000), {})
            for rs in batch.values()
            for r in rs
        ]
        return orjson.loads(records[-1].value)
    finally:
        consumer.close()


def topic_rows(s: Setup, table: str) -> dict[int, str | None]:
    """A table topic replayed with kafka-python: {id: v} (deletes and tombstones remove the key)."""
    import orjson
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=[s.kafka], enable_auto_commit=False)
    try:
        tp = TopicPartition(f"{s.prefix}.{table}", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        rows: dict[int, str | None] = {}
        while consumer.position(tp) < end:
            for records in consumer.poll(timeout_ms=5000).values():
                for r in records:
                    key = orjson.loads(r.key).get("id")
                    value = orjson.loads(r.value) if r.value is not None else None
                    if value is None or value["op"] == "d":
                        rows.pop(key, None)
                    elif value["op"] != "t":
                        rows[key] = value["after"]["v"]
        return rows
    finally:
        consumer.close()


def log_rows(s: Setup, table: str) -> dict[int, str | None]:
    """The table as the log holds it (up to its latest cut), read independently of the followers."""
    if s.kafka:
        return topic_rows(s, table)
    state = materialize(s.log_db, table).get(table, {})
    return {int(k[0]): row["v"] for k, row in state.items()}


def source(s: Setup, table: str) -> dict[int, str | None]:
    return dict(sql(s.dsn, f"SELECT id, v FROM {table}"))


def delta_rows(spark, path: Path) -> dict[int, str | None]:
    return {r["id"]: r["v"] for r in spark.read.format("delta").load(str(path)).select("id", "v").collect()}


def apply(s: Setup, spark) -> None:
    from cdc.ground import logsetup
    from pipelines.apply.job import ApplyJob
    from sinks.registry import load_pipeline

    job = ApplyJob(load_pipeline(s.file), spark)
    with logsetup.collected() as lines:
        runs = job.run_once()
        job.report(runs)
    assert not [r for r in runs if r.error is not None], "apply failed:\n" + "\n".join(lines)


def verified(s: Setup, spark) -> str:
    code, report = verify(s.file, spark)
    assert code == 0, f"cdc verify exited {code}:\n{report}"
    return report


def confirmed_flush(s: Setup) -> int:
    return int(
        sql(
            s.dsn,
            "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = %s",
            params=[s.slot],
        )[0][0]
    )


def current_lsn(s: Setup) -> int:
    flush_wal(s.dsn)
    return int(sql(s.dsn, "SELECT (pg_current_wal_lsn() - '0/0')::bigint")[0][0])


# The Kafka log's run of the scenario is a second run (`make test-slow`): the tables' renames, drops
# and removals are the log view's, and test_kafka_log.py covers what the topics themselves do.
@pytest.fixture(params=["local", pytest.param("kafka", marks=pytest.mark.slow)])
def setup(request, pg_db: str, tmp_path: Path) -> Setup:
    kafka = request.getfixturevalue("kafka").bootstrap if request.param == "kafka" else None
    for t in ("events", "later_t", "keep_t"):
        make_table(pg_db, f"public.{t}", 5)
    s = Setup(tmp_path, pg_db, ["public.events", "public.later_t", "public.keep_t"], kafka)
    s.write()
    ok("snapshot", s.file, "--no-progress")
    return s


def test_renamed_dropped_and_removed_tables(setup: Setup, spark) -> None:
    """Items 4-6 over one pipeline's life: a renamed table is followed by its OID once the file
    names the new name (and stops the stream, acknowledging nothing of it, until then); a dropped
    table's last changes reach the log and the follower, the table is marked dropped, verify says
    so, and `cdc log remove-table` takes it out; a new follower builds only the file's tables."""
    s = setup
    assert all(relid for _state, relid in log_tables(s).values()), "the snapshot records each table's OID"
    apply(s, spark)

    # ---- item 4: rename ------------------------------------------------------------------------
    sql(s.dsn, "INSERT INTO events VALUES (100, 'before rename')", "ALTER TABLE events RENAME TO events_v2")
    renamed_at = current_lsn(s)
    sql(
        s.dsn,
        "INSERT INTO events_v2 VALUES (101, 'after rename')",
        "UPDATE events_v2 SET v = 'upd' WHERE id = 1",
    )
    run = stream(s)
    no_traceback(run)
    assert run.code == 3, f"{run.code}\n{run.out}\n{run.err}"
    assert "table public.events was renamed to public.events_v2" in run.err and "  fix: " in run.err, run.err
    assert "put public.events_v2 in source.postgres.tables" in run.err, run.err
    assert confirmed_flush(s) <= renamed_at, (
        f"slot confirmed {format_lsn(confirmed_flush(s))}, past the rename at {format_lsn(renamed_at)}"
    )

    s.tables = ["public.events_v2", "public.later_t", "public.keep_t"]
    s.write()
    run = ok("stream", s.file, "--until", "current")
    assert "renamed to public.events_v2" in run.out and "follows it under the new name" in run.out, run.out
    assert "public.events" not in log_tables(s) and log_tables(s)["public.events_v2"][0] == "live"
    assert log_rows(s, "public.events_v2") == source(s, "events_v2")  # history + changes, no snapshot

    # ---- item 5: drop -------------------------------------------------------------------------
    sql(s.dsn, "INSERT INTO later_t VALUES (50, 'last')", "UPDATE later_t SET v = 'last upd' WHERE id = 1")
    last = source(s, "later_t")
    sql(s.dsn, "DELETE FROM later_t WHERE id = 2", "DROP TABLE later_t")
    del last[2]
    run = ok("stream", s.file, "--until", "current")  # the file still names it: the stream goes on
    assert "dropped in the source" in run.out and "marked dropped in the log: public.later_t" in run.out, (
        run.out
    )
    assert log_tables(s)["public.later_t"][0] == "dropped"
    if s.kafka:
        assert kafka_cut(s)["tables"]["public.later_t"]["state"] == "dropped"
    assert log_rows(s, "public.later_t") == last

    apply(s, spark)
    lake = s.dir / "lake" / "public"
    assert delta_rows(spark, lake / "later_t") == last  # the last changes before the drop applied
    assert delta_rows(spark, lake / "events_v2") == source(s, "events_v2")
    report = verified(s, spark)
    assert "public.later_t: not compared: dropped in the source" in report, report
    assert "the follower has applied them all" in report, report

    run = cdc("log", "remove-table", s.file, "--table", "public.later_t", "--yes")
    assert run.code == 2 and "remove it from source.postgres.tables first" in run.err, (
        run.err
    )  # the file names it
    s.tables = ["public.events_v2", "public.keep_t"]
    s.write()
    ok("log", "remove-table", s.file, "--table", "public.later_t", "--yes")
    assert "public.later_t" not in log_tables(s)
    sql(s.dsn, "INSERT INTO keep_t VALUES (60, 'after remove')")
    ok("stream", s.file, "--until", "current")
    if s.kafka:
        assert set(kafka_cut(s)["tables"]) == {"public.events_v2", "public.keep_t"}

    # ---- item 6: a new follower follows the file's tables -----------------------------------------
    s.sinks = [LAKE, {"name": "fresh", "delta": {"path": "fresh"}}]
    s.write()
    apply(s, spark)
    built = sorted(p.name for p in (s.dir / "fresh" / "public").iterdir())
    assert built == ["events_v2", "keep_t"], built
    assert delta_rows(spark, s.dir / "fresh" / "public" / "keep_t") == source(s, "keep_t")
    verified(s, spark)


def wait_state(s: Setup, table: str, state: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while log_tables(s).get(table, (None,))[0] != state:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(
                f"{table} not {state} in the log (stream exit {proc.returncode}):\n{out}\n{err}"
            )
        time.sleep(0.5)


def test_dropped_tables_while_streaming_and_removed_from_file(pg_db: str, tmp_path: Path) -> None:
    """The issue's jam, both ways: a table dropped while `cdc stream` runs is noticed and marked
    dropped once its last changes are in; one dropped while the stream was stopped and removed
    from `tables:` before it ran again no longer stops it (its key comes from the log, not the
    catalog it is gone from). `cdc snapshot` (and so `cdc run`) is not stopped by a dropped table
    the file still names. WAL is acknowledged past the drops."""
    for t in ("later_t", "old_t", "keep_t"):
        make_table(pg_db, f"public.{t}", 3)
    s = Setup(tmp_path, pg_db, ["public.later_t", "public.old_t", "public.keep_t"])
    s.write()
    ok("snapshot", s.file, "--no-progress")

    proc = start_stream(s, timeout=60)  # type: ignore[arg-type]  # Setup has file, dsn and slot
    sql(pg_db, "UPDATE later_t SET v = 'last while streaming' WHERE id = 3", "DROP TABLE later_t")
    flush_wal(pg_db)
    wait_state(s, "public.later_t", "dropped", proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    no_traceback((out, err))
    assert "marked dropped in the log: public.later_t" in out, out
    assert log_rows(s, "public.later_t")[3] == "last while streaming"
    run = ok("snapshot", s.file, "--no-progress")  # the file still names later_t: a note, not exit 3
    assert "nothing to snapshot" in run.out, run.out
    run = ok("validate", s.file)
    assert "table public.later_t was dropped in the source" in run.out, run.out

    sql(pg_db, "UPDATE old_t SET v = 'gone soon' WHERE id = 3", "DROP TABLE old_t")
    s.tables = ["public.later_t", "public.keep_t"]
    s.write()
    dropped_at = current_lsn(s)
    run = ok("stream", s.file, "--until", "current")
    assert "marked dropped in the log: public.old_t" in run.out, run.out
    assert log_rows(s, "public.old_t")[3] == "gone soon"
    assert log_tables(s)["public.old_t"][0] == "dropped"
    assert confirmed_flush(s) >= dropped_at and slot_info(pg_db, s.slot) is not None


def test_another_table_under_a_captured_name_stops_the_stream(pg_db: str, tmp_path: Path) -> None:
    """A captured table renamed away and another captured table renamed to its name: the changes
    under that name now belong to another table (another OID). The stream stops before them with
    the remedy and acknowledges nothing from there on, instead of mixing two tables' rows."""
    for t in ("a", "b"):
        make_table(pg_db, f"public.{t}", 3)
    s = Setup(tmp_path, pg_db, ["public.a", "public.b", "public.a_old"])
    sql(
        pg_db, "CREATE TABLE a_old(id int PRIMARY KEY, v text)"
    )  # so the file's third name exists at snapshot time
    s.write()
    ok("snapshot", s.file, "--no-progress")
    sql(pg_db, "DROP TABLE a_old", "ALTER TABLE a RENAME TO a_old", "ALTER TABLE b RENAME TO a")
    swapped_at = current_lsn(s)
    sql(pg_db, "INSERT INTO a VALUES (10, 'b under the name a')")
    run = stream(s)
    no_traceback(run)
    assert run.code == 3, f"{run.code}\n{run.out}\n{run.err}"
    assert "public.a in the source is not the table the log captured under that name" in run.err, run.err
    assert f"fix: run `cdc snapshot {s.file} --tables public.a`" in run.err, run.err
    assert confirmed_flush(s) <= swapped_at
    assert 10 not in log_rows(s, "public.a")


def test_new_follower_skips_a_table_removed_from_the_file_but_live_in_the_log(
    pg_db: str, tmp_path: Path, spark
) -> None:
    """Item 6 as reported: a captured table, still live in the log, is taken out of the file's
    `tables:` (no `cdc log remove-table`). A follower added afterwards must not build it, and the
    existing follower, which built it before, keeps applying without error."""
    for t in ("events", "keep_t"):
        make_table(pg_db, f"public.{t}", 3)
    s = Setup(tmp_path, pg_db, ["public.events", "public.keep_t"])
    s.write()
    ok("snapshot", s.file, "--no-progress")
    apply(s, spark)

    s.tables = ["public.keep_t"]
    s.write()
    sql(pg_db, "INSERT INTO keep_t VALUES (40, 'after removal')")
    ok("stream", s.file, "--until", "current")
    assert log_tables(s)["public.events"][0] == "live", "the precondition: the log still holds it"

    s.sinks = [LAKE, {"name": "fresh", "delta": {"path": "fresh"}}]
    s.write()
    apply(s, spark)  # asserts no follower failed, the existing one included
    fresh = s.dir / "fresh" / "public"
    assert sorted(p.name for p in fresh.iterdir()) == ["keep_t"]
    assert delta_rows(spark, fresh / "keep_t") == source(s, "keep_t")
    assert delta_rows(spark, s.dir / "lake" / "public" / "keep_t") == source(s, "keep_t")
    verified(s, spark)
