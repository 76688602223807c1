"""The `kafka` log end to end, against a real Kafka 4 broker (KRaft), PostgreSQL 15 and Spark.

Capture writes the embedded staging log; the publisher (a child process of `cdc stream`, or
`cdc snapshot` itself) turns its cuts into one compacted topic per table plus a cut topic and a
schema topic; `cdc apply` reads the topics with Spark's Kafka source. The tests read the topics
back with plain kafka-python (not the product's client) and end with `cdc verify` exit 0 unless
they are about a failure. Spark pays seconds per MERGE, so related checks share a pipeline.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import NewTopic

from cdc.ground.lsn import format_lsn
from cdc.keys import key_texts
from pipelines.apply.readers import base as readers_base
from pipelines.apply.readers.envelopes import kafka_frame
from pipelines.devservices.base import free_port
from tests.fixtures.capture import (
    UNAVAILABLE,
    assert_log_well_formed,
    assert_txns_streamed,
    no_traceback,
    ok,
    slot_info,
    stream_events,
    wait_slot,
)
from tests.fixtures.kafka_log import (
    LAKE,
    TRUNCATE_KEY,
    KPipe,
    Rec,
    admin,
    alive,
    apply_ok,
    check_complete,
    check_order,
    check_shape,
    child_pids,
    current_flush_lsn,
    cuts,
    deduplicated,
    first_unpublished_commit,
    kill_tree,
    latest_cut,
    make_kpipe,
    published,
    published_lsn,
    snapshot,
    staged_lsn,
    start_stream,
    stop_stream,
    stream_until_current,
    table_records,
    topic_config,
    topics_with_prefix,
    verified,
    wait_acknowledged,
    wait_gone,
    wait_published,
)
from tests.fixtures.lake import cut_operations
from tests.fixtures.readers import delta_rows, iceberg_rows
from tests.fixtures.topics import end_offset
from tests.fixtures.topics import topic_records as raw_records
from tests.fixtures.workload import BIG_TEXT, Writer, make_table
from tests.harness import CdcRun, cdc, cdc_popen, source_rows, sql

pytestmark = pytest.mark.integration


# ---- 1. capture through Kafka ----------------------------------------------------------------------
def test_capture_through_kafka_ends_identical(pg_db: str, tmp_path: Path, kafka, spark, monkeypatch) -> None:
    """Snapshot + inserts, updates (one leaving a TOAST value unchanged), key updates, deletes, a
    truncate and an added column, through the Kafka log into Delta: verify finds the follower
    identical. The topics have the documented layout, and `cdc status` shows the cut and the
    follower's lag. Each topic's range is read in tasks of 5 records (a big catch-up's split,
    pipelines/apply/readers/envelopes.py): a TOAST value, a key's versions and a truncate span tasks.
    Beside them two tables without a key (docs/keyless-tables.md): an insert-only one and a REPLICA
    IDENTITY FULL one, identical rows in both, one of two identical rows updated and one deleted:
    every record keyed by its own position, no tombstones, the FULL delete carrying the whole row;
    delta-rs reads the source's multisets, and verify holds with the follower past its point.
    An Iceberg follower (embedded SQLite catalog) takes the same cuts from the topics: pyiceberg
    reads the source's rows (the TOAST value kept, the added column's default in older rows, both
    keyless tables as multisets, the FULL one's first cut already holding deletes), verify holds
    for it too, and `cdc status` shows its lag beside the Delta follower's."""
    monkeypatch.setattr(readers_base, "EVENTS_PER_PARTITION", 5)
    sql(
        pg_db,
        "CREATE TABLE items(id int PRIMARY KEY, n int, big text, note text)",
        "ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL",
        f"INSERT INTO items SELECT g, 0, CASE WHEN g = 2 THEN 'small' ELSE {BIG_TEXT} END, 'n' || g FROM generate_series(1, 6) g",
        "CREATE TABLE pairs(a int, b text, v text, PRIMARY KEY (a, b))",
        "INSERT INTO pairs SELECT g, 'k' || g, 'v' || g FROM generate_series(1, 5) g",
        "CREATE TABLE gone(id int PRIMARY KEY, v text)",
        "INSERT INTO gone SELECT g, 'g' || g FROM generate_series(1, 4) g",
        "CREATE TABLE audit(who text, n int, at timestamptz)",  # no key, default identity: insert-only
        "INSERT INTO audit SELECT 'u' || (g % 2), g % 2, '2024-01-01 10:00:00.5+00' FROM generate_series(1, 6) g",
        "CREATE TABLE tally(k text, v int)",
        "ALTER TABLE tally REPLICA IDENTITY FULL",  # no key: a multiset
        "INSERT INTO tally VALUES ('a', 1), ('a', 1), ('a', 1), ('b', 2)",
    )
    keyless = ["public.audit", "public.tally"]
    tables = ["public.items", "public.pairs", "public.gone", *keyless]
    ice = {
        "name": "ice",
        "iceberg": {"warehouse": "ice", "tables": tables},
    }
    pipe = make_kpipe(tmp_path, pg_db, tables, kafka.bootstrap, sinks=[LAKE, ice])
    assert "no key: followed insert-only" in ok("validate", pipe.file).out  # the Kafka log holds it
    run = snapshot(pipe)
    assert "published 25 records to Kafka" in run.out, run.out
    sql(
        pg_db,
        f"INSERT INTO items VALUES (7, 0, {BIG_TEXT}, 'seven')",
        "UPDATE items SET n = 1 WHERE id = 1",  # big unchanged: known from the snapshot
        "UPDATE items SET n = 2, note = 'changed' WHERE id = 7",  # big unchanged: known from the stream
        "UPDATE items SET id = 20 WHERE id = 2",  # key change: delete 2, create 20
        "DELETE FROM items WHERE id IN (3, 4)",
        "BEGIN",
        "UPDATE pairs SET b = 'z1' WHERE a = 1",
        "DELETE FROM pairs WHERE a = 5",
        "INSERT INTO pairs VALUES (6, 'k6', 'v6')",
        "COMMIT",
        "TRUNCATE gone",
        "INSERT INTO gone VALUES (10, 'after')",
        "ALTER TABLE items ADD COLUMN extra text DEFAULT 'dflt'",
        "INSERT INTO items(id, n, big, note, extra) VALUES (8, 0, 'small', 'eight', 'x')",
        "UPDATE items SET extra = 'e5' WHERE id = 5",  # big unchanged, new schema version
        "INSERT INTO audit VALUES ('u1', 1, '2024-01-01 10:00:00.5+00'), ('u1', 1, '2024-01-01 10:00:00.5+00')",
        # one of identical rows, by ctid: FULL logs the update as a delete of the old row and a create
        "UPDATE tally SET v = 10 WHERE ctid = (SELECT ctid FROM tally WHERE k = 'a' LIMIT 1)",
        "DELETE FROM tally WHERE ctid = (SELECT ctid FROM tally WHERE k = 'a' AND v = 1 LIMIT 1)",
        "INSERT INTO tally VALUES ('c', 3), ('c', 3)",
    )
    stream_until_current(pipe)
    split = kafka_frame(spark, kafka.bootstrap, pipe.topic("public.items"), 0, 8)
    assert split.rdd.getNumPartitions() == 2 and split.count() == 8

    # One compacted topic per table, plus the cut and schema topics.
    assert topics_with_prefix(kafka.bootstrap, pipe.prefix) == {pipe.topic(t) for t in tables} | {
        pipe.cuts_topic,
        pipe.schemas_topic,
    }
    for topic in [pipe.topic(t) for t in tables] + [pipe.cuts_topic, pipe.schemas_topic]:
        assert topic_config(kafka.bootstrap, topic)["cleanup.policy"] == "compact", topic

    keys = {"public.items": ["id"], "public.pairs": ["a", "b"], "public.gone": ["id"]}
    records = {t: table_records(kafka.bootstrap, pipe.topic(t)) for t in tables}
    for table, key in keys.items():
        recs = records[table]
        check_shape(recs, pipe.topic(table), key)
        assert len(recs) == len(set(r.offset for r in recs)) == recs[-1].offset + 1, (
            f"{table}: offsets not dense"
        )
    check_complete(pipe, "public.items", records["public.items"], 6)
    check_complete(pipe, "public.pairs", records["public.pairs"], 5)
    check_complete(pipe, "public.gone", records["public.gone"], 4)

    items = [(r.op, r.key.get("id")) for r in records["public.items"] if r.op != "r"]
    assert items == [
        ("c", 7), ("u", 1), ("u", 7), ("d", 2), (None, 2), ("c", 20),
        ("d", 3), (None, 3), ("d", 4), (None, 4), ("c", 8), ("u", 5),
    ]  # fmt: skip
    by_op = {(r.op, r.key.get("id")): r.value for r in records["public.items"] if r.value}
    # Unchanged TOAST values are filled from the staging log before publishing (compaction may drop
    # the record that held them); after ADD COLUMN (a new schema version) the placeholder stays.
    assert by_op[("u", 1)]["after"]["big"] == by_op[("r", 1)]["after"]["big"] != UNAVAILABLE
    assert by_op[("u", 7)]["after"]["big"] == by_op[("c", 7)]["after"]["big"] != UNAVAILABLE
    assert by_op[("u", 5)]["after"]["big"] == UNAVAILABLE
    assert by_op[("u", 5)]["after"]["extra"] == "e5"
    pairs = [(r.op, r.key) for r in records["public.pairs"] if r.op != "r"]
    assert pairs == [
        ("d", {"a": 1, "b": "k1"}), (None, {"a": 1, "b": "k1"}), ("c", {"a": 1, "b": "z1"}),
        ("d", {"a": 5, "b": "k5"}), (None, {"a": 5, "b": "k5"}), ("c", {"a": 6, "b": "k6"}),
    ]  # fmt: skip
    assert len({(r.lsn) for r in records["public.pairs"] if r.op != "r"}) == 1, (
        "one transaction, one commit LSN"
    )
    gone = [(r.op, r.key) for r in records["public.gone"] if r.op != "r"]
    assert gone == [("t", TRUNCATE_KEY), ("c", {"id": 10})]
    check_keyless_topics(pipe, records)

    # The cut topic: the latest cut names every table topic with its end offset.
    cut = latest_cut(pipe)
    assert cut["lsn"] == published_lsn(pipe) and cut["lsn"] >= staged_lsn(pipe) > 0
    assert sorted(cut["tables"]) == sorted(tables)
    for table in tables:
        entry = cut["tables"][table]
        assert entry["topic"] == pipe.topic(table)
        assert entry["base"] == 0 and entry["end"] == end_offset(kafka.bootstrap, pipe.topic(table)) - 1, (
            table,
            entry,
        )
    schemas = [orjson.loads(r.value) for r in raw_records(kafka.bootstrap, pipe.schemas_topic)]
    assert sorted((s["table"], s["version"]) for s in schemas) == [
        ("public.audit", 1),
        ("public.gone", 1),
        ("public.items", 1),
        ("public.items", 2),
        ("public.pairs", 1),
        ("public.tally", 1),
    ], "every schema version of every table, once"
    columns = next(s for s in schemas if s["version"] == 2)["schema"]["columns"]
    # a column is [name, type_oid, typmod, ndims, missing, attnum] (cdc/log/base.py Column)
    assert [columns[-1][0], columns[-1][4]] == ["extra", "dflt"], "the added column and its default"
    assert columns[-1][5] > 0, "the added column's attnum"

    apply_ok(pipe, spark)
    verified(pipe, spark)
    lake = spark.read.format("delta").load(str(tmp_path / "lake" / "public" / "items"))
    row1 = lake.filter("id = 1").first()
    assert row1 is not None and len(row1["big"]) > 8192 and row1["n"] == 1, "unchanged TOAST value kept"
    assert_keyless_lake(pipe)
    # verify with the follower past the verification point: what the log has after it is counted in
    # (the source at the point plus the rows inserted since equals the follower plus the rows deleted since)
    report = verified_past_the_point(
        pipe,
        spark,
        monkeypatch,
        "INSERT INTO audit VALUES ('u0', 0, '2024-01-01 10:00:00.5+00')",
        "UPDATE tally SET v = 11 WHERE ctid = (SELECT ctid FROM tally WHERE k = 'c' LIMIT 1)",
        "DELETE FROM tally WHERE k = 'b'",
    )
    assert (
        "public.tally: identical" in report
        and "3 row(s) inserted or deleted after the verification point" in report
    ), report
    assert_keyless_lake(pipe)

    # ---- 8. `cdc status` on a kafka pipeline: the cut, and each follower's lag ----
    status = status_json(pipe)
    cut = latest_cut(pipe)
    assert status["log"]["kind"] == "kafka" and "error" not in status["log"], status["log"]
    assert status["log"]["cut"]["id"] == cut["cut_id"] and status["log"]["cut"]["lsn"] == format_lsn(
        cut["lsn"]
    )
    assert {t["table"]: t["end"] for t in status["log"]["tables"]} == {
        t: cut["tables"][t]["end"] for t in tables
    }
    followers = {f["sink"]: f for f in status["followers"]}
    assert sorted(followers) == ["ice", "lake"], followers
    lake_status = followers["lake"]
    assert lake_status["events_behind_log"] == followers["ice"]["events_behind_log"] == 0, followers
    applied_lsn = lake_status["position"]
    sql(
        pg_db,
        "UPDATE items SET n = 9 WHERE id = 1",
        "DELETE FROM pairs WHERE a = 3",
        "INSERT INTO gone VALUES (11, 'inserted')",
    )
    stream_until_current(pipe)
    status = status_json(pipe)
    followers = {f["sink"]: f for f in status["followers"]}
    lake_status = followers["lake"]
    assert lake_status["position"] == followers["ice"]["position"] == applied_lsn, followers
    # an update; a delete and its tombstone; an insert (all in tables both follow)
    assert lake_status["events_behind_log"] == followers["ice"]["events_behind_log"] == 4, followers
    assert status["log"]["cut"]["lsn"] == format_lsn(latest_cut(pipe)["lsn"])
    text = ok("status", pipe.file).out
    assert f"log (kafka): cut {status['log']['cut']['id']} at {status['log']['cut']['lsn']}" in text, text
    assert f"follower lake (delta): at {applied_lsn}" in text and "4 events behind the log" in text, text

    # A table's cut of inserts alone is appended on the Kafka log too (sinks/delta/sink.py _appends:
    # its range has as many records as offsets); the others MERGE
    run, ice_run = apply_ok(pipe, spark)
    assert (run.sink, ice_run.sink, ice_run.cut_id) == ("lake", "ice", run.cut_id)
    lake = tmp_path / "lake" / "public"
    operations = {t: cut_operations(lake / t, run.cut_id) for t in ("items", "pairs", "gone")}
    assert operations == {"items": ["MERGE"], "pairs": ["MERGE"], "gone": ["WRITE"]}, operations
    held = delta_rows(spark, lake / "gone")  # delta-rs: fails on a key held twice
    assert {r["id"]: r["v"] for r in held.values()} == {10: "after", 11: "inserted"}
    assert_iceberg_is_source(pipe, keys)


