"""Small cuts written by delta-rs in the apply's own process (sinks/delta/rswrite.py; issue 37
item 7, bench/small_cut.py): the same log applied by a follower that lets delta-rs write its small
cuts and by one that keeps Spark (`small_cuts: spark`) ends identical to the source (`cdc verify`)
and to each other, read by delta-rs itself; updates that leave a TOASTed value unchanged, deletes,
a key change, inserts, and timestamps outside the nanosecond range (which delta-rs would read wrong
from Spark's INT96 files) go through it. A replayed cut writes nothing; a table with a feature
delta-rs does not write (column mapping) or one that may hold INT96 timestamps stays with Spark.
And `cdc sql`'s DataFusion engine reads INT96 timestamps written before right.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sinks.delta import rswrite
from tests.fixtures.lake import apply_ok, delta_dir, lake_app_id, make_pipe, snapshot, stream, verified
from tests.fixtures.readers import delta_rows
from tests.harness import sql

pytestmark = pytest.mark.integration

SETUP = (
    "CREATE TABLE w(id int PRIMARY KEY, v text, big text, ts timestamptz, tsa timestamptz[], n numeric(12,2),"
    " b bytea, arr int[])",
    "ALTER TABLE w ALTER COLUMN big SET STORAGE EXTERNAL",  # TOASTed, so updates of v leave it unchanged
    "INSERT INTO w SELECT g, 'v' || g, repeat('x', 9000) || g, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 day',"
    " ARRAY['2024-01-01 00:00:00+00'::timestamptz], g * 1.25, '\\x00ff'::bytea, ARRAY[g, NULL] FROM generate_series(1, 50) g",
)
ROUNDS = (
    ("UPDATE w SET v = v || '!' WHERE id <= 10",),  # big unchanged (TOAST)
    (
        "UPDATE w SET ts = '9999-12-31 23:59:59.999999+00', tsa = ARRAY['0001-01-01 00:00:00+00'::timestamptz] WHERE id = 11",
        "DELETE FROM w WHERE id BETWEEN 20 AND 24",
        "INSERT INTO w VALUES (100, 'new', 'small', '0001-01-01 00:00:00+00', NULL, 1.5, NULL, NULL)",
    ),
    ("UPDATE w SET id = id + 1000 WHERE id = 30", "UPDATE w SET n = n + 1, v = 'again' WHERE id > 40"),
    ("INSERT INTO w SELECT g, 'ins', 'i', now(), NULL, 0, NULL, NULL FROM generate_series(200, 260) g",),
    # a column dropped at the source stays in the followers (dropped_columns: keep); a cut of
    # inserts after the drop's own cut has no value for it: appended with it NULL (the crash
    # campaign's Delta follower failed every cut after this until rswrite.append filled it)
    (
        "ALTER TABLE w DROP COLUMN b",
        "INSERT INTO w SELECT g, 'after', 'd', now(), NULL, 0, ARRAY[g] FROM generate_series(300, 320) g",
    ),
    ("INSERT INTO w SELECT g, 'later', 'd', now(), NULL, 0, ARRAY[g] FROM generate_series(400, 420) g",),
)
SINKS = [
    {"name": "lake", "delta": {"path": "lake"}},  # small_cuts: delta-rs (the default)
    {"name": "spk", "delta": {"path": "spk", "small_cuts": "spark"}},
    {"name": "cm", "delta": {"path": "cm", "column_mapping": "name"}},
]


def writers(path: Path) -> list[tuple[str | None, str]]:
    """(operation, who wrote it: delta-rs or Spark) of each commit, oldest first."""
    out = []
    for f in sorted((path / "_delta_log").glob("*.json")):
        info = next(
            (a["commitInfo"] for a in map(json.loads, f.read_text().splitlines()) if "commitInfo" in a), {}
        )
        who = "delta-rs" if "delta-rs" in str(info.get("clientVersion", "")) else "spark"
        out.append((info.get("operation"), who))
    return out


def comparable(rows: dict[tuple, dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    return {k: {c: v for c, v in r.items() if c != "_cdc_commit_ts"} for k, r in rows.items()}


def test_small_cuts_written_by_delta_rs_match_spark_and_the_source(pg_db: str, tmp_path: Path, spark) -> None:
    sql(pg_db, *SETUP)
    pipe = make_pipe(tmp_path, pg_db, ["public.w"], sinks=SINKS)
    snapshot(pipe)
    apply_ok(pipe, spark)
    lake, spk, cm = (delta_dir(pipe, "public.w", base) for base in ("lake", "spk", "cm"))
    assert rswrite.writable(str(lake)) and not rswrite.writable(str(cm)), "column mapping stays with Spark"
    bootstrap = len(writers(lake))
    for statements in ROUNDS:
        sql(pg_db, *statements)
        stream(pipe)
        apply_ok(pipe, spark)
        verified(pipe, spark)
    # every cut after the bootstrap written by delta-rs in the lake, by Spark elsewhere
    cuts = writers(lake)[bootstrap:]
    assert cuts and all(who == "delta-rs" for _, who in cuts), cuts
    assert {op for op, _ in cuts} >= {"MERGE", "WRITE"}, cuts  # the insert-only cut appended
    assert all(who == "spark" for _, who in writers(spk) + writers(cm)), (writers(spk), writers(cm))
    # the two followers hold the same rows, read by delta-rs (the timestamps outside nanoseconds too)
    ours, theirs = comparable(delta_rows(spark, lake)), comparable(delta_rows(spark, spk))
    assert ours == theirs
    assert str(ours[("11",)]["ts"]).startswith("9999-12-31 23:59:59.999999")
    assert str(ours[("100",)]["ts"]).startswith("0001-01-01 00:00:00")
    assert ours[("400",)]["b"] is None and ours[("1",)]["b"] is not None, "the dropped column as kept"

    # A replayed cut (a crash between the write and the checkpoint) writes nothing.
    app_id = lake_app_id(pipe)
    from deltalake import DeltaTable

    cut = DeltaTable(str(lake)).transaction_version(app_id)
    version = DeltaTable(str(lake)).version()
    assert cut is not None and rswrite.holds(str(lake), app_id, cut)
    assert rswrite.append(str(lake), DeltaTable(str(lake)).to_pyarrow_table().slice(0, 1), app_id, cut) == 1
    assert DeltaTable(str(lake)).version() == version, "a replayed cut committed again"


# Every column of a type pyarrow types as Spark does (sinks/arrowtyping.py), at the edges of its range
TYPED = (
    "CREATE TABLE e(id bigint PRIMARY KEY, s smallint, n int, amount numeric(12,2), ratio float8, f4 real,"
    " ok bool, note varchar(20), body text, day date, at timestamptz, local timestamp, doc jsonb, u uuid,"
    " bin bytea, tod time, tags text[], grid int8[][])",
    "INSERT INTO e SELECT g, g, g, g * 1.25, g / 7.0, g / 3.0, g % 2 = 0, 'n' || g, 'body ' || g,"
    " '2024-01-01'::date + g, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 hour',"
    " '2024-01-01'::timestamp + g * interval '1 second', jsonb_build_object('g', g),"
    " md5(g::text)::uuid, decode(md5(g::text), 'hex'), '00:00'::time + g * interval '1 minute'"
    " FROM generate_series(1, 20) g",
    "ALTER TABLE e ALTER COLUMN body SET STORAGE EXTERNAL",  # a long body is TOASTed out of line
)
EDGES = (
    "INSERT INTO e VALUES"
    " (100, 32767, 2147483647, 9999999999.99, 'Infinity', '-Infinity', true, 'ü✓', E'tab\\there', '0001-01-01',"
    " '0001-01-01 00:00:00+00', '9999-12-31 23:59:59.999999', '{\"a\": [1, null]}', NULL, '\\x00ff', '24:00:00'),"
    " (101, -32768, -2147483648, -0.01, '-0', 1e-45, false, '', '', '9999-12-31', '9999-12-31 23:59:59.999999+00',"
    " '1582-10-04 12:00:00.5', 'null', '00000000-0000-0000-0000-000000000000', '', '00:00:00.000001'),"
    " (102, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "INSERT INTO e SELECT g, g % 100, g, g * 0.01, g * 1e300, g / 9.0, true, 'x', repeat('y', g % 50),"
    " '1970-01-01'::date - g, '1969-12-31 23:59:59.999999-08'::timestamptz + g * interval '1 microsecond',"
    " '2000-02-29 00:00:00'::timestamp, '[]', NULL, decode(repeat('ab', g), 'hex'), '23:59:59.999999'"
    " FROM generate_series(200, 700) g",
    "INSERT INTO e (id, tags, grid) VALUES (103, ARRAY['a,b', NULL, 'NULL', '', 'ü\"'], '{{1,2},{3,NULL}}'),"
    " (104, '{}', '{}'), (105, '{x}', '[0:0][1:2]={{-9223372036854775808,9223372036854775807}}')",
)


def _last_job(spark) -> int:
    return max(spark.sparkContext.statusTracker().getJobIdsForGroup(None), default=-1)


def _written_in_driver(pipe, spark, lake: Path, spk: Path, operation: str) -> dict[tuple, dict[str, Any]]:
    """Stream what the source committed, apply the lake follower (no Spark job, one delta-rs
    commit of `operation`), then the Spark-written one; both verified and equal. Returns the lake's rows."""
    stream(pipe)
    commits, before = len(writers(lake)), _last_job(spark)
    apply_ok(pipe, spark, "lake")
    assert _last_job(spark) == before, f"the cut written in the driver ran a Spark job ({operation})"
    assert writers(lake)[commits:] == [(operation, "delta-rs")]
    apply_ok(pipe, spark, "spk")
    verified(pipe, spark)
    ours = delta_rows(spark, lake)
    assert comparable(ours) == comparable(delta_rows(spark, spk))
    return ours


