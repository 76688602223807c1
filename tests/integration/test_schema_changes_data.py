"""Schema changes that change rows without row-level change events, and what followers and
`cdc verify` make of them (issue 11 items 1-3, issue 22 item 3).

Each test reads the Delta follower back with the test Spark session (an independent reader of
the parquet/Delta files) and checks `cdc verify` too; the re-base test reads an Iceberg follower
with pyiceberg as well.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipelines.checkpoints import load_checkpoint
from pipelines.cli import cli
from sinks.registry import load_pipeline
from snapshot.runner import run_snapshot
from tests.fixtures.capture import Pipe, start_stream, stop_stream
from tests.fixtures.readers import delta_rows, iceberg_catalog, iceberg_rows, tantivy_docs, tantivy_ids
from tests.harness import (
    apply_crashing,
    apply_once,
    cdc,
    cdc_here,
    edit_pipeline,
    flush_wal,
    materialize,
    source_rows,
    sql,
    stream_in_process,
    verify,
    write_pipeline,
)

pytestmark = pytest.mark.integration


def _pipeline(tmp_path: Path, dsn: str, tables: list[str], *more_sinks: dict) -> Path:
    sinks = [{"name": "lake", "delta": {"path": "lake"}}, *more_sinks]
    return write_pipeline(tmp_path, dsn, tables, name="ddl", sinks=sinks)


def _snapshot(file: Path) -> None:
    run_snapshot(load_pipeline(file), progress=False)


def stream_cli(file: Path, *needles: str) -> str:
    """`cdc stream --until current` as a user runs it: exit 0 and every needle in its output."""
    run = cdc("stream", file, "--until", "current")
    assert run.code == 0, run.out + run.err
    missing = [n for n in needles if n not in run.out]
    assert not missing, (missing, run.out)
    return run.out


def _delta(spark, tmp_path: Path, table: str, columns: list[str], key: str = "id") -> dict:
    schema, name = table.split(".")
    df = spark.read.format("delta").load(str(tmp_path / "lake" / schema / name))
    missing = [c for c in columns if c not in df.columns]
    assert not missing, f"Delta table {table} has no column(s) {missing}: {df.columns}"
    return {
        str(r[key]): tuple(None if r[c] is None else str(r[c]) for c in columns)
        for r in df.select(key, *columns).collect()
    }


def _source(dsn: str, table: str, columns: list[str], key: str = "id") -> dict:
    return {k[0]: tuple(row[c] for c in columns) for k, row in source_rows(dsn, table, [key]).items()}


def _column_added_after_apply(dsn: str, tmp_path: Path, spark, streamed: bool = True) -> Path:
    """public.t applied to the Delta follower, then ADD COLUMN note (no write after it), streamed
    unless `streamed` is false (a stream with nothing pending may put the column in the log)."""
    sql(
        dsn,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 5) g",
    )
    file = _pipeline(tmp_path, dsn, ["public.t"])
    _snapshot(file)
    apply_once(file, spark)
    sql(dsn, "ALTER TABLE t ADD COLUMN note text")
    if streamed:
        stream_in_process(file)
    return file


# ---- issue 11 item 1: ADD COLUMN ... DEFAULT on a partitioned table --------------------------------------
def test_add_column_default_on_partitioned_table_reaches_untouched_rows(
    pg_db: str, tmp_path: Path, spark
) -> None:
    """The fast default lives on each partition, not on the partitioned parent (whose
    atthasmissing is false): rows of every partition not written since must get it."""
    sql(
        pg_db,
        "CREATE TABLE o (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region)",
        "CREATE TABLE o_eu PARTITION OF o FOR VALUES IN ('eu')",
        "CREATE TABLE o_us PARTITION OF o FOR VALUES IN ('us')",
        "INSERT INTO o SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, 'v' || g FROM generate_series(1, 10) g",
    )
    search = {"name": "search", "search": {"engine": "tantivy", "path": "search", "tables": ["public.o"]}}
    file = _pipeline(tmp_path, pg_db, ["public.o"], search)
    _snapshot(file)
    apply_once(file, spark)
    sql(
        pg_db,
        "ALTER TABLE o ADD COLUMN tier text DEFAULT 'std'",
        "INSERT INTO o VALUES (11, 'eu', 'new', 'given')",
    )
    stream_in_process(file)
    apply_once(file, spark)
    got = _delta(spark, tmp_path, "public.o", ["region", "v", "tier"])
    assert got == _source(pg_db, "public.o", ["region", "v", "tier"])
    assert got["1"][2] == "std" and got["2"][2] == "std" and got["11"][2] == "given"
    code, report = verify(file, spark)  # Delta and the search index
    assert code == 0 and "sink search: public.o: identical" in report, report
    # tantivy's own searcher: the untouched rows' stored documents hold the default and are found
    # by it (not only filled in when the sink reads them back; found by bench/chaos.py seed 4)
    index = tmp_path / "search" / "public" / "o"
    assert {d["id"]: d.get("tier") for d in tantivy_docs(index).values()} == {
        **{i: "std" for i in range(1, 11)},
        11: "given",
    }
    assert len(tantivy_ids(index, "tier:std", ["tier"])) == 10


def test_partition_attached_with_its_own_default_is_re_based(pg_db: str, tmp_path: Path, spark) -> None:
    """A partition attached later brings rows without change events, and its fast default can
    differ from the other partitions' (one value per column cannot say which rows have which):
    `cdc stream` re-bases the table."""
    sql(
        pg_db,
        "CREATE TABLE o (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region)",
        "CREATE TABLE o_eu PARTITION OF o FOR VALUES IN ('eu')",
        "INSERT INTO o SELECT g, 'eu', 'v' || g FROM generate_series(1, 5) g",
    )
    file = _pipeline(tmp_path, pg_db, ["public.o"])
    _snapshot(file)
    apply_once(file, spark)
    sql(
        pg_db,
        "ALTER TABLE o ADD COLUMN tier text DEFAULT 'std'",
        "CREATE TABLE o_af (id int, region text, v text, PRIMARY KEY (id, region))",
        "INSERT INTO o_af SELECT g, 'af', 'w' || g FROM generate_series(1, 3) g",
        "ALTER TABLE o_af ADD COLUMN tier text DEFAULT 'other'",
        "ALTER TABLE o ATTACH PARTITION o_af FOR VALUES IN ('af')",
        "INSERT INTO o VALUES (9, 'eu', 'new', 'given')",
    )
    stream_cli(file, "a partition was attached with rows", "re-base public.o: done")
    apply_once(file, spark)
    key = ["id", "region"]
    df = spark.read.format("delta").load(str(tmp_path / "lake" / "public" / "o"))
    got = {(str(r["id"]), r["region"]): (r["v"], r["tier"]) for r in df.collect()}
    want = {k: (row["v"], row["tier"]) for k, row in source_rows(pg_db, "public.o", key).items()}
    assert got == want
    assert got[("1", "af")] == ("w1", "other") and got[("1", "eu")] == ("v1", "std")
    code, report = verify(file, spark)
    assert code == 0, report


# ---- issue 14 item 3: partitioned tables on each major ---------------------------------------------------
def test_partitioned_table_rows_move_and_partitions_come_and_go_while_streaming(
    pg_any_db: str, tmp_path: Path, spark
) -> None:
    """Captured as the parent (publish_via_partition_root): a row moving to another partition
    (UPDATE of the partition key) is a key change of the parent; a partition attached with rows
    or detached while `cdc stream` runs changes the parent's rows without row events, and the
    stream re-bases the table. On PostgreSQL 15 and 18."""
    dsn = pg_any_db
    sql(
        dsn,
        "CREATE TABLE o (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region)",
        "CREATE TABLE o_eu PARTITION OF o FOR VALUES IN ('eu')",
        "CREATE TABLE o_us PARTITION OF o FOR VALUES IN ('us')",
        "INSERT INTO o SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, 'v' || g FROM generate_series(1, 10) g",
    )
    file = _pipeline(tmp_path, dsn, ["public.o"])
    _snapshot(file)
    pipe = Pipe(tmp_path, file, dsn, "ddl")
    proc = start_stream(pipe)
    sql(
        dsn,
        "UPDATE o SET region = 'eu', v = 'moved' WHERE id = 1",  # o_us -> o_eu
        "UPDATE o SET v = 'stays' WHERE id = 2",
        "CREATE TABLE o_af (id int, region text, v text, PRIMARY KEY (id, region))",
        "INSERT INTO o_af SELECT g, 'af', 'w' || g FROM generate_series(1, 3) g",
        "ALTER TABLE o ATTACH PARTITION o_af FOR VALUES IN ('af')",
        "INSERT INTO o VALUES (20, 'af', 'new')",
        "ALTER TABLE o DETACH PARTITION o_us",  # ids 3, 5, 7, 9 leave o
        "INSERT INTO o VALUES (21, 'eu', 'after detach')",
    )
    flush_wal(dsn)
    stop_stream(proc)
    stream_cli(file)  # whatever the background stream had not reached yet
    key = ["id", "region"]
    want = source_rows(dsn, "public.o", key)
    assert ("1", "eu") in want and ("3", "us") not in want and ("1", "af") in want
    assert materialize(pipe.log)["public.o"] == want  # the log, replayed
    apply_once(file, spark)
    got = delta_rows(spark, tmp_path / "lake" / "public" / "o", ("id", "region"))  # delta-rs, not the sink
    assert {k: r["v"] for k, r in got.items()} == {k: row["v"] for k, row in want.items()}
    code, report = verify(file, spark)
    assert code == 0, report


# ---- issue 11 item 3: verify compares every column the source has now -------------------------------------
def test_verify_names_a_column_added_in_the_source_that_the_follower_lacks(
    pg_db: str, tmp_path: Path, spark
) -> None:
    """Right after ADD COLUMN, before any write and before the follower applied it, verify must not
    call that identical. Then, with no write either, the stream's idle-table schema check (no DDL
    capture here) has put the column in the log, and the next apply brings it (issue 35 item 2)."""
    file = _column_added_after_apply(pg_db, tmp_path, spark)  # all NULL: even the values would agree
    code, report = verify(file, spark)
    assert code == 1, report
    assert "column(s) the follower does not have: note" in report, report
    apply_once(file, spark)
    assert _delta(spark, tmp_path, "public.t", ["v", "note"]) == _source(pg_db, "public.t", ["v", "note"])
    code, report = verify(file, spark)
    assert code == 0, report


def test_verify_missing_column_note_runs_as_printed(pg_db: str, tmp_path: Path, spark) -> None:
    """Issue 23 item 2: the missing-column note's commands name the pipeline file as given; run
    exactly as printed (snapshot, then apply), the follower gets the column and verify exits 0."""
    # no write after it, no apply, no stream since: the log certainly lacks the column, so the note
    # names the snapshot that brings it (with the column in the log, only the apply)
    file = _column_added_after_apply(pg_db, tmp_path, spark, streamed=False)
    code, report = verify(file, spark)
    assert code == 1, report
    note = next(line for line in report.splitlines() if "column(s) the follower does not have: note" in line)
    commands = re.findall(r"`(cdc [^`]+)`", note)
    assert commands == [f"cdc snapshot {file} --tables public.t", f"cdc apply {file} --once --sink lake"], (
        note
    )
    for command in commands:
        result = CliRunner().invoke(cli, shlex.split(command)[1:], catch_exceptions=False)
        assert result.exit_code == 0, (command, result.output)
    assert _delta(spark, tmp_path, "public.t", ["v", "note"]) == _source(pg_db, "public.t", ["v", "note"])
    code, report = verify(file, spark)
    assert code == 0, report


# ---- issue 11 item 2: generated columns ------------------------------------------------------------------
def test_generated_column_is_named_by_validate_and_verify(pg_any_db: str, tmp_path: Path, spark) -> None:
    """No follower gets generated columns, on PostgreSQL 15 and 18 alike (15 cannot publish them;
    on 18 the tool's publication keeps publish_generated_columns = none): validate and verify say
    so instead of counting or comparing silently around them. On 18 a publication set to publish
    them is refused (issue 14 item 3), and the printed fix makes the pipeline go on."""
    sql(
        pg_any_db,
        "CREATE TABLE line (id int PRIMARY KEY, qty int, price numeric(8,2),"
        " line_total numeric(10,2) GENERATED ALWAYS AS (qty * price) STORED)",
        "INSERT INTO line(id, qty, price) SELECT g, g, 1.50 FROM generate_series(1, 4) g",
    )
    file = _pipeline(tmp_path, pg_any_db, ["public.line"])
    run = cdc("validate", file)
    assert run.code == 0, run.out + run.err
    assert "generated column(s) line_total" in run.out, run.out
    _snapshot(file)
    sql(pg_any_db, "UPDATE line SET qty = 10 WHERE id = 1")
    if sql(pg_any_db, "SHOW server_version_num")[0][0] >= "180000":
        sql(pg_any_db, "ALTER PUBLICATION cdc_ddl SET (publish_generated_columns = stored)")
        run = cdc("stream", file, "--until", "current")
        assert run.code == 3 and "publish_generated_columns = stored" in run.err, run.out + run.err
        fix = next(line for line in run.err.splitlines() if "fix:" in line).split("fix:", 1)[1].strip()
        assert fix == "run ALTER PUBLICATION cdc_ddl SET (publish_generated_columns = none);", fix
        sql(pg_any_db, fix.removeprefix("run "))
    stream_in_process(file)
    apply_once(file, spark)
    assert _delta(spark, tmp_path, "public.line", ["qty"]) == _source(pg_any_db, "public.line", ["qty"])
    code, report = verify(file, spark)
    assert code == 0, report
    assert "not compared: generated column(s) line_total" in report, report


# ---- issue 22 item 3: table rewrites make no change events -----------------------------------------------
def _iceberg(tmp_path: Path, table: str, columns: list[str]) -> dict:
    """The Iceberg follower `ice` read with pyiceberg, shaped as `_delta`."""
    rows = iceberg_rows(tmp_path / "ice", table)
    return {k[0]: tuple(None if r[c] is None else str(r[c]) for c in columns) for k, r in rows.items()}


def _iceberg_rest(url: str, table: str, columns: list[str]) -> dict:
    """The Iceberg follower `icerest` read with pyiceberg's RestCatalog through the same REST
    catalog server the follower writes through, shaped as `_delta`."""
    from pyiceberg.catalog.rest import RestCatalog

    rows = RestCatalog("icerest", uri=url).load_table(table).scan().to_arrow().to_pylist()
    return {str(r["id"]): tuple(None if r[c] is None else str(r[c]) for c in columns) for r in rows}


def _set_on_type_change(file: Path, value: str) -> None:
    def edit(doc: dict) -> None:
        next(s for s in doc["sinks"] if s["name"] == "ice")["iceberg"]["on_type_change"] = value

    edit_pipeline(file, edit)


def test_rewrites_are_noticed_and_the_table_re_based(pg_db: str, tmp_path: Path, spark, iceberg_rest) -> None:
    """ADD COLUMN DEFAULT then ALTER COLUMN TYPE ... USING before the stream reads them (the
    rewrite clears the fast default and changes every row without change events), then a
    volatile default (every row filled without change events): `cdc stream` notices each
    rewrite, re-bases the table by itself, says so, and `cdc status` shows it. The Delta and the
    Iceberg follower (read with pyiceberg) both end as the source; the Iceberg one first with
    `on_type_change: stop`, which stops it at the widened column before it writes. A second
    Iceberg follower `icerest` on a REST catalog (tests/fixtures/iceberg_rest.py: Iceberg's
    reference handlers served over a JDBC catalog) widens in place and is read with pyiceberg's
    RestCatalog through the same server."""
    sql(
        pg_db,
        "CREATE TABLE acc (id int PRIMARY KEY, n int, note text)",
        "INSERT INTO acc SELECT g, g, 'a' FROM generate_series(1, 10) g",
    )
    ice = {"name": "ice", "iceberg": {"warehouse": "ice", "on_type_change": "stop"}}
    rest = {"type": "rest", "uri": iceberg_rest.url}
    icerest = {"name": "icerest", "iceberg": {"warehouse": "icerest", "catalog": rest}}
    file = _pipeline(tmp_path, pg_db, ["public.acc"], ice, icerest)
    _snapshot(file)
    apply_once(file, spark)
    n_field = iceberg_catalog(tmp_path / "ice").load_table("public.acc").schema().find_field("n")
    sql(
        pg_db,
        "ALTER TABLE acc ADD COLUMN tier text DEFAULT 'std'",
        "INSERT INTO acc VALUES (11, 11, 'b', 'gold')",
        "ALTER TABLE acc ALTER COLUMN n TYPE bigint USING n * 10",
        "UPDATE acc SET note = 'c' WHERE id = 2",
    )
    stream_cli(file, "public.acc: its storage was rewritten", "re-base public.acc: done")
    before = iceberg_catalog(tmp_path / "ice").load_table("public.acc").current_snapshot().snapshot_id
    from pipelines.apply.job import ApplyJob

    runs = ApplyJob(load_pipeline(file), spark).run_once()
    failed = {r.sink: r.error for r in runs if r.error is not None}
    assert set(failed) == {"ice"}, failed
    assert "the source widened column(s) 'n' -> bigint; on_type_change: stop" in failed["ice"].problem
    assert "set `on_type_change: widen` on sink ice" in str(failed["ice"].fix)
    after = iceberg_catalog(tmp_path / "ice").load_table("public.acc").current_snapshot().snapshot_id
    assert after == before, "the stopped follower wrote nothing"
    _set_on_type_change(file, "widen")
    apply_once(file, spark)
    columns = ["n", "note", "tier"]
    assert _delta(spark, tmp_path, "public.acc", columns) == _source(pg_db, "public.acc", columns)
    assert _iceberg(tmp_path, "public.acc", columns) == _source(pg_db, "public.acc", columns)
    assert _iceberg_rest(iceberg_rest.url, "public.acc", columns) == _source(pg_db, "public.acc", columns)
    widened = iceberg_catalog(tmp_path / "ice").load_table("public.acc").schema().find_field("n")
    assert (widened.field_id, str(widened.field_type)) == (n_field.field_id, "long"), widened
    code, report = verify(file, spark)
    assert code == 0, report
    status = cdc("status", file)
    assert "re-base of public.acc: done at" in status.out, status.out

    # A volatile default fills every row with its own value, again without change events.
    sql(
        pg_db,
        "ALTER TABLE acc ADD COLUMN r float8 DEFAULT random()",
        "INSERT INTO acc VALUES (12, 12, 'd', 'std')",
    )
    stream_cli(file, "re-base public.acc: done")
    apply_once(file, spark)
    columns = ["n", "note", "tier", "r"]
    got = _delta(spark, tmp_path, "public.acc", columns)
    assert got == _source(pg_db, "public.acc", columns) and got["1"][3] is not None
    assert _iceberg(tmp_path, "public.acc", columns) == got
    assert _iceberg_rest(iceberg_rest.url, "public.acc", columns) == got
    code, report = verify(file, spark)
    assert code == 0, report

    # Nothing rewritten: plain changes, a nullable column, and a TRUNCATE the stream reaches only
    # after it read the catalog (the TRUNCATE explains the new storage) do not re-base.
    sql(pg_db, "UPDATE acc SET note = 'e' WHERE id = 3", "ALTER TABLE acc ADD COLUMN plain int")
    sql(
        pg_db,
        "UPDATE acc SET plain = 1 WHERE id = 4",
        "TRUNCATE acc",
        "INSERT INTO acc VALUES (1, 1, 'f', 'std', 0.5, 2)",
    )
    out = stream_cli(file)
    assert "re-bas" not in out, out
    apply_once(file, spark)
    columns = ["n", "note", "tier", "r", "plain"]
    assert _delta(spark, tmp_path, "public.acc", columns) == _source(pg_db, "public.acc", columns)
    assert _iceberg(tmp_path, "public.acc", columns) == _source(pg_db, "public.acc", columns)
    assert _iceberg_rest(iceberg_rest.url, "public.acc", columns) == _source(pg_db, "public.acc", columns)
    code, report = verify(file, spark)
    assert code == 0, report

    # `cdc status` self-checks the follower on the REST catalog too (pyiceberg's RestCatalog): all
    # there; then its table dropped behind the tool is found (exit 1) and the next apply rebuilds it
    status = cdc_here("status", file)
    assert status.code == 0 and "follower icerest" in status.out, status.out
    assert "was not checked" not in status.out, status.out
    from pyiceberg.catalog.rest import RestCatalog

    RestCatalog("icerest", uri=iceberg_rest.url).drop_table("public.acc")
    status = cdc_here("status", file)
    assert status.code == 1, status.out
    assert "follower icerest LOST DATA it had applied (found now): public.acc" in status.out, status.out
    apply_once(file, spark, "icerest")
    assert _iceberg_rest(iceberg_rest.url, "public.acc", columns) == _source(pg_db, "public.acc", columns)


def test_rewrite_noticed_on_a_log_without_storage_baseline(pg_db: str, tmp_path: Path, spark) -> None:
    """A log written before relfilenodes were kept (or after a TRUNCATE) has no storage baseline
    for the table: the stream still notices a volatile default by what the catalog shows (a
    DEFAULT and no value kept for rows not written since) and re-bases the table."""
    import sqlite3

    sql(
        pg_db,
        "CREATE TABLE acc (id int PRIMARY KEY, n int)",
        "INSERT INTO acc SELECT g, g FROM generate_series(1, 5) g",
    )
    file = _pipeline(tmp_path, pg_db, ["public.acc"])
    _snapshot(file)
    apply_once(file, spark)
    db = sqlite3.connect(load_pipeline(file).local_log_path / "log.db")
    with db:
        assert db.execute("DELETE FROM meta WHERE k LIKE 'filenodes:%'").rowcount == 1
    db.close()
    sql(pg_db, "ALTER TABLE acc ADD COLUMN r float8 DEFAULT random()", "INSERT INTO acc VALUES (6, 6, 0.5)")
    stream_cli(file, "new column(s) r have a default", "re-base public.acc: done")
    apply_once(file, spark)
    got = _delta(spark, tmp_path, "public.acc", ["n", "r"])
    assert got == _source(pg_db, "public.acc", ["n", "r"]) and got["1"][1] is not None
    code, report = verify(file, spark)
    assert code == 0, report


def test_kafka_log_add_column_default_then_vacuum_full_is_re_based(
    pg_db: str, tmp_path: Path, kafka, spark
) -> None:
    """The Kafka-log case of issue 22 item 3: a plain ADD COLUMN ... DEFAULT, then other changes
    before the stream read it; one of them (here VACUUM FULL, as a type change would) rewrote
    the table and cleared the fast default, so the stream recorded the column without it and
    Delta got NULL. The stream notices the rewrite and re-bases the table through Kafka."""
    from tests.fixtures.kafka_log import apply_ok, make_kpipe, verified
    from tests.fixtures.kafka_log import snapshot as kafka_snapshot
    from tests.fixtures.kafka_log import stream_until_current as kafka_stream

    sql(
        pg_db,
        "CREATE TABLE items (id int PRIMARY KEY, n int, note text)",
        "INSERT INTO items SELECT g, g, 'a' FROM generate_series(1, 6) g",
    )
    pipe = make_kpipe(tmp_path, pg_db, ["public.items"], kafka.bootstrap)
    kafka_snapshot(pipe)
    sql(
        pg_db,
        "UPDATE items SET n = 0 WHERE id = 1",
        "ALTER TABLE items ADD COLUMN extra text DEFAULT 'dflt'",
        "INSERT INTO items VALUES (7, 7, 'b', 'x')",
        "VACUUM FULL items",
        "UPDATE items SET note = 'c' WHERE id = 2",
    )
    run = kafka_stream(pipe)
    # the rewrite is known by what it did: the new column's default gone from the catalog (issue 35:
    # a new relfilenode alone no longer re-bases)
    assert (
        "public.items: new column(s) extra have a default" in run.out
        and "re-base public.items: done" in run.out
    ), run.out
    apply_ok(pipe, spark)
    columns = ["n", "note", "extra"]
    got = _delta(spark, tmp_path, "public.items", columns)
    assert got == _source(pg_db, "public.items", columns) and got["3"][2] == "dflt"
    verified(pipe, spark)


# ---- issue 22 item 3: a re-base with a type change Delta cannot widen --------------------------------
def test_re_base_with_type_change_delta_cannot_widen(pg_db: str, tmp_path: Path, spark, redis_server) -> None:
    """`ALTER COLUMN n TYPE text USING ...` and `ALTER COLUMN code TYPE int USING ...`: Delta cannot
    widen either. The stream re-bases the table by itself, and every follower takes the new types
    from the new base with no step by hand: SCD1 Delta is rewritten with them, SCD2 Delta keeps the
    old values of older versions in `<column>__before_<base LSN>`, search and cache hold the new
    values. Outside a re-base the same change still stops the batch
    (tests/integration/test_apply.py::test_incompatible_schemas_stop_the_batch)."""
    import redis

    from tests.fixtures.readers import delta_rows, redis_rows, tantivy_docs

    cache_url = redis_server.url.rsplit("/", 1)[0] + "/6"
    redis.Redis.from_url(cache_url).flushdb()
    sql(
        pg_db,
        "CREATE TABLE acc (id int PRIMARY KEY, n int, code text)",
        "INSERT INTO acc SELECT g, g, (g * 7)::text FROM generate_series(1, 6) g",
    )
    hist = {"name": "hist", "delta": {"path": "hist", "mode": "scd2"}}
    search = {"name": "search", "search": {"engine": "tantivy", "path": "idx", "tables": ["public.acc"]}}
    cache = {"name": "cache", "redis": {"url": cache_url, "tables": ["public.acc"]}}
    lake = {"name": "lake", "delta": {"path": "lake"}}
    sinks = [lake, hist, search, cache]
    file = write_pipeline(tmp_path, pg_db, ["public.acc"], name="ddl", sinks=sinks)
    _snapshot(file)
    apply_once(file, spark)
    sql(pg_db, "UPDATE acc SET n = 20 WHERE id = 2")
    stream_cli(file)
    apply_once(file, spark)
    sql(
        pg_db,
        "ALTER TABLE acc ALTER COLUMN n TYPE text USING 'n' || n::text",
        "ALTER TABLE acc ALTER COLUMN code TYPE int USING code::int + 1",
        "UPDATE acc SET n = 'changed' WHERE id = 3",
        "INSERT INTO acc VALUES (7, 'n7', 50)",
        "DELETE FROM acc WHERE id = 6",
    )
    stream_cli(file, "public.acc: its storage was rewritten", "re-base public.acc: done")

    # Each Delta follower stopped right after its writes, before its checkpoint (the crash point of
    # a SIGKILL, in-process: tests/harness.py apply_crashing): the next apply applies the same cut
    # again and changes nothing in either table.
    def held() -> dict:
        keys = {"lake": ("id",), "hist": ("id", "_cdc_start_lsn")}  # SCD2: one row per version
        return {s: delta_rows(spark, tmp_path / s / "public" / "acc", keys[s]) for s in keys}

    for sink in ("lake", "hist"):
        apply_crashing(file, spark, "apply:after-merge", sink)
        assert load_checkpoint(load_pipeline(file).state_path, sink).pending, sink
    written = held()
    apply_once(file, spark)
    assert held() == written
    apply_once(file, spark)  # nothing new: changes nothing

    columns = ["n", "code"]
    want = _source(pg_db, "public.acc", columns)
    assert want["2"] == ("n20", "15") and "6" not in want
    assert _delta(spark, tmp_path, "public.acc", columns) == want
    lake = spark.read.format("delta").load(str(tmp_path / "lake" / "public" / "acc"))
    assert dict(lake.dtypes)["n"] == "string" and dict(lake.dtypes)["code"] == "int", lake.dtypes

    # SCD2: the current versions hold the new values and types; the older versions kept theirs.
    rows = [
        r.asDict()
        for r in spark.sql(f"SELECT * FROM delta.`{tmp_path / 'hist' / 'public' / 'acc'}`").collect()
    ]
    current = {
        str(r["id"]): (r["n"], None if r["code"] is None else str(r["code"]))
        for r in rows
        if r["_cdc_end_lsn"] is None
    }
    assert current == want
    (before_n,) = [c for c in rows[0] if c.startswith("n__before_")]
    (before_code,) = [c for c in rows[0] if c.startswith("code__before_")]
    base = int(before_n.rsplit("_", 1)[1])
    old = sorted((r["id"], r[before_n], r[before_code]) for r in rows if r["_cdc_start_lsn"] < base)
    assert old == sorted([(g, g, str(g * 7)) for g in range(1, 7)] + [(2, 20, "14")]), old
    assert all(r["_cdc_end_lsn"] is not None and r["n"] is None for r in rows if r["_cdc_start_lsn"] < base)
    assert all(r[before_n] is None for r in rows if r["_cdc_start_lsn"] >= base)

    # Search and cache, read with tantivy and redis-py themselves.
    docs = tantivy_docs(tmp_path / "idx" / "public" / "acc")
    cached = redis_rows(redis.Redis.from_url(cache_url), "public.acc:")
    for name, got in {"tantivy": docs, "redis": cached}.items():
        by_id = {str(d["id"]): (d["n"], str(d["code"])) for d in got.values()}
        assert by_id == want, (name, got)
        assert all(isinstance(d["n"], str) and isinstance(d["code"], int) for d in got.values()), (name, got)
    assert delta_rows(spark, tmp_path / "lake" / "public" / "acc")[("3",)]["n"] == "changed"
    code, report = verify(file, spark)
    assert code == 0, report