def assert_iceberg_is_source(pipe: KPipe, keys: dict[str, list[str]]) -> None:
    """pyiceberg (not the sink) reads each keyed table of the Iceberg follower as the source, every
    column as PostgreSQL prints it (the TOASTed `big` kept; `extra`'s default in rows older than
    it), and the keyless tables as the source's multisets, each row at its own log position."""
    for table, key in keys.items():
        held = iceberg_rows(pipe.dir / "ice", table, tuple(key))
        source = source_rows(pipe.dsn, table, key)
        got = {
            k: {c: None if r[c] is None else str(r[c]) for c in source[k]}
            for k, r in held.items()
            if k in source
        }
        assert held.keys() == source.keys() and got == source, f"pyiceberg {table}: {got} != {source}"
    for table, columns in (("public.audit", ("who", "n")), ("public.tally", ("k", "v"))):
        rows = iceberg_rows(pipe.dir / "ice", table, ("_cdc_lsn", "_cdc_seq")).values()
        held = Counter(tuple(r[c] for c in columns) for r in rows)
        assert held == Counter(sql(pipe.dsn, f"SELECT {', '.join(columns)} FROM {table}")), (
            f"pyiceberg {table}"
        )


def check_keyless_topics(pipe: KPipe, records: dict[str, list[Rec]]) -> None:
    """The topics of the keyless tables (docs/keyless-tables.md): each record keyed by its own
    position (so compaction keeps every one), the position its headers carry, no tombstones; the
    snapshot's identical rows are records of their own; a FULL table's delete carries the whole row."""
    for table in ("public.audit", "public.tally"):
        recs = records[table]
        assert all(r.value is not None for r in recs), f"{table}: a tombstone"
        assert all(r.key == {"_cdc_lsn": r.lsn, "_cdc_seq": r.seq} for r in recs), f"{table}: keys"
        assert len({r.key_text for r in recs}) == len(recs), f"{table}: two records share a key"
        snapshot_rows = [r for r in recs if r.op == "r"]
        assert all(r.seq < 0 for r in snapshot_rows), (
            "a snapshot row's seq: negative, its place in the snapshot"
        )
    audit = Counter((r.value["after"]["who"], r.value["after"]["n"]) for r in records["public.audit"])
    assert audit == Counter(sql(pipe.dsn, "SELECT who, n FROM audit")), audit
    tally = [(r.op, r.value["before"], r.value["after"]) for r in records["public.tally"] if r.op != "r"]
    assert tally == [
        ("d", {"k": "a", "v": 1}, None), ("c", None, {"k": "a", "v": 10}),  # the update: delete + create
        ("d", {"k": "a", "v": 1}, None),
        ("c", None, {"k": "c", "v": 3}), ("c", None, {"k": "c", "v": 3}),
    ], tally  # fmt: skip


