"""The Iceberg follower (issue 39): a pipeline with an `iceberg` sink on the embedded SQLite
catalog, snapshot + stream + apply over a composite-key table (numerics, numeric above 38 digits,
timestamptz, jsonb, arrays, bytea, a TOASTed value left unchanged by an update, deletes, a key
change) and a uuid-keyed table (truncate), the latter followed a second time through Iceberg's JDBC
catalog on the session's real PostgreSQL; read back with pyiceberg's SqlCatalog on the catalog
file (and on PostgreSQL) and with Polars `scan_iceberg` (not through the sink) and compared with the source, and
`cdc verify`; then a second cut with a column rename (metadata only: the field id stays) and an
added column, crashed after its MERGE and applied again: the replay is skipped, no new snapshot.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from pipelines.faults import CrashPointReached
from tests.fixtures.lake import apply, apply_ok, make_pipe, snapshot, stream, verified
from tests.harness import sql

pytestmark = pytest.mark.integration

SINK = {"name": "ice", "iceberg": {"warehouse": "ice"}}


def pg_sink(dsn: str) -> dict[str, Any]:
    """A second follower of `users` on Iceberg's JDBC catalog in the session's real PostgreSQL."""
    url = urlsplit(dsn)
    jdbc = {
        "type": "jdbc",
        "uri": f"jdbc:postgresql://{url.hostname}:{url.port}{url.path}",
        "user": url.username,
    }
    catalog = jdbc | {"password": url.password}
    return {
        "name": "icepg",
        "iceberg": {"warehouse": "icepg", "tables": ["public.users"], "catalog": catalog},
    }


BIG = "repeat(md5(g::text), 200)"  # 6.4 kB, stored out of line (STORAGE EXTERNAL): a TOASTed value
SETUP = (
    "CREATE TABLE items(region text, id int, amt numeric(12,3), big numeric(50,10), ts timestamptz, doc jsonb,"
    " tags text[], blob bytea, note text, PRIMARY KEY (region, id))",
    "ALTER TABLE items ALTER COLUMN note SET STORAGE EXTERNAL",
    f"INSERT INTO items SELECT 'eu', g, g * 1.125, 12345678901234567890123456789012345678.5 + g,"
    f" timestamptz '2024-03-01 12:00:00+02' + g * interval '1 hour', jsonb_build_object('g', g, 'tags', array['a', 'b']),"
    f" array['t' || g, NULL], decode(md5(g::text), 'hex'), CASE WHEN g <= 5 THEN {BIG} ELSE 'small' END"
    " FROM generate_series(1, 8) g",
    "CREATE TABLE users(id uuid PRIMARY KEY, name text, n smallint)",
    "INSERT INTO users SELECT md5(g::text)::uuid, 'user ' || g, g FROM generate_series(1, 5) g",
)
CHANGES = (
    "UPDATE items SET amt = 99.5 WHERE id = 1",  # note (TOASTed) unchanged: not in the WAL
    "DELETE FROM items WHERE id = 2",
    "UPDATE items SET id = 106 WHERE id = 6",  # a key change
    "INSERT INTO items VALUES ('us', 1, -0.001, NULL, NULL, '[1, {\"x\": null}]', '{}', '', 'new')",
    "TRUNCATE users",
    "INSERT INTO users VALUES ('00000000-0000-0000-0000-000000000001', 'after truncate', -3)",
)
SOURCE = {
    "public.items": (
        ("region", "id"),
        "SELECT region, id, amt, big::text, ts, doc::text, tags, blob, note FROM items",
        ("region", "id", "amt", "big", "ts", "doc", "tags", "blob", "note"),
    ),
    "public.users": (("id",), "SELECT id::text, name, n FROM users", ("id", "name", "n")),
}


def norm(value: Any) -> Any:
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC)
    if isinstance(value, Decimal):
        return value.normalize()
    return value


def keyed(rows: list[dict[str, Any]], key: tuple[str, ...], columns: tuple[str, ...]) -> dict[tuple, dict]:
    return {tuple(r[k] for k in key): {c: norm(r.get(c)) for c in columns} for r in rows}


def source(dsn: str, key: tuple[str, ...], query: str, columns: tuple[str, ...]) -> dict[tuple, dict]:
    rows = [dict(zip(columns, r, strict=True)) for r in sql(dsn, query)]
    return keyed(rows, key, columns)


def catalog(tmp_path: Path):
    from pyiceberg.catalog.sql import SqlCatalog

    lake = tmp_path / "ice"
    return SqlCatalog("ice", uri=f"sqlite:///{lake / 'catalog.db'}", warehouse=f"file://{lake}")


def pg_catalog(dsn: str):
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("icepg", uri=dsn.replace("postgresql://", "postgresql+psycopg2://", 1))


def read_back(tmp_path: Path, dsn: str, tables: dict[str, tuple] = SOURCE) -> None:
    """pyiceberg and Polars, not the sink, read each table (and `users` of the PostgreSQL catalog):
    equal to the source."""
    import polars as pl

    cat = catalog(tmp_path)
    for name, (key, query, columns) in [*tables.items(), ("icepg", tables["public.users"])]:
        want = source(dsn, key, query, columns)
        table = pg_catalog(dsn).load_table("public.users") if name == "icepg" else cat.load_table(name)
        got = keyed(table.scan().to_arrow().to_pylist(), key, columns)
        assert got == want, f"pyiceberg {name}: {got} != {want}"
        polars = keyed(pl.scan_iceberg(table).collect().to_dicts(), key, columns)
        assert polars == want, f"polars {name}: {polars} != {want}"


def test_iceberg_follower_snapshot_stream_schema_changes_and_replay(
    pg_db: str, tmp_path: Path, spark, monkeypatch
) -> None:
    monkeypatch.setenv(
        "POLARS_ICEBERG_PLANNER", "pyiceberg"
    )  # Polars plans the scan with pyiceberg (no plugin here)
    sql(pg_db, *SETUP)
    pipe = make_pipe(tmp_path, pg_db, ["public.items", "public.users"], sinks=[SINK, pg_sink(pg_db)])

    # cut 1: the snapshot and the streamed changes in one apply
    snapshot(pipe)
    sql(pg_db, *CHANGES)
    stream(pipe)
    apply_ok(pipe, spark)
    read_back(tmp_path, pg_db)  # (cdc verify runs once, after the second cut)
    items = catalog(tmp_path).load_table("public.items")
    assert items.properties["write.merge.mode"] == "merge-on-read"
    assert items.schema().find_field("big").field_type.__class__.__name__ == "StringType"  # numeric(50,10)
    summary = items.current_snapshot().summary
    assert summary["pgcdc.cut"] and summary["pgcdc.app-id"].startswith("cdc:test:ice:")
    field_id = catalog(tmp_path).load_table("public.users").schema().find_field("name").field_id

    # cut 2: a rename and an added column, crashed after the MERGE (checkpoint not written)
    sql(
        pg_db,
        "ALTER TABLE users RENAME COLUMN name TO full_name",
        "ALTER TABLE users ADD COLUMN score int",
        "UPDATE users SET full_name = 'renamed', score = 7",
        "UPDATE items SET note = 'changed' WHERE id = 3",
    )
    stream(pipe)
    monkeypatch.setenv("CDC_FAULT", "apply:after-merge")
    monkeypatch.setenv("CDC_FAULT_RAISE", "1")
    with pytest.raises(CrashPointReached):
        apply(pipe, spark)
    monkeypatch.delenv("CDC_FAULT")
    users = catalog(tmp_path).load_table("public.users")
    # merge-on-read: the one-row MERGE into items wrote a position-delete file and rewrote no data file
    merged = dict(
        catalog(tmp_path).load_table("public.items").current_snapshot().summary.additional_properties
    )
    assert int(merged.get("added-position-delete-files", 0)) == 1 and "deleted-data-files" not in merged, (
        merged
    )
    assert users.schema().find_field("full_name").field_id == field_id  # a rename is metadata
    snapshots = {t: len(catalog(tmp_path).load_table(t).snapshots()) for t in SOURCE}

    _runs, lines = apply(pipe, spark)  # the replay of the same cut
    out = "\n".join(lines)
    assert out.count("public.users: already applied") == 2 and "public.items: already applied" in out, out
    assert {t: len(catalog(tmp_path).load_table(t).snapshots()) for t in SOURCE} == snapshots
    renamed = (("id",), "SELECT id::text, full_name, n, score FROM users", ("id", "full_name", "n", "score"))
    read_back(tmp_path, pg_db, SOURCE | {"public.users": renamed})
    verified(pipe, spark)