def test_a_cut_of_inserts_typed_in_the_driver_appends_with_no_spark_job(
    pg_db: str, tmp_path: Path, spark
) -> None:
    """A small cut of inserts whose every column pyarrow types (sinks/arrowtyping.py) is checked,
    typed and appended by delta-rs with no Spark job, and holds what Spark's typing writes."""
    sql(pg_db, *TYPED)
    pipe = make_pipe(tmp_path, pg_db, ["public.e"], sinks=SINKS[:2])
    snapshot(pipe)
    apply_ok(pipe, spark)
    lake, spk = (delta_dir(pipe, "public.e", base) for base in ("lake", "spk"))
    sql(pg_db, *EDGES)
    ours = _written_in_driver(pipe, spark, lake, spk, "WRITE")
    theirs = delta_rows(spark, spk)
    assert len(ours) == 20 + 6 + 501
    assert ours[("103",)]["tags"] == ["a,b", None, "NULL", "", 'ü"'] and ours[("103",)]["grid"] == [
        [1, 2],
        [3, None],
    ]
    assert ours[("102",)] == {
        **dict.fromkeys(ours[("102",)], None),
        **{k: ours[("102",)][k] for k in ("id", "_cdc_lsn", "_cdc_seq", "_cdc_op", "_cdc_commit_ts")},
    }
    assert ours[("100",)]["ratio"] == float("inf")
    assert str(ours[("101",)]["ratio"]) == str(theirs[("101",)]["ratio"]) == "-0.0"
    # a cut of updates, deletes, a key change, a key deleted and inserted again and one updated
    # twice is netted in the driver too (TableBatch._net_in_driver): delta-rs MERGEs it, no Spark job
    sql(
        pg_db,
        "UPDATE e SET note = 'upd', at = now() WHERE id < 10",
        "INSERT INTO e VALUES (800)",
        "DELETE FROM e WHERE id BETWEEN 200 AND 210",
        "UPDATE e SET id = 5000 WHERE id = 211",
        "DELETE FROM e WHERE id = 212",
        "INSERT INTO e (id, note) VALUES (212, 'back')",
        "UPDATE e SET ratio = 'NaN' WHERE id = 213",
    )
    sql(pg_db, "UPDATE e SET ratio = -1, day = '2000-01-01' WHERE id = 213")
    ours = _written_in_driver(pipe, spark, lake, spk, "MERGE")
    assert ("211",) not in ours and ours[("5000",)]["note"] == "x" and ours[("212",)]["note"] == "back"
    assert ours[("213",)]["ratio"] == -1 and str(ours[("213",)]["day"]) == "2000-01-01"
    # updates that leave a TOASTed value unchanged (PostgreSQL does not send it): netted here too,
    # the value taken from the cut's own earlier event, or kept from the follower's row
    sql(pg_db, "UPDATE e SET body = repeat('z', 9000) || id WHERE id <= 5")
    stream(pipe)
    apply_ok(pipe, spark)
    sql(pg_db, "UPDATE e SET note = 'toast' WHERE id <= 5", "UPDATE e SET body = 'short' WHERE id = 6")
    sql(pg_db, "UPDATE e SET body = repeat('q', 9000) WHERE id = 6", "UPDATE e SET note = 't6' WHERE id = 6")
    ours = _written_in_driver(pipe, spark, lake, spk, "MERGE")
    assert ours[("3",)]["note"] == "toast" and ours[("3",)]["body"] == "z" * 9000 + "3"
    assert ours[("6",)]["note"] == "t6" and ours[("6",)]["body"] == "q" * 9000
    # a truncate inside a cut: the rows before it go (a Spark delete), the rest is netted here
    sql(
        pg_db,
        "UPDATE e SET note = 'gone' WHERE id = 1",
        "TRUNCATE e",
        "INSERT INTO e (id, note) VALUES (1, 'one')",
    )
    stream(pipe)
    apply_ok(pipe, spark)
    verified(pipe, spark)
    assert comparable(delta_rows(spark, lake)) == comparable(delta_rows(spark, spk))
    assert [r["note"] for r in delta_rows(spark, lake).values()] == ["one"]