def assert_keyless_lake(pipe: KPipe) -> None:
    """delta-rs reads each keyless table as the source's multiset, each row at its own position."""
    for table, columns in (("public.audit", "who, n"), ("public.tally", "k, v")):
        rows = delta_rows(None, pipe.dir / "lake" / "public" / table.split(".")[1], ("_cdc_lsn", "_cdc_seq"))
        names = columns.split(", ")
        lake = Counter(tuple(r[c] for c in names) for r in rows.values())
        assert lake == Counter(sql(pipe.dsn, f"SELECT {columns} FROM {table}")), table


def verified_past_the_point(pipe: KPipe, spark, monkeypatch, *statements: str) -> str:
    """`cdc verify` whose follower is past its verification point: right after verify reads the
    source, `statements` run, are streamed and applied; verify must still exit 0."""
    from pipelines import verify as verify_module

    read = verify_module.copy_source

    def then_move_on(*args, **kwargs):
        source = read(*args, **kwargs)
        sql(pipe.dsn, *statements)
        stream_until_current(pipe)
        apply_ok(pipe, spark)
        return source

    with monkeypatch.context() as patched:
        patched.setattr(verify_module, "copy_source", then_move_on)
        return verified(pipe, spark)


def status_json(pipe: KPipe) -> dict:
    return json.loads(ok("status", pipe.file, "--json").out)


# ---- 3. broker unreachable at start ------------------------------------------------------------------
def test_unreachable_broker_fails_fast_and_clearly(pg_db: str, tmp_path: Path) -> None:
    """bootstrap_servers pointing at a closed port: `cdc snapshot` and `cdc stream` give up with exit 4
    (they do not wait for a broker that never answers), naming the address and the fix, without a
    traceback. (How long giving up takes is no test's business: no duration is asserted.)"""
    make_table(pg_db, "t", 10)
    address = f"127.0.0.1:{free_port()}"
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], address)
    # side by side: each waits out the client's bootstrap timeout, and neither gets past it
    verbs = (("snapshot", pipe.file, "--no-progress"), ("stream", pipe.file, "--until", "current"))
    procs = [cdc_popen(*args) for args in verbs]
    for args, proc in zip(verbs, procs, strict=True):
        try:
            out, err = proc.communicate(timeout=300)  # a guard against waiting forever, not a figure
        except subprocess.TimeoutExpired:
            for running in (p for p in procs if p.poll() is None):
                kill_tree(running)
            raise AssertionError(f"cdc {args[0]} did not give up on an unreachable broker") from None
        assert proc.returncode == 4, f"cdc {args[0]} exited {proc.returncode}:\n{out}\n{err}"
        no_traceback((out, err))
        assert address in err and "fix:" in err and "bootstrap_servers" in err, err


# ---- 4. a topic with cleanup.policy=delete -----------------------------------------------------------
def delete_policy_topic(pipe: KPipe, table: str) -> str:
    topic = pipe.topic(table)
    client = admin(pipe.bootstrap)
    try:
        client.create_topics([NewTopic(topic, 1, 1, topic_configs={"cleanup.policy": "delete"})])
    finally:
        client.close()
    return topic


def assert_refused(run: CdcRun, what: str, topic: str) -> None:
    assert run.code == 2, f"cdc {what} exited {run.code}:\n{run.out}\n{run.err}"
    no_traceback(run)
    assert f"Kafka topic {topic} exists with cleanup.policy=delete" in run.err, run.err
    assert "fix_cleanup_policy: true" in run.err, run.err


def test_topic_with_delete_policy_is_refused_unless_fixed(pg_db: str, tmp_path: Path, kafka) -> None:
    """An existing table topic that deletes by age would lose rows new followers need: `cdc
    snapshot` refuses it (exit 2, naming the topic) and leaves it alone; with
    `fix_cleanup_policy: true` it is made compact and capture works."""
    make_table(pg_db, "t", 10)
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], kafka.bootstrap)
    topic = delete_policy_topic(pipe, "public.t")
    assert_refused(cdc("snapshot", pipe.file, "--no-progress", timeout=180), "snapshot", topic)
    assert topic_config(kafka.bootstrap, topic)["cleanup.policy"] == "delete", "a refused topic is left alone"
    assert end_offset(kafka.bootstrap, topic) == 0, "nothing written into a refused topic"

    pipe.write(fix_cleanup_policy=True)
    snapshot(pipe)  # publishes the snapshot the refused run staged
    assert topic_config(kafka.bootstrap, topic)["cleanup.policy"] == "compact"
    sql(pg_db, "INSERT INTO t VALUES (11, 'new')", "DELETE FROM t WHERE id = 1")
    stream_until_current(pipe)
    records = table_records(kafka.bootstrap, topic)
    check_shape(records, topic, ["id"])
    check_complete(pipe, "public.t", records, 10)
    assert [(r.op, r.key) for r in records if r.op != "r"] == [
        ("c", {"id": 11}),
        ("d", {"id": 1}),
        (None, {"id": 1}),
    ]


