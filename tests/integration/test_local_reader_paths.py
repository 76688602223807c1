"""A small range of the embedded log is read in the driver (pipelines/apply/readers/local.py
DRIVER_READ_EVENTS), a larger one or one with snapshot segments by the `cdclog` data source in
executors. Both give the same rows for every range of a table whose history has what the reader
must get right: schema versions (a column added with a default, one renamed, one dropped while
the follower keeps it), unchanged TOAST values, deletes, a key change and a truncate; and an
empty range gives an empty frame of the same columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.ground.tables import TableName
from cdc.log import open_log_view
from pipelines.apply.readers import change_reader
from pipelines.apply.readers import local as local_reader
from sinks.registry import load_pipeline
from tests.fixtures.lake import LAKE, make_pipe, snapshot, stream
from tests.harness import sql

pytestmark = pytest.mark.integration

BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g)"  # 9.6 kB: TOASTed


def _plan(frame) -> str:
    return frame._jdf.queryExecution().analyzed().toString()


def _rows(frame) -> list[tuple]:
    return sorted(tuple(r) for r in frame.collect())


def test_driver_and_executor_reads_give_the_same_rows(pg_db: str, tmp_path: Path, spark, monkeypatch) -> None:
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text, n int, doc text)",
        "ALTER TABLE t ALTER COLUMN doc SET STORAGE EXTERNAL",
        f"INSERT INTO t SELECT g, 'v' || g, g, {BIG} FROM generate_series(1, 20) g",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.t"], sinks=[LAKE])
    snapshot(pipe)
    sql(
        pg_db,
        "UPDATE t SET n = n + 100 WHERE id <= 5",  # doc unchanged: an unchanged-TOAST marker
        "DELETE FROM t WHERE id = 6",
        "UPDATE t SET id = 106 WHERE id = 7",  # a key change
        "ALTER TABLE t ADD COLUMN tier text DEFAULT 'std'",
        "INSERT INTO t (id, v, n, doc) VALUES (200, 'after add', 1, 'small')",
        "ALTER TABLE t RENAME COLUMN v TO label",
        "UPDATE t SET label = 'renamed' WHERE id = 8",
        "ALTER TABLE t DROP COLUMN n",
        "INSERT INTO t (id, label, doc) VALUES (201, 'after drop', 'x')",
    )
    stream(pipe)
    sql(pg_db, "TRUNCATE t", "INSERT INTO t (id, label, doc) VALUES (1, 'after truncate', 'y')")
    stream(pipe)

    table = TableName.parse("public.t")
    pipeline = load_pipeline(pipe.file)
    log = open_log_view(pipeline)
    try:
        reader = change_reader(log)
        state = next(s for s in log.tables() if s.table == table)
        end = log.end_offset(table)
        assert state.base is not None and end > state.base + 10
        schema = log.schema(table)
        ranges = [(state.base, end), (state.base + 3, end - 2), (end, end)]
        assert "LocalRelation" in _plan(reader.read_changes(spark, table, state.base, end, schema))
        driver = {r: _rows(reader.read_changes(spark, table, *r, schema)) for r in ranges}
        # values over the byte bound: read by executors whatever the count
        monkeypatch.setattr(local_reader, "DRIVER_READ_BYTES", 100)
        assert "LocalRelation" not in _plan(reader.read_changes(spark, table, state.base, end, schema))
        monkeypatch.setattr(local_reader, "DRIVER_READ_BYTES", 8 << 20)
        monkeypatch.setattr(local_reader, "DRIVER_READ_EVENTS", -1)  # every range through `cdclog`
        executors = {r: _rows(reader.read_changes(spark, table, *r, schema)) for r in ranges}
        assert "LocalRelation" not in _plan(reader.read_changes(spark, table, state.base, end, schema))
        # a range starting before the base holds snapshot segments: always read in executors
        whole = reader.read_changes(spark, table, 0, end, schema)
        monkeypatch.setattr(local_reader, "DRIVER_READ_EVENTS", 10**6)
        assert _rows(reader.read_changes(spark, table, 0, end, schema)) == _rows(whole)
        assert reader.read_changes(spark, table, end, end, schema).schema == whole.schema
    finally:
        log.close()
    assert driver == executors
    rows = driver[(state.base, end)]
    assert len(rows) == end - state.base and driver[(end, end)] == []
    ops = [r[3] for r in rows]
    assert {"u", "d", "c", "t"} <= set(ops), ops
    assert any(r[6] for r in rows), "no unchanged-TOAST marker in the range"  # unch


def test_copy_files_read_in_the_driver_or_by_executors_alike(
    pg_db: str, tmp_path: Path, spark, monkeypatch
) -> None:
    """`cdc verify`'s source copies (COPY text, as PostgreSQL wrote them) read in the driver or by
    the `cdccopy` data source: the same values (NULLs, escapes, tabs and newlines in values, a
    long value, non-ASCII text), and an empty copy is an empty frame."""
    import psycopg2

    from pipelines.apply.readers import copyfiles

    sql(
        pg_db,
        "CREATE TABLE c (id int, v text, w text)",
        "INSERT INTO c VALUES (1, NULL, 'a\tb'), (2, E'line\\nbreak\\\\back', ''), (3, 'héllo ✓', repeat('x', 70000))",
        "CREATE TABLE e (id int)",
    )
    files = {}
    conn = psycopg2.connect(pg_db)
    try:
        with conn.cursor() as cur:
            for name in ("c", "e"):
                files[name] = tmp_path / f"{name}.copy"
                with files[name].open("wb") as f:
                    cur.copy_expert(f"COPY {name} TO STDOUT", f)
    finally:
        conn.close()
    driver = {n: _rows(copyfiles.copy_rows(spark, p)) for n, p in files.items()}
    assert "LocalRelation" in _plan(copyfiles.copy_rows(spark, files["c"]))
    monkeypatch.setattr(copyfiles, "DRIVER_READ_BYTES", -1)
    assert "LocalRelation" not in _plan(copyfiles.copy_rows(spark, files["c"]))
    executors = {n: _rows(copyfiles.copy_rows(spark, p)) for n, p in files.items()}
    assert driver == executors
    assert driver["e"] == []
    assert driver["c"] == [
        (["1", None, "a\tb"],),
        (["2", "line\nbreak\\back", ""],),
        (["3", "héllo ✓", "x" * 70000],),
    ]