def test_int96_timestamps_stay_with_spark_and_read_right_in_datafusion(tmp_path: Path, spark) -> None:
    """A table made before cdc wrote INT64 timestamps (no `cdc.timestamps` property) may hold
    Spark's INT96 ones: delta-rs does not rewrite it, and DataFusion (`cdc sql`) reads them right."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    from pipelines.lakesql_df import QUERY_CONFIG

    path = str(tmp_path / "old")
    spark.conf.set("spark.sql.parquet.outputTimestampType", "INT96")  # Spark's default until now
    try:
        spark.sql(
            "SELECT 1 AS id, timestamp'9999-12-31 23:59:59.999999' AS ts, timestamp'0001-01-01 00:00:00' AS early"
        ).write.format("delta").save(path)
    finally:
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    assert not rswrite.writable(path)
    query = "SELECT CAST(ts AS BIGINT) AS ts, CAST(early AS BIGINT) AS early FROM t"
    micros = {"ts": 253402300799999999, "early": -62135596800000000}

    def read(config: dict[str, str]) -> dict[str, int]:
        qb = QueryBuilder(config)
        qb.register("t", DeltaTable(path))
        return pa.table(qb.execute(query).read_all()).to_pylist()[0]

    assert read(QUERY_CONFIG) == micros
    assert read({}) != micros, "DataFusion's default read INT96 right: the setting is not needed any more"