def test_stream_refuses_topic_with_delete_policy(pg_db: str, tmp_path: Path, kafka) -> None:
    """`cdc stream` refuses such a topic the same way: exit 2 naming the topic, no traceback
    (the publisher runs in a child process; its error must still reach the user as one)."""
    make_table(pg_db, "t", 10)
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], kafka.bootstrap)
    topic = delete_policy_topic(pipe, "public.t")
    assert_refused(cdc("snapshot", pipe.file, "--no-progress", timeout=180), "snapshot", topic)
    assert_refused(cdc("stream", pipe.file, "--until", "current", timeout=180), "stream", topic)
    assert topic_config(kafka.bootstrap, topic)["cleanup.policy"] == "delete"
    assert end_offset(kafka.bootstrap, topic) == 0


# ---- 7. `cdc log read` -----------------------------------------------------------------------------
def test_log_read_prints_envelopes_in_commit_order(pg_db: str, tmp_path: Path, kafka) -> None:
    """`cdc log read` on a kafka pipeline: the envelopes of every table merged in commit order
    (snapshot rows first); `--keys` shows the records as the topics hold them, tombstones too."""
    sql(
        pg_db,
        "CREATE TABLE a(id int PRIMARY KEY, v text)",
        "CREATE TABLE b(id int PRIMARY KEY, v text)",
        "INSERT INTO a VALUES (1, 'a1')",
        "INSERT INTO b VALUES (1, 'b1')",
    )
    pipe = make_kpipe(tmp_path, pg_db, ["public.a", "public.b"], kafka.bootstrap)
    snapshot(pipe)
    sql(
        pg_db,
        "INSERT INTO b VALUES (2, 'b2')",
        "BEGIN",
        "INSERT INTO a VALUES (2, 'a2')",
        "UPDATE b SET v = 'b1x' WHERE id = 1",
        "UPDATE a SET v = 'a1x' WHERE id = 1",
        "COMMIT",
        "DELETE FROM b WHERE id = 2",
        "BEGIN",
        "DELETE FROM a WHERE id = 1",
        "INSERT INTO b VALUES (3, 'b3')",
        "COMMIT",
        "UPDATE a SET v = 'a2x' WHERE id = 2",
    )
    stream_until_current(pipe)

    events = [orjson.loads(line) for line in ok("log", "read", pipe.file).out.splitlines()]
    got = [(e["source"]["table"], e["op"], (e["after"] or e["before"])["id"]) for e in events]
    assert got[:2] == [("a", "r", 1), ("b", "r", 1)] or got[:2] == [("b", "r", 1), ("a", "r", 1)], got
    assert got[2:] == [
        ("b", "c", 2),
        ("a", "c", 2), ("b", "u", 1), ("a", "u", 1),
        ("b", "d", 2),
        ("a", "d", 1), ("b", "c", 3),
        ("a", "u", 2),
    ], got  # fmt: skip
    assert all(set(e) >= {"before", "after", "source", "op", "ts_ms"} for e in events)
    assert events[-1]["after"] == {"id": 2, "v": "a2x"}
    positions = [orjson.loads(e["source"]["sequence"]) for e in events[2:]]
    assert positions == sorted(positions, key=lambda p: (int(p[0]), int(p[1]))), "commit order"

    keyed = [orjson.loads(line) for line in ok("log", "read", pipe.file, "--keys").out.splitlines()]
    assert all(set(k) == {"table", "offset", "key", "value"} for k in keyed)
    tombstones = [(k["table"], k["key"]) for k in keyed if k["value"] is None]
    assert tombstones == [("public.b", {"id": 2}), ("public.a", {"id": 1})], tombstones
    for i, k in enumerate(keyed):
        if k["value"] is None:
            prev = keyed[i - 1]
            assert (
                prev["value"]["op"] == "d" and prev["key"] == k["key"] and prev["offset"] == k["offset"] - 1
            )
    a_offsets = [k["offset"] for k in keyed if k["table"] == "public.a"]
    assert a_offsets == list(range(6)), a_offsets  # r, c, u, d, tombstone, u

    only_b = [
        orjson.loads(line)
        for line in ok("log", "read", pipe.file, "--table", "public.b", "--limit", "3").out.splitlines()
    ]
    assert [(e["source"]["table"], e["op"]) for e in only_b] == [("b", "r"), ("b", "c"), ("b", "u")]


# ---- 2. broker outage: the slot waits for Kafka, nothing lost or reordered ----------------------------
@pytest.mark.slow  # a fault round (the chaos slice restarts the broker too): make test-slow
def test_broker_outage_holds_the_slot_back_and_loses_nothing(
    pg_db: str, tmp_path: Path, own_kafka, spark
) -> None:
    """While the broker is down `cdc stream` keeps running and capturing into the staging log, but
    the slot's confirmed_flush_lsn never passes a transaction Kafka does not hold (it may reach a
    keepalive's WAL end past the last cut when nothing received waits for Kafka). After the
    broker restarts the publisher resumes: everything is published in order, the slot advances,
    and the follower ends identical."""
    broker = own_kafka
    make_table(pg_db, "t", 300)
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], broker.bootstrap)
    snapshot(pipe)
    snapshot_lsn = published_lsn(pipe)
    writer = Writer(pg_db, "t", list(range(1, 301)), next_id=10_001, seed=2, pause=0.02)
    proc = start_stream(pipe)
    writer.start()
    max_confirmed = 0
    try:
        writer.wait_txns(30)
        wait_published(pipe, current_flush_lsn(pg_db))
        wait_acknowledged(pipe, published_lsn(pipe))  # the slot follows Kafka while the broker is up
        assert slot_info(pg_db, pipe.slot)[1] > snapshot_lsn

        broker.stop()
        outage = time.monotonic()
        txns_at_stop = len(writer.txns)
        early: int | None = None
        while time.monotonic() - outage < 12:
            confirmed = slot_info(pg_db, pipe.slot)[1]  # read before the published position: it only grows
            acknowledged = published_lsn(pipe)
            waiting = first_unpublished_commit(pipe, "public.t", acknowledged)
            assert waiting is None or confirmed <= waiting, (
                f"slot confirmed {format_lsn(confirmed)} past the commit at {format_lsn(waiting)}, which Kafka "
                f"does not hold (it acknowledged up to {format_lsn(acknowledged)})"
            )
            max_confirmed = max(max_confirmed, confirmed)
            if early is None and time.monotonic() - outage > 2:
                early = acknowledged
            assert proc.poll() is None, f"cdc stream died while Kafka was down: {proc.communicate()}"
            time.sleep(0.2)
        acknowledged = published_lsn(pipe)
        assert acknowledged == early, "nothing can be acknowledged while the broker is down"
        assert len(writer.txns) > txns_at_stop + 50, "the writer kept going"
        assert staged_lsn(pipe) > acknowledged, "capture goes on into the staging log while Kafka is down"
        waiting = first_unpublished_commit(pipe, "public.t", acknowledged)
        assert waiting is not None and max_confirmed <= waiting

        restart_ms = time.time() * 1000
        broker.start()
        writer.wait_txns(len(writer.txns) + 30)
        writer.finish()
        wait_published(pipe, current_flush_lsn(pg_db), timeout=180)
        wait_acknowledged(pipe, published_lsn(pipe))  # the slot advances again
        stop_stream(proc)
    finally:
        writer.halt.set()
        if proc.poll() is None:
            kill_tree(proc)

    # The slot never passed a transaction that Kafka did not hold before the restart.
    held = [c["lsn"] for c in cuts(broker.bootstrap, pipe.cuts_topic) if c["ts_ms"] < restart_ms]
    assert held and max_confirmed <= (first_unpublished_commit(pipe, "public.t", max(held)) or 0)
    records = table_records(broker.bootstrap, pipe.topic("public.t"))
    first = check_complete(pipe, "public.t", records, 300)
    check_shape(deduplicated(first), pipe.topic("public.t"), ["id"])
    assert_txns_streamed(pipe, "public.t", writer.txns)  # the staging log holds every transaction whole
    assert_log_well_formed(pipe)
    assert sum(1 for k, r in first.items() if r.op in ("c", "u", "d")) == writer.changes
    apply_ok(pipe, spark)
    verified(pipe, spark)


