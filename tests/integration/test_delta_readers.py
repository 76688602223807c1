"""Delta followers every reader can open (issue 13 items 1 and 2): tables at the lowest protocol
their data allows, read back with delta-rs and Polars (no Spark) after a snapshot, streamed
changes, an added column, a rename and a drop, a widening and a truncate, and compared with the
source; a column name plain Delta cannot hold is stored encoded, with no table feature;
`on_type_change: widen` / `stop` do what the apply output and the error say; a table made by
an earlier version (column mapping and type widening on) keeps applying.

Issue 33 item 2: every table shape the sink writes is read exactly by delta-rs (its Arrow path,
its DataFusion `QueryBuilder`) and Polars, or refused by them loudly: encoded names, a rename to
a name that needs encoding, a widening, SCD2, a partitioned source, and column mapping on request
or from an earlier version (refused by the Arrow path and Polars, read exactly by `QueryBuilder`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.lake import apply, apply_ok, delta_commits, make_pipe, snapshot, stream, verified
from tests.fixtures.readers import (
    DELTA_RS_LACKS,
    datafusion_rows,
    delta_reader_features,
    delta_rows,
    polars_rows,
)
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
    # with a column name plain Delta cannot hold stores it encoded, with no table feature.
    snapshot(pipe)
    _runs, lines = apply(pipe, spark)
    out = "\n".join(lines)
    assert delta_reader_features(lake / "public" / "acc") == {"timestampNtz"}
    read_everywhere(pg_db, lake)
    assert not delta_reader_features(lake / "public" / "odd")
    assert "the Delta table takes on" not in out, out
    odd = delta_rows(None, lake / "public" / "odd")  # delta-rs
    assert {k: text(r["unit_x0020_price"]) for k, r in odd.items()} == {("1",): "1.25", ("2",): "2.50"}
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


SHAPES = (
    'CREATE TABLE shapes(id int PRIMARY KEY, "unit price" numeric(8,2), v text, n int)',
    "INSERT INTO shapes SELECT g, g * 1.25, 'v' || g, g FROM generate_series(1, 30) g",
    'CREATE TABLE ev(region text, id int, "event value" int, PRIMARY KEY (region, id)) PARTITION BY LIST (region)',
    "CREATE TABLE ev_eu PARTITION OF ev FOR VALUES IN ('eu')",
    "CREATE TABLE ev_us PARTITION OF ev FOR VALUES IN ('us')",
    "INSERT INTO ev SELECT r, g, g * 10 FROM unnest(ARRAY['eu', 'us']) r, generate_series(1, 10) g",
)
SHAPE_SINKS = [
    {"name": "lake", "delta": {"path": "lake"}},
    {"name": "hist", "delta": {"path": "hist", "mode": "scd2", "tables": ["public.shapes"]}},
    {"name": "mapped", "delta": {"path": "mapped", "column_mapping": "name", "tables": ["public.shapes"]}},
    {"name": "legacy", "delta": {"path": "legacy", "tables": ["public.shapes"]}},
]
# The stored names of the source columns plain Delta cannot hold (README "Reading the lake").
STORED = {
    "unit price": "unit_x0020_price",
    "v renamed": "v_x0020_renamed",
    "added col": "added_x0020_col",
    "event value": "event_x0020_value",
}
# Column mapping as Delta writes it for these properties alone: the legacy reader version 2,
# with no reader-feature list (what earlier versions of the sink made).
LEGACY_V2 = (
    "'delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5'"
)


def exact(dsn: str, table: str, rows: dict, key: tuple[str, ...] = ("id",), stored: bool = True) -> None:
    """`rows` (read by an engine, keyed like `source_rows`) equal the source's, under the stored
    (encoded) column names unless `stored` is False."""
    source = source_rows(dsn, table, key)
    want = {k: {STORED.get(c, c) if stored else c: v for c, v in r.items()} for k, r in source.items()}
    got = {k: {c: text(r[c]) for c in want[k]} for k, r in rows.items() if k in want}
    assert sorted(rows) == sorted(want) and got == want, f"{table}: rows differ from the source"


def arrow_rows(path: Path, key: tuple[str, ...] = ("id",)) -> dict[tuple, dict[str, Any]]:
    return delta_rows(None, path, key)  # delta-rs's Arrow path (to_pyarrow_table)


def current_versions(path: Path) -> dict[tuple, dict[str, Any]]:
    """The current versions (no end) of an SCD2 table, read with delta-rs's Arrow path."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {(str(r["id"]),): r for r in rows if r["_cdc_end_lsn"] is None}


def refused_without_column_mapping(path: Path) -> None:
    """delta-rs's Arrow path and Polars refuse the table loudly (never NULLs)."""
    import polars
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaProtocolError

    assert "columnMapping" in delta_reader_features(path)
    with pytest.raises(DeltaProtocolError, match="columnMapping"):
        DeltaTable(str(path)).to_pyarrow_table()
    with pytest.raises(DeltaProtocolError, match="columnMapping"):
        DeltaTable(str(path)).to_pyarrow_dataset()
    with pytest.raises(DeltaProtocolError, match="columnMapping"):
        polars.read_delta(str(path))


