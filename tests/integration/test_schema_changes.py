"""Column renames and drops followed by every follower kind, on the local and the Kafka log.

A rename keeps the column's attnum, which the log records with each schema version: followers
rename their own column (Delta: the table rewritten in one commit, metadata only on a table with
column mapping; search and cache: every stored row), and an event
written before the rename lands in the renamed column even when the rename is in the same batch.
A dropped column stays in the followers with the last value the source had. Each scenario is
checked with an independent reader (Spark, delta-rs and Polars reading the Delta path, redis-py,
tantivy's own searcher, opensearch-py) and `cdc verify` exit 0, with no `cdc snapshot` after the DDL.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import tantivy
from opensearchpy import OpenSearch

from cdc.ground.tables import TableName
from tests.fixtures import kafka_log as klog
from tests.fixtures.lake import HIST, LAKE, apply_ok, delta_df, make_pipe, snapshot, stream, verified
from tests.fixtures.readers import DELTA_RS_LACKS, delta_reader_features, delta_rows, polars_rows
from tests.harness import sql

pytestmark = pytest.mark.integration

Reader = Callable[[str], tuple[dict[int, dict], list[int]]]  # column -> (rows by id, ids a query on it finds)

SETUP = (
    "CREATE TABLE acc(id int PRIMARY KEY, note text, n int, dropme text)",
    "INSERT INTO acc SELECT g, 'note' || g, g, 'd' || g FROM generate_series(1, 20) g",
)
# One batch: an update, then the rename; an update of the column about to go, then the drop; writes after.
RENAME_AND_DROP = (
    "UPDATE acc SET note = 'after upd' WHERE id = 11",
    "ALTER TABLE acc RENAME COLUMN note TO remark",
    "UPDATE acc SET dropme = 'last' WHERE id = 12",
    "ALTER TABLE acc DROP COLUMN dropme",
    "UPDATE acc SET n = 0 WHERE id = 14",
    "INSERT INTO acc(id, remark, n) VALUES (21, 'new', 21)",
)
# A later batch: renamed again, with an update just before (the log learns of a DDL with the
# table's next change: PostgreSQL sends the new columns then).
RENAME_AGAIN = (
    "UPDATE acc SET remark = 'r2' WHERE id = 2",
    "ALTER TABLE acc RENAME COLUMN remark TO memo",
    "INSERT INTO acc(id, memo, n) VALUES (22, 'm22', 22)",
)


def rows(df, *columns: str) -> dict:
    return {r["id"]: tuple(r[c] for c in columns) for r in df.select("id", *columns).collect()}


def check_delta(spark, base: Path, scd2: bool, name: str) -> None:
    """The Delta table read by Spark straight from its path (not through the sink)."""
    df = spark.read.format("delta").load(str(base / "public" / "acc"))
    assert name in df.columns and "note" not in df.columns, df.columns
    assert "dropme" in df.columns, "a dropped column stays in the follower"
    current = df.filter("_cdc_end_lsn IS NULL") if scd2 else df
    got = rows(current, name, "dropme", "n")
    assert len(got) == current.count() == 21
    assert got[1] == ("note1", "d1", 1), "a row not written since the rename has its value under the new name"
    assert got[11][0] == "after upd", "the update made before the rename in the same batch"
    assert got[12][1] == "last", "the update made before the drop in the same batch"
    assert got[14] == ("note14", "d14", 0), (
        "a row updated after the drop keeps the dropped column's last value"
    )
    assert got[21] == ("new", None, 21)
    if scd2:
        old = df.filter("id = 11 AND _cdc_end_lsn IS NOT NULL").select(name).collect()
        assert [r[0] for r in old] == ["note11"], "history rows hold the old values under the new name"
    # The rename rewrote the table (no column mapping): delta-rs and Polars read it too, the same rows.
    path = base / "public" / "acc"
    assert not delta_reader_features(path) & DELTA_RS_LACKS, delta_reader_features(path)
    key = ("id", "_cdc_start_lsn") if scd2 else ("id",)
    for reader, read in (("delta-rs", delta_rows(None, path, key)), ("polars", polars_rows(path, key))):
        live = {
            int(k[0]): (r[name], r["dropme"], r["n"])
            for k, r in read.items()
            if r.get("_cdc_end_lsn") is None
        }
        assert live == got, reader


# README "SCD2 history": the versions current at a source position, and at a time.
AS_OF_LSN = "SELECT * FROM delta.`{path}` WHERE _cdc_start_lsn <= {lsn} AND (_cdc_end_lsn IS NULL OR _cdc_end_lsn > {lsn})"
AS_OF_TIME = "SELECT * FROM delta.`{path}` WHERE _cdc_commit_ts <= TIMESTAMP '{ts}' AND (_cdc_end_ts IS NULL OR _cdc_end_ts > TIMESTAMP '{ts}')"


def check_as_of(spark, hist: Path, lsn: int, ts: str, name: str) -> None:
    """Before the batch: 20 rows, id 11 with its old value (under the column's new name)."""
    path = hist / "public" / "acc"
    for query in (AS_OF_LSN.format(path=path, lsn=lsn), AS_OF_TIME.format(path=path, ts=ts)):
        got = rows(spark.sql(query), name, "dropme")
        assert sorted(got) == list(range(1, 21)), query
        assert got[11] == ("note11", "d11") and got[12] == ("note12", "d12"), query
    now = rows(spark.sql(AS_OF_TIME.format(path=path, ts="9999-01-01 00:00:00")), name)
    assert len(now) == 21 and now[11] == ("after upd",)


def check_snapshot_time(spark, lake: Path, started: str) -> None:
    """Snapshot rows carry the snapshot's time as _cdc_commit_ts (not NULL, not 1970)."""
    df = spark.read.format("delta").load(str(lake / "public" / "acc")).filter("_cdc_op = 'r'")
    (low, high) = df.selectExpr("min(_cdc_commit_ts)", "max(_cdc_commit_ts)").first()
    assert df.count() > 0 and low is not None and low == high, (low, high)
    assert spark.sql(
        f"SELECT TIMESTAMP '{started}' <= TIMESTAMP '{low}' AND TIMESTAMP '{low}' <= current_timestamp()"
    ).first()[0], (started, low)


def source_position(dsn: str) -> tuple[int, str]:
    """The source's current WAL position (as a number) and time (UTC, as Spark SQL reads it)."""
    ((lsn, ts),) = sql(
        dsn,
        "SELECT pg_current_wal_lsn() - '0/0', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')",
    )
    return int(lsn), ts


# ---- independent readers of the search and cache followers -----------------------------------------
def cache_sink(url: str) -> dict:
    return {"name": "cache", "redis": {"url": url, "tables": ["public.acc"]}}


def redis_reader(url: str) -> Reader:
    def read(column: str) -> tuple[dict[int, dict], list[int]]:
        client = redis.Redis.from_url(url, decode_responses=True)
        try:
            got = {
                json.loads(client.get(k))["id"]: json.loads(client.get(k))
                for k in client.scan_iter(match="public.acc:*")
            }
        finally:
            client.close()
        return got, sorted(i for i, r in got.items() if r.get(column) == "after upd")

    return read


def tantivy_reader(directory: Path) -> Reader:
    """The index read with tantivy itself: the generation the sidecar names, stored rows, a query on the column."""

    def read(column: str) -> tuple[dict[int, dict], list[int]]:
        sidecar = json.loads((directory / "cdc.json").read_text())
        index = tantivy.Index.open(str(directory / f"g{sidecar['generation']}"))
        searcher = index.searcher()
        docs = [searcher.doc(a) for _s, a in searcher.search(tantivy.Query.all_query(), 1000).hits]
        got = {}
        for doc in docs:
            if doc.get_first("_cdc_kind") == 1:
                row = json.loads(bytes(doc.get_first("_cdc_row")))
                got[row["id"]] = row
        found = searcher.search(index.parse_query("upd", [column]), 100).hits
        return got, sorted(json.loads(bytes(searcher.doc(a).get_first("_cdc_row")))["id"] for _s, a in found)

    return read


def opensearch_reader(url: str, alias: str) -> Reader:
    def read(column: str) -> tuple[dict[int, dict], list[int]]:
        client = OpenSearch([url])
        try:
            client.indices.refresh(index=alias)
            docs = client.search(index=alias, body={"query": {"match_all": {}}, "size": 1000})["hits"]["hits"]
            found = client.search(index=alias, body={"query": {"match": {column: "upd"}}, "size": 100})[
                "hits"
            ]["hits"]
        finally:
            client.close()
        return {d["_source"]["id"]: d["_source"] for d in docs}, sorted(d["_source"]["id"] for d in found)

    return read


def check_follower(read: Reader, name: str, old: str) -> None:
    got, found = read(name)
    assert len(got) == 21, sorted(got)
    assert all(old not in r for r in got.values()), "the old name is gone from every row"
    assert got[1][name] == "note1", "a row not written since the rename has its value under the new name"
    assert got[11][name] == "after upd" and found == [11], (
        "the update before the rename, searchable by the new name"
    )
    assert got[12]["dropme"] == "last" and got[14]["dropme"] == "d14" and got[14]["n"] == 0
    assert got[21][name] == "new" and got[21].get("dropme") is None


def scenario(
    pipe, spark, run_stream, lake: Path, hist: Path, started: str, readers: dict[str, Reader]
) -> None:
    check_snapshot_time(spark, lake, started)
    lsn, ts = source_position(pipe.dsn)
    sql(pipe.dsn, *RENAME_AND_DROP)
    run_stream(pipe)
    apply_ok(pipe, spark)
    check_delta(spark, lake, False, "remark")
    check_delta(spark, hist, True, "remark")
    check_as_of(spark, hist, lsn, ts, "remark")
    for kind, read in readers.items():
        try:
            check_follower(read, "remark", "note")
        except AssertionError as exc:
            raise AssertionError(f"{kind}: {exc}") from exc
    verified(pipe, spark)

    sql(pipe.dsn, *RENAME_AGAIN)
    run_stream(pipe)
    apply_ok(pipe, spark)
    df = spark.read.format("delta").load(str(lake / "public" / "acc"))
    assert "memo" in df.columns and "remark" not in df.columns
    assert rows(df, "memo")[2] == ("r2",) and rows(df, "memo")[3] == ("note3",)
    hist_df = spark.read.format("delta").load(str(hist / "public" / "acc")).filter("_cdc_end_lsn IS NULL")
    assert rows(hist_df, "memo")[2] == ("r2",) and rows(hist_df, "memo")[11] == ("after upd",)
    for kind, read in readers.items():
        got, found = read("memo")
        assert len(got) == 22 and found == [11], kind
        assert got[2]["memo"] == "r2" and got[3]["memo"] == "note3" and "remark" not in got[3], (kind, got[3])
    verified(pipe, spark)


def test_rename_and_drop_column_local_log(pg_db: str, tmp_path: Path, spark, redis_db: str) -> None:
    sql(pg_db, *SETUP)
    search = {"name": "search", "search": {"engine": "tantivy", "path": "idx", "tables": ["public.acc"]}}
    pipe = make_pipe(tmp_path, pg_db, ["public.acc"], sinks=[LAKE, HIST, search, cache_sink(redis_db)])
    _, started = source_position(pg_db)
    snapshot(pipe)
    apply_ok(pipe, spark)
    readers = {
        "tantivy": tantivy_reader(tmp_path / "idx" / "public" / "acc"),
        "redis": redis_reader(redis_db),
    }
    scenario(pipe, spark, stream, tmp_path / "lake", tmp_path / "hist", started, readers)
    assert delta_df(spark, pipe, "public.acc").count() == 22


# `make test-slow`: the scenario is the followers' (the local log's run above); `make test` has the Kafka
# log's schema versions in test_kafka_log.py (an added column) and test_ddl_capture.py (a rename on the
# schemas topic at its commit), and OpenSearch's field rename and drop in test_ddl_capture.py.
@pytest.mark.slow
def test_rename_and_drop_column_kafka_log(
    pg_db: str, tmp_path: Path, spark, kafka, opensearch, redis_db: str
) -> None:
    sql(pg_db, *SETUP)
    prefix = f"sc{tmp_path.name[-6:].lower()}".replace("_", "")
    search = {
        "name": "search",
        "search": {
            "engine": "opensearch",
            "hosts": [opensearch.url],
            "index_prefix": prefix,
            "replicas": 0,
            "tables": ["public.acc"],
        },
    }
    sinks = [LAKE, HIST, search, cache_sink(redis_db)]
    pipe = klog.make_kpipe(tmp_path, pg_db, ["public.acc"], kafka.bootstrap, sinks=sinks)
    _, started = source_position(pg_db)
    klog.snapshot(pipe)
    klog.apply_ok(pipe, spark)
    readers: dict[str, Any] = {
        "opensearch": opensearch_reader(opensearch.url, f"{prefix}.public.acc"),
        "redis": redis_reader(redis_db),
    }
    scenario(pipe, spark, klog.stream_until_current, tmp_path / "lake", tmp_path / "hist", started, readers)


def test_log_records_column_identity(pg_db: str, tmp_path: Path) -> None:
    """Each schema version carries the columns' attnums, also when the stream reads a Relation
    message after later DDL renamed its column again (a generated column is never a candidate)."""
    from cdc.log.local import LocalLog

    sql(
        pg_db,
        "CREATE TABLE g(id int PRIMARY KEY, a text, tot int GENERATED ALWAYS AS (id * 2) STORED, b text)",
        "INSERT INTO g(id, a, b) SELECT x, 'a' || x, 'b' || x FROM generate_series(1, 3) x",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.g"], sinks=[])
    snapshot(pipe)
    sql(
        pg_db,
        "UPDATE g SET a = 'x' WHERE id = 1",
        "ALTER TABLE g RENAME COLUMN a TO a2",
        "UPDATE g SET a2 = 'y' WHERE id = 1",
        "ALTER TABLE g RENAME COLUMN a2 TO a3",
        "ALTER TABLE g DROP COLUMN b",
        "ALTER TABLE g ADD COLUMN c text",
        "UPDATE g SET c = 'new' WHERE id = 1",
    )
    stream(pipe)
    log = LocalLog(pipe.log, readonly=True)
    try:
        versions = [
            [(c.name, c.attnum) for c in s.columns]
            for _v, _since, s in log.schema_history(TableName("public", "g"))
        ]
    finally:
        log.close()
    assert versions == [
        [("id", 1), ("a", 2), ("b", 4)],
        [("id", 1), ("a2", 2), ("b", 4)],
        [("id", 1), ("a3", 2), ("c", 5)],
    ]


def test_renames_read_late_among_dropped_columns_keep_the_column(pg_db: str, tmp_path: Path) -> None:
    """A column renamed again and again while other columns are added and dropped, all before the
    stream reads any of it (a stream that was down): the catalog's dropped attnums leave the order
    ambiguous, but the renamed column's attnum is live, so each version still carries it, and the
    followed schema renames the column instead of retiring it (its values would stay under an old
    name, the new one empty: found by the Kafka log's long-history test)."""
    from cdc.log.history import followed_schema
    from cdc.log.local import LocalLog

    sql(pg_db, "CREATE TABLE rl(id int PRIMARY KEY, v text)", "INSERT INTO rl VALUES (1, 'a'), (2, 'b')")
    pipe = make_pipe(tmp_path, pg_db, ["public.rl"], sinks=[])
    snapshot(pipe)
    ddl, v = [], "v"
    for i in range(1, 7):
        ddl += [
            f"ALTER TABLE rl ADD COLUMN c{i} int",
            f"UPDATE rl SET c{i} = {i}, {v} = 'u{i}' WHERE id = {i % 2 + 1}",
        ]
        ddl += [f"ALTER TABLE rl DROP COLUMN c{i - 1}"] if i > 1 else []
        if i % 2 == 0:
            ddl += [f"ALTER TABLE rl RENAME COLUMN {v} TO v{i}", f"UPDATE rl SET v{i} = 'r{i}' WHERE id = 1"]
            v = f"v{i}"
    sql(pg_db, *ddl)
    stream(pipe)
    log = LocalLog(pipe.log, readonly=True)
    try:
        history = log.schema_history(TableName("public", "rl"))
    finally:
        log.close()
    names = [[c.name for c in s.columns if c.attnum == 2] for _v, _since, s in history]  # v's attnum
    assert all(len(n) == 1 for n in names), names
    assert list(dict.fromkeys(n[0] for n in names)) == ["v", "v2", "v4", "v6"], names
    followed = followed_schema(history)
    assert followed.renames["v6"] == ("v4", "v2", "v"), followed.renames
    assert not {"v", "v2", "v4"} & followed.retired, followed.retired