def test_stream_stops_promptly_while_the_broker_is_down(pg_db: str, tmp_path: Path, own_kafka) -> None:
    """SIGTERM to `cdc stream` while Kafka is down (the publisher waiting for it) stops the stream
    before the broker is back (it does not wait for Kafka), acknowledges nothing Kafka does not hold, and a later stream publishes
    everything once the broker is back."""
    broker = own_kafka
    make_table(pg_db, "t", 20)
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], broker.bootstrap)
    snapshot(pipe)
    proc = start_stream(pipe)
    try:
        broker.stop()
        ((before_writes,),) = sql(pg_db, "SELECT (pg_current_wal_lsn() - '0/0')::bigint")
        sql(
            pg_db,
            "INSERT INTO t SELECT g, 'while down' FROM generate_series(21, 40) g",
            "DELETE FROM t WHERE id <= 5",
        )
        deadline = time.monotonic() + 30
        while len(stream_events(pipe, "public.t")) < 25:  # visible once committed with a cut
            assert time.monotonic() < deadline, "the stream did not stage the changes while Kafka was down"
            time.sleep(0.1)
        time.sleep(2)  # the publisher is now waiting for the broker
        acknowledged = published_lsn(pipe)
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            raise AssertionError(
                "cdc stream did not stop within 60s of SIGTERM while Kafka was down"
            ) from None
        no_traceback((out, err))
        # the stream ended while the broker was still down: stopping did not wait for Kafka
        assert not broker.running(), "the broker came back before the stream stopped"
        staged = staged_lsn(pipe)
        # No change Kafka does not hold is acknowledged (WAL without changes for us, such as
        # the server's running-xacts records, may be: nothing of ours is in it).
        assert slot_info(pg_db, pipe.slot)[1] <= before_writes, (
            "changes acknowledged that Kafka does not hold"
        )
        assert acknowledged < staged, "the changes made while Kafka was down were staged, not published"
    finally:
        if proc.poll() is None:
            kill_tree(proc)
        if not broker.running():
            broker.start()
    stream_until_current(pipe)
    records = table_records(broker.bootstrap, pipe.topic("public.t"))
    check_shape(deduplicated(check_complete(pipe, "public.t", records, 20)), pipe.topic("public.t"), ["id"])


