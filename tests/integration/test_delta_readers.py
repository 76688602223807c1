"""Delta followers every reader can open (issue 13 items 1 and 2): tables at the lowest protocol
their data allows, read back with delta-rs and Polars (no Spark) after a snapshot, streamed
changes, an added column, a rename and a drop, a widening and a truncate, and compared with the
source; a table with a column name plain Delta cannot hold takes on column mapping (Spark reads
it); `on_type_change: widen` / `stop` do what the apply output and the error say; a table made by
an earlier version (column mapping and type widening on) keeps applying.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.lake import apply, apply_ok, delta_commits, make_pipe, snapshot, stream, verified
from tests.fixtures.readers import DELTA_RS_LACKS, delta_reader_features, delta_rows, polars_rows
from tests.harness import source_rows, sql, write_pipeline

pytestmark = pytest.mark.integration

SETUP = (
    "CREATE TABLE acc(id int PRIMARY KEY, note text, amt numeric(10,2), n int, dropme text, ts timestamp)",
    "INSERT INTO acc SELECT g, 'note' || g, g * 1.5, g, 'd' || g, timestamp '2024-01-01' + g * interval '1 hour'"
    " FROM generate_series(1, 20) g",
    'CREATE TABLE odd(id int PRIMARY KEY, "unit price" numeric(8,2))',
    "INSERT INTO odd VALUES (1, 1.25), (2, 2.50)",
)
# What a table made by an earlier version of the delta sink carries (it set these on every table).
OLD_PROPERTIES = (
    "'delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', "
    "'delta.minWriterVersion' = '5', 'delta.enableTypeWidening' = 'true'"
)


def sinks(lake_on_type_change: str = "rewrite") -> list[dict[str, Any]]:
    return [
        {"name": "lake", "delta": {"path": "lake", "on_type_change": lake_on_type_change}},
        {"name": "wide", "delta": {"path": "wide", "on_type_change": "widen", "tables": ["public.acc"]}},
        {"name": "old", "delta": {"path": "old", "tables": ["public.acc"]}},
    ]


def text(value: Any) -> str | None:
    """A value read from Delta as PostgreSQL prints it (for the columns of these tables)."""
    return None if value is None else str(value)


def same_as_source(dsn: str, path: Path, table: str, rows: dict[tuple, dict[str, Any]]) -> None:
    source = source_rows(dsn, table, ("id",))
    got = {k: {c: text(r[c]) for c in source[k]} for k, r in rows.items() if k in source}
    assert sorted(rows) == sorted(source), f"{path}: keys differ from {table}"
    assert got == source, f"{path}: rows differ from {table}"


def read_everywhere(dsn: str, base: Path, table: str = "public.acc") -> None:
    """delta-rs and Polars (no Spark) read the table, each equal to the source."""
    path = base / "public" / table.split(".")[1]
    assert not delta_reader_features(path) & DELTA_RS_LACKS, f"{path}: {delta_reader_features(path)}"
    same_as_source(dsn, path, table, delta_rows(None, path))
    same_as_source(dsn, path, table, polars_rows(path))


def test_tables_at_the_lowest_protocol_read_by_delta_rs_and_polars(pg_db: str, tmp_path: Path, spark) -> None:
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaProtocolError

    sql(pg_db, *SETUP)
    pipe = make_pipe(tmp_path, pg_db, ["public.acc", "public.odd"], sinks=sinks())
    lake, wide, old = (tmp_path / s for s in ("lake", "wide", "old"))

    # Snapshot: plain tables (timestampNtz is the only reader feature: the `ts` column); the one
    # with a column name plain Delta cannot hold takes on column mapping, and the output says so.
    snapshot(pipe)
    _runs, lines = apply(pipe, spark)
    out = "\n".join(lines)
    assert delta_reader_features(lake / "public" / "acc") == {"timestampNtz"}
    read_everywhere(pg_db, lake)
    assert "columnMapping" in delta_reader_features(lake / "public" / "odd")
    assert "sink lake: public.odd: the Delta table takes on table feature columnMapping" in out, out
    assert "delta-rs" in out and "public.acc: the Delta table takes on" not in out, out
    odd = delta_rows(spark, lake / "public" / "odd")  # Spark: delta-rs cannot open it
    assert {k: text(r["unit price"]) for k, r in odd.items()} == {("1",): "1.25", ("2",): "2.50"}
    # `old` becomes a table as an earlier version made them: column mapping and type widening on.
    spark.sql(f"ALTER TABLE delta.`{old / 'public' / 'acc'}` SET TBLPROPERTIES ({OLD_PROPERTIES})")

    # One batch (Spark is the cost of this test) of streamed changes, an added column (with a
    # default rows not written since must show), a rename, a drop and a widening PostgreSQL makes
    # without rewriting its table (numeric precision up). First with on_type_change: stop: the
    # apply stops before anything is written, naming table and column.
    sql(
        pg_db,
        "UPDATE acc SET note = 'upd', n = n + 100 WHERE id <= 3",
        "DELETE FROM acc WHERE id = 4",
        "INSERT INTO acc VALUES (21, 'new', 2.25, 21, 'd21', '2024-02-01 00:00:00')",
        "ALTER TABLE acc ADD COLUMN extra int DEFAULT 7",
        "UPDATE acc SET extra = 8 WHERE id = 5",
        "UPDATE acc SET note = 'before rename' WHERE id = 6",
        "ALTER TABLE acc RENAME COLUMN note TO remark",
        "UPDATE acc SET dropme = 'last' WHERE id = 7",
        "ALTER TABLE acc DROP COLUMN dropme",
        "INSERT INTO acc(id, remark, amt, n, ts) VALUES (22, 'after drop', 3.5, 22, '2024-02-02 00:00:00')",
        "ALTER TABLE acc ALTER COLUMN amt TYPE numeric(12,2)",
        "UPDATE acc SET amt = 1234567890.12 WHERE id = 1",
    )
    stream(pipe)
    write_pipeline(tmp_path, pg_db, ["public.acc", "public.odd"], sinks=sinks("stop"))
    before = delta_commits(lake / "public" / "acc")[-1]["version"]
    runs, lines = apply(pipe, spark, "lake")
    out = "\n".join(lines)
    assert runs[0].error is not None and "'amt' decimal(10,2) -> decimal(12,2)" in out, out
    assert "on_type_change: stop" in out and "fix: set `on_type_change: rewrite`" in out, out
    assert delta_commits(lake / "public" / "acc")[-1]["version"] == before

    # Back to the default (rewrite): the plain table is rewritten once (rename and new type), no
    # table feature; `old` adds and renames as metadata and widens in place (it has both features);
    # `wide` takes on type widening and the output says which readers lose it.
    write_pipeline(tmp_path, pg_db, ["public.acc", "public.odd"], sinks=sinks())
    runs, lines = apply(pipe, spark)
    out = "\n".join(lines)
    assert not [r for r in runs if r.error], out
    assert (
        "sink lake: public.acc: table rewritten in one commit ('note' renamed to 'remark'; "
        "'amt' decimal(10,2) -> decimal(12,2))" in out
    ), out
    read_everywhere(pg_db, lake)  # the dropped column stays with its last value
    rows = delta_rows(None, lake / "public" / "acc")
    assert rows[("7",)]["dropme"] == "last" and rows[("22",)]["dropme"] is None and "note" not in rows[("1",)]
    assert "sink old: public.acc: table rewritten" not in out, out
    assert "RENAME COLUMN" in [c["operation"] for c in delta_commits(old / "public" / "acc")]
    assert "sink wide: public.acc: the Delta table takes on table feature typeWidening" in out, out
    assert "delta-rs (the `deltalake` package)" in out and "sink old: public.acc: the Delta table" not in out
    assert "typeWidening" in delta_reader_features(wide / "public" / "acc")
    with pytest.raises(DeltaProtocolError):
        DeltaTable(str(wide / "public" / "acc")).to_pyarrow_table()
    for base in (wide, old):  # Spark reads both
        got = delta_rows(spark, base / "public" / "acc")
        assert text(got[("1",)]["amt"]) == "1234567890.12" and text(got[("6",)]["remark"]) == "before rename"

    verified(pipe, spark)

    # Truncate, then inserts (the plain table only).
    sql(pg_db, "TRUNCATE acc", "INSERT INTO acc(id, remark, amt, n) VALUES (30, 'after truncate', 9.99, 30)")
    stream(pipe)
    apply_ok(pipe, spark, "lake")
    read_everywhere(pg_db, lake)
    assert list(delta_rows(None, lake / "public" / "acc")) == [("30",)]