def test_every_table_shape_is_read_exactly_by_delta_rs_or_refused(pg_db: str, tmp_path: Path, spark) -> None:
    from deltalake import DeltaTable

    sql(pg_db, *SHAPES)
    pipe = make_pipe(tmp_path, pg_db, ["public.shapes", "public.ev"], sinks=SHAPE_SINKS)
    lake, hist, mapped, legacy = (
        tmp_path / s / "public" / "shapes" for s in ("lake", "hist", "mapped", "legacy")
    )
    ev = tmp_path / "lake" / "public" / "ev"

    snapshot(pipe)
    _runs, lines = apply(pipe, spark)
    out = "\n".join(lines)
    # Encoded names, no table feature: every reader reads the same rows; the comment names the source.
    for path in (lake, hist, ev):
        assert not delta_reader_features(path), (path, delta_reader_features(path))
    for read in (arrow_rows, datafusion_rows, polars_rows):
        exact(pg_db, "public.shapes", read(lake))
        exact(pg_db, "public.ev", read(ev, ("region", "id")), ("region", "id"))  # a partitioned source
    comments = {f.name: f.metadata.get("comment") for f in DeltaTable(str(lake)).schema().fields}
    assert comments["unit_x0020_price"] == 'pgcdc source column: "unit price"' and comments["id"] is None
    exact(pg_db, "public.shapes", current_versions(hist))
    # Column mapping on request: said, refused by the readers without it, exact through DataFusion.
    assert (
        "sink mapped: public.shapes: the Delta table takes on table feature columnMapping (column_mapping: name)"
        in out
    )
    assert "sink lake: public.shapes: the Delta table takes on" not in out, out
    refused_without_column_mapping(mapped)
    exact(pg_db, "public.shapes", datafusion_rows(mapped), stored=False)
    # `legacy` becomes a table with column mapping at reader version 2, as earlier versions made them.
    spark.sql(f"ALTER TABLE delta.`{legacy}` SET TBLPROPERTIES ({LEGACY_V2})")
    assert DeltaTable(str(legacy)).protocol().reader_features is None

    # One batch: an update, then a rename to a name that needs encoding, a widening PostgreSQL makes
    # without rewriting its table, an added column with a default, and changes of the partitioned table.
    sql(
        pg_db,
        "UPDATE shapes SET v = 'before rename' WHERE id = 2",
        'ALTER TABLE shapes RENAME COLUMN v TO "v renamed"',
        "UPDATE shapes SET \"v renamed\" = 'after rename' WHERE id = 3",
        'ALTER TABLE shapes ALTER COLUMN "unit price" TYPE numeric(12,2)',
        'UPDATE shapes SET "unit price" = 1234567890.12 WHERE id = 1',
        'ALTER TABLE shapes ADD COLUMN "added col" int DEFAULT 5',
        'UPDATE shapes SET "added col" = 6 WHERE id = 4',
        'UPDATE ev SET "event value" = -1 WHERE id = 1',
        "DELETE FROM ev WHERE region = 'us' AND id = 2",
    )
    stream(pipe)
    runs, lines = apply(pipe, spark)
    out = "\n".join(lines)
    assert not [r for r in runs if r.error], out
    assert (
        "sink lake: public.shapes: table rewritten in one commit ('v' renamed to 'v_x0020_renamed'; "
        "'unit_x0020_price' decimal(8,2) -> decimal(12,2))" in out
    ), out
    for path in (lake, hist, ev):
        assert not delta_reader_features(path), (path, delta_reader_features(path))
    for read in (arrow_rows, datafusion_rows, polars_rows):
        exact(pg_db, "public.shapes", read(lake))
        exact(pg_db, "public.ev", read(ev, ("region", "id")), ("region", "id"))
    assert delta_rows(None, lake)[("2",)]["v_x0020_renamed"] == "before rename"
    exact(pg_db, "public.shapes", current_versions(hist))
    versions = DeltaTable(str(hist)).to_pyarrow_table().to_pylist()
    assert {r["v_x0020_renamed"] for r in versions if r["id"] == 2} == {"v2", "before rename"}
    # Column mapping: the rename is metadata only; still refused by the Arrow path and Polars.
    assert "sink mapped: public.shapes: table rewritten in one commit ('unit price' decimal(8,2)" in out, out
    assert "RENAME COLUMN" in [c["operation"] for c in delta_commits(mapped)]
    refused_without_column_mapping(mapped)
    exact(pg_db, "public.shapes", datafusion_rows(mapped), stored=False)
    # The legacy table now lists its reader features: refused, where it read NULL for `v renamed`.
    assert (
        "sink legacy: public.shapes: the Delta table has column mapping; it now lists its reader features"
        in out
    ), out
    refused_without_column_mapping(legacy)
    rows = datafusion_rows(legacy)
    assert rows[("3",)]["v renamed"] == "after rename" and rows[("5",)]["v renamed"] == "v5"
    assert rows[("5",)]["unit_x0020_price"] is not None and rows[("4",)]["added col"] == 6

    verified(pipe, spark)