# ---- 5. compaction, and a new follower bootstrapping from the compacted topics ---------------------
COMPACTING_TOPICS = {"min.compaction.lag.ms": "0", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"}


def wait_cleaned(broker, topic: str, timeout: float = 120) -> None:
    """Until Kafka's log cleaner has run over partition 0 of `topic` (its cleaner-offset-checkpoint
    names the partition): a topic whose every key is unique loses nothing, so gaps cannot tell."""
    checkpoint = Path(broker.data_dir) / "cleaner-offset-checkpoint"
    deadline = time.monotonic() + timeout
    while True:
        lines = checkpoint.read_text().splitlines()[2:] if checkpoint.exists() else []
        if any(line.split()[:2] == [topic, "0"] and int(line.split()[2]) > 0 for line in lines):
            return
        assert time.monotonic() < deadline, f"the log cleaner did not run over {topic} within {timeout}s"
        time.sleep(1)


def wait_compacted(bootstrap: str, topic: str, timeout: float = 120) -> list[Rec]:
    """Until the cleaner has removed superseded records from the topic (offsets have gaps)."""
    deadline = time.monotonic() + timeout
    while True:
        records = table_records(bootstrap, topic)
        if records and records[0].offset > 0 and len(records) < records[-1].offset + 1:
            return records
        assert time.monotonic() < deadline, (
            f"{topic} was not compacted within {timeout}s ({len(records)} records)"
        )
        time.sleep(1)


def test_new_follower_bootstraps_from_compacted_topics(
    pg_db: str, tmp_path: Path, compacting_kafka, spark
) -> None:
    """With segments that roll fast and a cleaner that runs at once, Kafka really compacts the
    table topic during the test (superseded snapshot rows and updates disappear, tombstones stay).
    A follower that applied the uncompacted history and a new one that starts from the compacted
    topic's base end with the same Delta table, both identical to the source.
    Beside it a REPLICA IDENTITY FULL table without a key (identical rows; one of them updated, one
    deleted each round): the cleaner runs over its topic too and keeps every record (each keyed by
    its position), so the new follower's first cut, deletes among it, builds the source's multiset
    (read by delta-rs)."""
    broker = compacting_kafka
    make_table(pg_db, "c", 200)
    sql(
        pg_db,
        "CREATE TABLE m(k text, v int)",
        "ALTER TABLE m REPLICA IDENTITY FULL",
        "INSERT INTO m SELECT 'k' || (g % 4), g % 2 FROM generate_series(1, 16) g",
    )
    pipe = make_kpipe(
        tmp_path, pg_db, ["public.c", "public.m"], broker.bootstrap, topic_config=COMPACTING_TOPICS
    )
    topic = pipe.topic("public.c")
    snapshot(pipe)
    snapshot_lsn = published_lsn(pipe)
    for r in range(4):
        time.sleep(0.3)  # past segment.ms: this round's records start a new segment
        sql(
            pg_db,
            f"UPDATE c SET v = 'r{r}-' || id WHERE id % 2 = {r % 2}",
            f"DELETE FROM c WHERE id IN ({10 + r}, {20 + r})",
            f"INSERT INTO c VALUES ({1000 + r}, 'new{r}')",
            f"UPDATE c SET id = {2000 + r} WHERE id = {30 + r}",
            f"INSERT INTO m VALUES ('k{r}', 0), ('k{r}', 0)",
            f"UPDATE m SET v = v + 10 WHERE ctid = (SELECT ctid FROM m WHERE k = 'k{r}' AND v = 0 LIMIT 1)",
            f"DELETE FROM m WHERE ctid = (SELECT ctid FROM m WHERE k = 'k{r}' AND v = 0 LIMIT 1)",
        )
        stream_until_current(pipe)
        if r == 1:
            apply_ok(pipe, spark)  # the old follower applies this part before compaction
    assert topic_config(broker.bootstrap, topic)["min.compaction.lag.ms"] == "0", (
        "topic_config reaches the topic"
    )

    compacted = wait_compacted(broker.bootstrap, topic)
    check_order(compacted, topic)
    # What compaction must keep: per key ever written, its newest record (a deleted key: its tombstone).
    newest = {orjson.dumps({"id": i}).decode(): (snapshot_lsn, 0, False) for i in range(1, 201)}
    for ev in stream_events(pipe, "public.c"):
        key = orjson.dumps({"id": int(key_texts(ev.key)[0])}).decode()
        newest[key] = (ev.lsn, ev.seq, ev.op == "d")
    survivors: dict[str, tuple[int, int, bool]] = {}
    for r in compacted:
        survivors[r.key_text] = (r.lsn, r.seq, r.tombstone)
    assert survivors == newest, "compaction keeps exactly the newest record per key"
    assert sum(1 for r in compacted if r.tombstone) == 12, "tombstones stay (delete.retention.ms)"
    end = end_offset(broker.bootstrap, topic)
    print(f"{topic}: {end} records written, {len(compacted)} left after compaction")
    assert len(compacted) < end - 200, "superseded records are gone"
    multiset = pipe.topic("public.m")
    wait_cleaned(broker, multiset)
    kept = table_records(broker.bootstrap, multiset)
    assert [r.offset for r in kept] == list(range(end_offset(broker.bootstrap, multiset))) and len(
        kept
    ) == 16 + 4 * 5

    apply_ok(pipe, spark)  # the old follower: the rest, from a compacted range
    pipe.write(sinks=[LAKE, {"name": "fresh", "delta": {"path": "fresh"}}], topic_config=COMPACTING_TOPICS)
    runs = apply_ok(pipe, spark, "fresh")
    inserted = {t.table: t.inserted for t in runs[0].tables}
    assert inserted["public.c"] == 200 - 8 - 4 + 4 + 4, runs  # - deleted - moved + inserted + moved
    assert inserted["public.m"] == 16 + 4 * (2 + 1 - 2), (
        runs
    )  # snapshot + inserted - deleted (an update is both)
    verified(pipe, spark)
    source_m = Counter(sql(pg_db, "SELECT k, v FROM m"))
    for base in ("lake", "fresh"):
        rows = delta_rows(None, tmp_path / base / "public" / "m", ("_cdc_lsn", "_cdc_seq"))  # delta-rs
        assert Counter((r["k"], r["v"]) for r in rows.values()) == source_m, base
    old, new = (
        spark.read.format("delta").load(str(tmp_path / base / "public" / "c")).drop("_cdc_commit_ts")
        for base in ("lake", "fresh")
    )
    assert sorted(map(tuple, old.collect())) == sorted(map(tuple, new.collect())), (
        "old and new follower hold the same rows"
    )


def test_compaction_keeps_unchanged_toast_values_for_new_followers(
    pg_db: str, tmp_path: Path, compacting_kafka, spark
) -> None:
    """An update that leaves a TOASTed value unchanged carries a placeholder, not the value. Once
    Kafka has compacted away the record that held the value, a new follower bootstrapping from
    the topic must still end with it (README Guarantees: compaction never loses such values)."""
    broker = compacting_kafka
    sql(
        pg_db,
        "CREATE TABLE tz(id int PRIMARY KEY, n int, big text)",
        "ALTER TABLE tz ALTER COLUMN big SET STORAGE EXTERNAL",
        f"INSERT INTO tz SELECT g, 0, {BIG_TEXT} FROM generate_series(1, 3) g",
    )
    pipe = make_kpipe(
        tmp_path, pg_db, ["public.tz"], broker.bootstrap, sinks=[], topic_config=COMPACTING_TOPICS
    )
    topic = pipe.topic("public.tz")
    snapshot(pipe)
    for statement in ("UPDATE tz SET n = 1", "INSERT INTO tz VALUES (4, 0, 'small')"):
        time.sleep(0.3)  # past segment.ms: a new segment, so the one before can be cleaned
        sql(pg_db, statement)
        stream_until_current(pipe)
    compacted = wait_compacted(broker.bootstrap, topic)
    updates = [r for r in compacted if r.op == "u"]
    assert [r.key["id"] for r in updates] == [1, 2, 3] and not [
        r for r in compacted if r.op == "r" and r.key["id"] < 4
    ]
    # the records that survived compaction (read with kafka-python) hold the source's value of the
    # unchanged TOAST column, not the placeholder: the publisher filled it in from the staging log
    source = source_rows(pg_db, "public.tz", ("id",))
    for record in updates:
        big = record.value["after"]["big"]
        assert big != UNAVAILABLE and big == source[(str(record.key["id"]),)]["big"], record.key
    pipe.write(sinks=[{"name": "fresh", "delta": {"path": "fresh"}}], topic_config=COMPACTING_TOPICS)
    apply_ok(pipe, spark)
    verified(pipe, spark)
    fresh = delta_rows(spark, tmp_path / "fresh" / "public" / "tz")  # plain Spark SQL, not the sink
    assert {k: (r["n"], r["big"]) for k, r in fresh.items()} == {
        k: (int(r["n"]), r["big"]) for k, r in source.items()
    }


# ---- 6. kill -9 while publishing ----------------------------------------------------------------------
def kill_while_publishing(proc: subprocess.Popen, pipe: KPipe, table: str, timeout: float) -> bool:
    """SIGKILL `cdc stream` and its publisher once records are in the topic that no cut covers yet
    (True), or after `timeout` anyway (False)."""
    consumer = KafkaConsumer(
        bootstrap_servers=[pipe.bootstrap], request_timeout_ms=30_000, client_id="test-watch"
    )
    tp = TopicPartition(pipe.topic(table), 0)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            end = consumer.end_offsets([tp])[tp]
            state = published(pipe)
            covered = state["tables"][table]["kafka_end"] if state and table in state["tables"] else -1
            if end - 1 > covered:
                kill_tree(proc)
                return True
            time.sleep(0.002)
    finally:
        consumer.close()
    kill_tree(proc)
    return False


@pytest.mark.slow  # a crash round (the chaos slice kills the publisher child too): make test-slow
def test_kill_9_while_publishing_followers_end_identical(pg_db: str, tmp_path: Path, kafka, spark) -> None:
    """`cdc stream` and its publisher are killed with SIGKILL while records are in flight to Kafka,
    and restarted, three times: the topic may hold republished copies (same positions, same
    content), the staging log holds each position once, and the follower ends identical."""
    make_table(pg_db, "t", 1000)
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], kafka.bootstrap)
    snapshot(pipe)
    writer = Writer(
        pg_db, "t", list(range(1, 1001)), next_id=100_001, seed=6,
        inserts=(20, 40), updates=(10, 30), deletes=(5, 15), max_txns=400, pause=0.01,
    )  # fmt: skip
    rng = random.Random(6)
    writer.start()
    proc = start_stream(pipe)
    mid_publish = 0
    try:
        for _ in range(3):
            time.sleep(rng.uniform(0.5, 2.0))
            assert proc.poll() is None, f"cdc stream died on its own: {proc.communicate()}"
            mid_publish += kill_while_publishing(proc, pipe, "public.t", timeout=15)
            wait_slot(pg_db, pipe.slot, active=False)
            proc = start_stream(pipe)
        writer.finish()
        wait_published(pipe, current_flush_lsn(pg_db), timeout=180)
        wait_acknowledged(pipe, published_lsn(pipe))
        stop_stream(proc)
    finally:
        writer.halt.set()
        if proc.poll() is None:
            kill_tree(proc)
    assert mid_publish >= 1, "no kill landed while records were in flight"

    records = table_records(kafka.bootstrap, pipe.topic("public.t"))
    first = check_complete(pipe, "public.t", records, 1000)  # republished copies carry the same content
    check_shape(deduplicated(first), pipe.topic("public.t"), ["id"])
    assert_log_well_formed(pipe)  # the staging log: each position once, in order
    assert_txns_streamed(pipe, "public.t", writer.txns)
    copies = Counter((r.lsn, r.seq, r.tombstone, r.key_text if r.op == "r" else None) for r in records)
    print(
        f"{mid_publish} kills mid-publish; {sum(n - 1 for n in copies.values())} republished records in the topic"
    )
    assert sum(1 for r in first.values() if r.op in ("c", "u", "d")) == writer.changes
    apply_ok(pipe, spark)
    verified(pipe, spark)


def test_publisher_does_not_outlive_a_killed_stream(pg_db: str, tmp_path: Path, kafka) -> None:
    """kill -9 of the `cdc stream` process alone (not its children): its publisher child must not
    run on as an orphan holding the publisher lock; a restarted stream publishes and stops promptly."""
    make_table(pg_db, "t", 10)
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], kafka.bootstrap)
    snapshot(pipe)
    proc = start_stream(pipe)
    children = child_pids(proc.pid)
    assert children, "cdc stream runs its publisher in a child process"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)  # not communicate(): a surviving child would hold the output pipes open
    try:
        leftover = [pid for pid in children if not wait_gone(pid, 20)]
        assert not leftover, f"processes {leftover} of the killed cdc stream still run 20s later"
    finally:
        for pid in children:
            if alive(pid) and "multiprocessing" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                os.kill(pid, signal.SIGKILL)
    wait_slot(pg_db, pipe.slot, active=False)
    proc = start_stream(pipe)
    try:
        sql(pg_db, "INSERT INTO t VALUES (11, 'after the crash')")
        wait_published(pipe, current_flush_lsn(pg_db), timeout=60)
        stop_stream(proc, timeout=60)  # exit 0, children gone (a hang guard, not a timing)
    finally:
        if proc.poll() is None:
            kill_tree(proc)


def test_a_publisher_killed_while_the_stream_rings_it_stops_the_stream_cleanly(
    pg_db: str, tmp_path: Path, kafka
) -> None:
    """The stream rings its publisher after every cut it commits (cdc/log/kafka/doorbell.py). kill -9
    of the publisher while transactions flow: the stream's rings must neither block nor fail it; it
    notices the dead child and exits with the publisher's error (no traceback, no hang)."""
    make_table(pg_db, "t", 10)
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], kafka.bootstrap)
    snapshot(pipe)
    proc = start_stream(pipe)
    writer = Writer(pg_db, "t", list(range(1, 11)), next_id=1_001, seed=5, pause=0.005)
    writer.start()
    try:
        wait_published(pipe, current_flush_lsn(pg_db), timeout=60)  # rung, and publishing
        cmdlines = {p: Path(f"/proc/{p}/cmdline").read_text(errors="replace") for p in child_pids(proc.pid)}
        spawned = [p for p, cmd in cmdlines.items() if "spawn_main" in cmd]  # not the resource tracker
        assert len(spawned) == 1, f"one publisher child expected, found {spawned}"
        os.kill(spawned[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=60)  # a hang guard, not a timing
    finally:
        writer.halt.set()
        writer.join(30)
        if proc.poll() is None:
            kill_tree(proc)
    assert proc.returncode not in (0, None), f"cdc stream went on without its publisher:\n{out}\n{err}"
    assert "Kafka publisher of this stream stopped" in out + err, out + err
    no_traceback((out, err))
    assert writer.error is None and len(writer.txns) > 0


def test_the_publisher_publishes_when_the_stream_rings_not_when_its_wait_ends(
    pg_db: str, tmp_path: Path, kafka
) -> None:
    """The stream rings its publisher after each cut it commits (cdc/log/kafka/doorbell.py), wired as
    `cdc stream` wires it (log.on_commit), both in this process. The publisher's wait is an hour,
    first wait included: once it waits, only a ring can make it look again, so the row written
    after that reaching Kafka at all proves the ring woke it (no time is measured)."""
    import multiprocessing

    from cdc.log import open_log
    from cdc.log.kafka import publisher as kpub
    from cdc.log.kafka.doorbell import Doorbell, wait_for_ring
    from cdc.reader import StreamReader
    from sinks.registry import load_pipeline

    make_table(pg_db, "t", 3)
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], kafka.bootstrap)
    snapshot(pipe)  # publishes the snapshot itself
    topic = pipe.topic("public.t")
    before = end_offset(kafka.bootstrap, topic)
    pipeline = load_pipeline(pipe.file)
    bell = Doorbell(multiprocessing.get_context("spawn"))
    waiting, stop = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def idle(seconds: float) -> bool:
        waiting.set()
        return wait_for_ring(bell.receiver, seconds)

    def guarded(target) -> threading.Thread:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                failures.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    staging = open_log(pipeline)
    publisher = kpub.Publisher(pipeline, staging)
    log = open_log(pipeline)
    log.on_commit = lambda _cut: bell.ring()  # as `cdc stream` rings its publisher child (cdc/reader.py)
    reader = StreamReader(
        pipeline,
        log,
        install_signal_handlers=False,
        ack_limit=lambda: kpub.published_lsn(log),
    )
    publishing = guarded(lambda: publisher.run(stop.is_set, idle_s=3600, busy_s=3600, idle=idle))
    streaming = guarded(reader.run)
    try:
        assert waiting.wait(60), f"the publisher never waited: {failures}"
        sql(pg_db, "INSERT INTO t VALUES (100, 'rung')")
        deadline = time.monotonic() + 60  # a hang guard far below the publisher's hour
        while end_offset(kafka.bootstrap, topic) <= before:
            assert not failures, f"a thread failed: {failures[0]!r}"
            assert time.monotonic() < deadline, (
                "the row did not reach Kafka: the ring did not wake the publisher"
            )
            time.sleep(0.1)
    finally:
        reader.request_stop()
        streaming.join(30)
        stop.set()
        bell.ring()  # out of its hour-long wait
        publishing.join(30)
        publisher.close()
        bell.close()
        log.close()
        staging.close()
    assert not streaming.is_alive() and not publishing.is_alive()
    assert not failures, failures
    records = table_records(kafka.bootstrap, topic)
    assert [r.key["id"] for r in records if r.op == "c"] == [100]


# ---- verify when the slot lags behind Kafka ----------------------------------------------------------
def stage_without_acknowledging(pipe: KPipe, upto: int) -> None:
    """Capture into the staging log up to `upto` without acknowledging anything to PostgreSQL: the
    state a stream leaves when it stops (or is killed) after publishing but before its next
    acknowledgement."""
    from cdc.log import open_log
    from cdc.reader import StreamReader
    from sinks.registry import load_pipeline

    pipeline = load_pipeline(pipe.file)
    log = open_log(pipeline)
    reader = StreamReader(pipeline, log, install_signal_handlers=False, ack_limit=lambda: 0)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            reader.run()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while staged_lsn(pipe) < upto:
            assert not failure, f"the stream failed: {failure[0]!r}"
            assert time.monotonic() < deadline, "the stream did not stage the changes within 60s"
            time.sleep(0.05)
    finally:
        reader.request_stop()
        thread.join(30)
        log.close()
    assert not failure, f"the stream failed: {failure[0]!r}"


def test_verify_when_the_slot_lags_behind_kafka(pg_db: str, tmp_path: Path, kafka, spark) -> None:
    """Kafka may hold transactions the slot has not confirmed yet (the stream stopped before its
    next acknowledgement, `cdc snapshot` published staged events). PostgreSQL would resend them,
    but they are in the log: verify must find the follower identical, not behind."""
    make_table(pg_db, "t", 10)
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], kafka.bootstrap)
    snapshot(pipe)
    confirmed = slot_info(pg_db, pipe.slot)[1]
    sql(pg_db, "INSERT INTO t SELECT g, 'new' FROM generate_series(11, 20) g", "DELETE FROM t WHERE id <= 3")
    target = current_flush_lsn(pg_db)
    stage_without_acknowledging(pipe, target)
    assert slot_info(pg_db, pipe.slot)[1] == confirmed
    run = snapshot(pipe)  # nothing to snapshot: publishes what the stream staged
    assert "nothing to snapshot" in run.out and published_lsn(pipe) >= target, run.out
    assert slot_info(pg_db, pipe.slot)[1] == confirmed < latest_cut(pipe)["lsn"]
    apply_ok(pipe, spark)
    verified(pipe, spark)


def test_render_workers_publish_what_one_process_publishes(
    pg_db: str, tmp_path: Path, kafka, monkeypatch
) -> None:
    """The publisher splits large ranges into parts rendered by worker processes (snapshot
    segment slices, runs of events, unchanged TOAST values filled per part). Republished that
    way, the staging log gives the very records one process published: same keys, values,
    tombstones and positions, in the same order. So does the pure-Python renderer
    (CDC_PURE_PYTHON=1) against the C speedup."""
    from cdc.envelope import speedups
    from cdc.log.kafka.publisher import STATE_KEY, Publisher
    from cdc.log.local import LocalLog
    from sinks.registry import load_pipeline

    sql(
        pg_db,
        "CREATE TABLE wide(id int PRIMARY KEY, n int, big text, at timestamptz, day date, ok bool)",
        "ALTER TABLE wide ALTER COLUMN big SET STORAGE EXTERNAL",
        f"INSERT INTO wide SELECT g, 0, CASE WHEN g % 50 = 0 THEN {BIG_TEXT} ELSE 'b' || g || E'\\t\"é' END,"
        " '2024-01-01 10:00:00.5+00'::timestamptz + g * interval '1 hour', DATE '2024-01-01' - g, g % 2 = 0"
        " FROM generate_series(1, 3000) g",
    )
    pipe = make_kpipe(tmp_path, pg_db, ["public.wide"], kafka.bootstrap, publisher_workers=0)
    snapshot(pipe)
    sql(
        pg_db,
        "UPDATE wide SET n = n + 1 WHERE id % 7 = 0",  # big unchanged (TOASTed where id % 50 = 0)
        "DELETE FROM wide WHERE id % 11 = 0",
        "INSERT INTO wide SELECT g, 1, 'new' || g, NULL, NULL, NULL FROM generate_series(3001, 3500) g",
        "UPDATE wide SET n = n + 1 WHERE id % 50 = 0",
        "TRUNCATE wide",
        "INSERT INTO wide SELECT g, 2, 'again' || g, now(), 'infinity', true FROM generate_series(1, 200) g",
    )
    stream_until_current(pipe)
    one_process = table_records(kafka.bootstrap, pipe.topic("public.wide"))

    def republish(suffix: str, workers: int) -> list[Rec]:
        pipeline = load_pipeline(pipe.file)
        kafka_cfg = pipeline.log_config.kafka.model_copy(
            update={"topic_prefix": pipe.prefix + suffix, "publisher_workers": workers}
        )
        pipeline = pipeline.model_copy(
            update={"log": pipeline.log_config.model_copy(update={"kafka": kafka_cfg})}
        )
        staging = LocalLog(pipe.log)
        staging.set_meta(
            STATE_KEY, json.dumps({"cut_id": 0, "lsn": 0, "tables": {}})
        )  # publish all of it again
        publisher = Publisher(pipeline, staging)
        publisher.part_events, publisher.part_bytes = (
            97,
            4096,
        )  # many parts: two snapshot segment slices at least
        try:
            produced = publisher.publish_once()
        finally:
            publisher.close()
            staging.close()
        records = table_records(kafka.bootstrap, pipe.prefix + suffix + ".public.wide")
        assert produced == len(records)
        return records

    def content(r: Rec) -> tuple:  # source.name is the topic prefix, which differs
        value = (
            None
            if r.value is None
            else {**r.value, "ts_ms": None, "source": {**r.value["source"], "name": None}}
        )
        return r.offset, r.lsn, r.seq, r.key_text, orjson.dumps(value, option=orjson.OPT_SORT_KEYS)

    workers = republish("w", 2)
    assert len(one_process) == len(workers) > 4000
    assert [content(r) for r in workers] == [content(r) for r in one_process]
    filled = [r for r in one_process if r.op == "u" and r.key["id"] % 50 == 0]
    assert filled and all(r.value["after"]["big"] != UNAVAILABLE for r in filled)
    if speedups():
        monkeypatch.setenv("CDC_PURE_PYTHON", "1")  # read by the render workers too (spawned after this)
        pure = republish("p", 2)
        assert [content(r) for r in pure] == [content(r) for r in one_process]


def test_a_long_ddl_history_keeps_the_read_plan_small(pg_db: str, tmp_path: Path, kafka, spark) -> None:
    """Chaos Kafka round 7 (bench/chaos.py --replay 7 --log kafka): after hours of columns added,
    renamed and dropped, a table had 156 schema versions (this test makes over 20: the plan's size is what it checks), and the reader built one when() per
    version and column, each reading the record's schema-version header. Planning a backlog cut
    filled Spark's 1 GiB driver heap, again after every restart. The reader now looks the record's
    column names up once in one literal map: the header is read once per record, however long the
    history, and the follower still ends identical."""
    from cdc.ground.tables import TableName
    from cdc.log.history import followed_schema
    from cdc.log.kafka.view import KafkaLogView
    from pipelines.apply.readers.kafka import KafkaReader
    from sinks.registry import load_pipeline

    sql(
        pg_db,
        "CREATE TABLE h(id int PRIMARY KEY, v text)",
        "INSERT INTO h SELECT g, 'v' || g FROM generate_series(1, 20) g",
    )
    pipe = make_kpipe(tmp_path, pg_db, ["public.h"], kafka.bootstrap)
    snapshot(pipe)
    v = "v"
    for i in range(1, 21):  # 20 columns added and written, 19 dropped, v renamed twice
        ddl = [
            f"ALTER TABLE h ADD COLUMN c{i} int",
            f"UPDATE h SET c{i} = {i}, {v} = 'u{i}' WHERE id = {i % 20 + 1}",
        ]
        ddl += [f"ALTER TABLE h DROP COLUMN c{i - 1}"] if i > 1 else []
        sql(pg_db, *ddl)
        if i % 10 == 0:
            sql(pg_db, f"ALTER TABLE h RENAME COLUMN {v} TO v{i}", f"UPDATE h SET v{i} = 'r{i}' WHERE id = 3")
            v = f"v{i}"
            # read while the catalog still tells the renamed column apart (README "Schema changes")
            stream_until_current(pipe)
    sql(pg_db, "DELETE FROM h WHERE id = 4", "INSERT INTO h(id, v20, c20) VALUES (99, 'new', 1)")
    stream_until_current(pipe)

    view = KafkaLogView(load_pipeline(pipe.file))
    try:
        table = TableName("public", "h")
        history = view.schema_history(table)
        followed = followed_schema(history)
        frame = KafkaReader(view).read_changes(
            spark, table, -1, view.table_meta(table)["end"], followed.schema, followed.retired
        )
        plan = frame._jdf.queryExecution().optimizedPlan().toString()
    finally:
        view.close()
    assert len(history) > 20 and len(followed.retired) >= 19, (len(history), followed.retired)
    assert plan.count("cdc.sv") <= 2, (
        f"the schema-version header is read {plan.count('cdc.sv')} times per record"
    )

    apply_ok(pipe, spark)
    verified(pipe, spark)
    rows = delta_rows(spark, pipe.dir / "lake" / "public" / "h")
    assert {k: (r["v20"], r["c20"]) for k, r in rows.items()} == {
        k: (r["v20"], r["c20"] and int(r["c20"])) for k, r in source_rows(pg_db, "public.h", ["id"]).items()
    }
