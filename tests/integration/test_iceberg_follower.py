"""The Iceberg follower (issue 39): a pipeline with an `iceberg` sink on the embedded SQLite
catalog, snapshot + stream + apply over a composite-key table (numerics, numeric above 38 digits,
timestamptz, jsonb, arrays, bytea, a TOASTed value left unchanged by an update, deletes, a key
change) and a uuid-keyed table (truncate), both followed a second time in `mode: scd2` through
Iceberg's JDBC catalog on the session's real PostgreSQL; read back with pyiceberg's SqlCatalog on
the catalog file (and on PostgreSQL: the current versions, and the history) and with Polars
`scan_iceberg` (not through the sink) and compared with the source, and `cdc verify`; then a
second cut with a column rename (metadata only: the field id stays), an added column and an update
that leaves a TOASTed value unchanged (the value kept from the table), held between its tables (the live tables are torn: one at the new cut, one not;
readers pinned at the recorded cut with pyiceberg, Polars `cdc sql` and Spark see the first cut
whole), then crashed after its MERGE and applied again: the replay is skipped, no new snapshot;
the latest recorded cut equals the source, the first stays readable. Then `cdc maintain` of the
SQLite follower beside the apply of a third cut, and alone with retention 0: the newest cut is
still read right, the older ones are forgotten, and the apply goes on. Beside them, a keyless
insert-only event table (identical rows among its inserts, in the snapshot, the first cut's stream
and the third cut) followed by the SQLite follower only (SCD2 refuses keyless tables): read back by
pyiceberg as the source's multiset, each row once per insert, identified by its log position.
A column dropped at the source in cut 3 is set NULL by the SQLite follower (`dropped_columns:
null`), kept by the SCD2 one; in cut 4 another is dropped from the table's schema (`drop`: the
other field ids unchanged). Cut 4 also adds two derived views to the pipeline file (`cdc validate`
lists their Iceberg sinks): their first build and, in cut 5, an incremental cut reach the
followers' `views.<name>` tables, read by pyiceberg and Polars and compared with the view's SQL run
by PostgreSQL, and by `cdc sql` and `cdc verify`. Write modes per table: users copy-on-write
from the start, items switched to it at cut 4 (its properties altered, the same table): their cuts
rewrite data files and add no delete file, read with pyiceberg. Last, `cdc status --json` (each
table's snapshot at the recorded cut; both followers self-checked without Spark, nothing lost);
a table dropped and one rolled back to an older snapshot behind the tool, found by `cdc status`
(exit 1, the fix) and rebuilt by the next apply (read back, `cdc verify`); `cdc reset --to-cut`
with new changes, and `cdc reset --rebuild`, each followed by an apply read back against the
source.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from cdc.ground import logsetup
from pipelines.cli import cli
from pipelines.faults import CrashPointReached
from tests.fixtures.lake import apply, apply_ok, ckpt, make_pipe, snapshot, stream, verified
from tests.harness import edit_pipeline, sql

pytestmark = pytest.mark.integration

# `dropped_columns: null` here (a column dropped in cut 3 is set NULL); `drop` from cut 4 on.
# Write modes: the sink's merge-on-read, users copy-on-write (table_options); from cut 4 on items
# is switched to copy-on-write too (the existing table's properties altered, no rebuild).
SINK = {
    "name": "ice",
    "dropped_columns": "null",
    "iceberg": {"warehouse": "ice", "table_options": {"public.users": {"write_mode": "copy-on-write"}}},
}
# Derived views declared from cut 4 on (a view added to a running pipeline: its first build, then
# an incremental cut), over the tables the followers already have; the SQLite follower takes both,
# the SCD2 one the aggregate. Not from the start: the base follower of the views (an internal Delta
# follower) would reach the crash points of cut 2 before the Iceberg followers do.
VIEWS = [
    {
        "name": "items_by_region",
        "sql": "SELECT region, count(*) AS items, sum(amt) AS total FROM public.items GROUP BY region",
        "key": ["region"],
    },
    {
        "name": "item_notes",  # a composite key, a filter rows leave by, TOASTed notes kept unchanged
        "sql": "SELECT region, id, amt, note FROM public.items WHERE amt > 0",
        "key": ["region", "id"],
    },
]
VIEW_FOLLOWERS = {"items_by_region": ("ice", "icepg"), "item_notes": ("ice",)}
MAINTAIN = ("pipelines.maintain", "sinks.iceberg.maintain")  # the loggers of `cdc maintain`'s lines


def pg_sink(dsn: str) -> dict[str, Any]:
    """A second follower, SCD2, on Iceberg's JDBC catalog in the session's real PostgreSQL."""
    url = urlsplit(dsn)
    jdbc = {
        "type": "jdbc",
        "uri": f"jdbc:postgresql://{url.hostname}:{url.port}{url.path}",
        "user": url.username,
    }
    catalog = jdbc | {"password": url.password}
    return {
        "name": "icepg",
        "iceberg": {
            "warehouse": "icepg",
            "mode": "scd2",
            "catalog": catalog,
            "tables": ["public.items", "public.users"],  # SCD2 keeps versions of keyed rows only
        },
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
    "CREATE TABLE events(who text, what text, n int)",  # no key, default replica identity: insert-only
    "INSERT INTO events VALUES ('u1', 'login', 1), ('u1', 'login', 1), ('u2', NULL, 2)",
)
CHANGES = (
    "UPDATE items SET amt = 99.5 WHERE id = 1",  # note (TOASTed) unchanged: not in the WAL
    "DELETE FROM items WHERE id = 2",
    "UPDATE items SET id = 106 WHERE id = 6",  # a key change
    "INSERT INTO items VALUES ('us', 1, -0.001, NULL, NULL, '[1, {\"x\": null}]', '{}', '', 'new')",
    "TRUNCATE users",
    "INSERT INTO users VALUES ('00000000-0000-0000-0000-000000000001', 'after truncate', -3)",
    "INSERT INTO events VALUES ('u1', 'login', 1), ('u3', 'logout', 3), ('u3', 'logout', 3)",
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
    """pyiceberg and Polars, not the sink, read each table of both followers (of the SCD2 one, on
    the PostgreSQL catalog, the current versions): equal to the source."""
    import polars as pl

    for name, (key, query, columns) in tables.items():
        want = source(dsn, key, query, columns)
        for follower, table in (
            ("ice", catalog(tmp_path).load_table(name)),
            ("icepg", pg_catalog(dsn).load_table(name)),
        ):
            rows = table.scan().to_arrow().to_pylist()
            frame = pl.scan_iceberg(table)
            if follower == "icepg":  # scd2: the current version of each key
                rows = [r for r in rows if r["_cdc_end_lsn"] is None]
                frame = frame.filter(pl.col("_cdc_end_lsn").is_null())
            got = keyed(rows, key, columns)
            assert got == want and len(rows) == len(want), f"pyiceberg {follower} {name}: {got} != {want}"
            polars = keyed(frame.collect().to_dicts(), key, columns)
            assert polars == want, f"polars {follower} {name}: {polars} != {want}"


def events_match(tmp_path: Path, dsn: str) -> None:
    """The keyless table read by pyiceberg: the source's rows as a multiset (each once per insert),
    each row with its own log position."""
    table = catalog(tmp_path).load_table("public.events")
    assert {"_cdc_lsn", "_cdc_seq"} <= {f.name for f in table.schema().fields}
    rows = table.scan().to_arrow().to_pylist()
    positions = [(r["_cdc_lsn"], r["_cdc_seq"]) for r in rows]
    assert None not in {p for pos in positions for p in pos} and len(set(positions)) == len(rows), rows
    got = Counter((r["who"], r["what"], r["n"]) for r in rows)
    want = Counter(sql(dsn, "SELECT who, what, n FROM events"))
    assert got == want and max(want.values()) >= 2, (got, want)


def views_match(tmp_path: Path, dsn: str) -> None:
    """Each view's Iceberg table, read by pyiceberg and Polars (of the SCD2 follower: the current
    versions), equals the view's SQL run by PostgreSQL over the source."""
    import polars as pl

    from tests.fixtures.views import norm as vnorm
    from tests.fixtures.views import pg_view

    for view in VIEWS:
        key = view["key"]
        columns, want = pg_view(dsn, view["sql"], key)
        for follower in VIEW_FOLLOWERS[view["name"]]:
            cat = catalog(tmp_path) if follower == "ice" else pg_catalog(dsn)
            table = cat.load_table(f"views.{view['name']}")
            rows = table.scan().to_arrow().to_pylist()
            frame = pl.scan_iceberg(table)
            if follower == "icepg":
                rows = [r for r in rows if r["_cdc_end_lsn"] is None]
                frame = frame.filter(pl.col("_cdc_end_lsn").is_null())
            for reader, got_rows in (("pyiceberg", rows), ("polars", frame.collect().to_dicts())):
                got = {tuple(str(r[k]) for k in key): tuple(vnorm(r[c]) for c in columns) for r in got_rows}
                assert got == want and len(got_rows) == len(want), (
                    f"{reader} {follower} views.{view['name']}: {got} != {want}"
                )


def copy_on_write(table, snapshot) -> bool:
    """The snapshot rewrote data files and added no delete file (its summary, and its manifests
    read by pyiceberg: none of the delete manifests is its own)."""
    from pyiceberg.manifest import ManifestContent

    summary = snapshot.summary.additional_properties
    own_deletes = [
        m
        for m in snapshot.manifests(table.io)
        if m.content == ManifestContent.DELETES and m.added_snapshot_id == snapshot.snapshot_id
    ]
    return (
        int(summary.get("deleted-data-files", 0)) >= 1
        and "added-position-delete-files" not in summary
        and not own_deletes
    )


def history(dsn: str, name: str) -> list[dict[str, Any]]:
    """Every version the SCD2 follower holds of a table, oldest first per key."""
    rows = pg_catalog(dsn).load_table(name).scan().to_arrow().to_pylist()
    return sorted(rows, key=lambda r: (str(r.get("id")), r["_cdc_start_lsn"]))


def test_iceberg_follower_snapshot_stream_schema_changes_and_replay(
    pg_db: str, tmp_path: Path, spark, monkeypatch
) -> None:
    monkeypatch.setenv(
        "POLARS_ICEBERG_PLANNER", "pyiceberg"
    )  # Polars plans the scan with pyiceberg (no plugin here)
    sql(pg_db, *SETUP)
    pipe = make_pipe(
        tmp_path, pg_db, ["public.items", "public.users", "public.events"], sinks=[SINK, pg_sink(pg_db)]
    )

    # cut 1: the snapshot and the streamed changes in one apply
    snapshot(pipe)
    sql(pg_db, *CHANGES)
    stream(pipe)
    apply_ok(pipe, spark)
    read_back(tmp_path, pg_db)  # (cdc verify runs once, after the second cut)
    events_match(tmp_path, pg_db)  # 3 snapshot rows + 3 streamed, two pairs of identical ones
    items = catalog(tmp_path).load_table("public.items")
    assert items.properties["write.merge.mode"] == "merge-on-read"
    modes = catalog(tmp_path).load_table("public.users").properties
    assert [modes[f"write.{op}.mode"] for op in ("merge", "update", "delete")] == ["copy-on-write"] * 3
    assert items.schema().find_field("big").field_type.__class__.__name__ == "StringType"  # numeric(50,10)
    summary = items.current_snapshot().summary
    assert summary["pgcdc.cut"] and summary["pgcdc.app-id"].startswith("cdc:test:ice:")
    field_id = catalog(tmp_path).load_table("public.users").schema().find_field("name").field_id
    amt_id = items.schema().find_field("amt").field_id

    # cut 2: a rename and an added column, held between its tables, then crashed after the MERGE
    # (checkpoint not written)
    from sinks.iceberg.cuts import list_cuts, tables_at_cut

    lake = tmp_path / "ice"
    first, at_first = tables_at_cut(catalog(tmp_path), lake)
    assert set(at_first) == {*SOURCE, "public.events"} and at_first["public.items"].num_rows == 8, first
    sql(
        pg_db,
        "ALTER TABLE users RENAME COLUMN name TO full_name",
        "ALTER TABLE users ADD COLUMN score int",
        "UPDATE users SET full_name = 'renamed', score = 7",
        "UPDATE items SET note = 'changed' WHERE id = 3",
        # a larger decimal precision (no rewrite in PostgreSQL): widened in place, Iceberg's evolution
        "ALTER TABLE items ALTER COLUMN amt TYPE numeric(14,3)",
        "UPDATE items SET amt = 12345678901.5 WHERE id = 4",  # note (TOASTed) unchanged: kept from the table
    )
    stream(pipe)
    pause = tmp_path / "paused"
    monkeypatch.setenv("CDC_PAUSE", "apply:between-tables")
    monkeypatch.setenv("CDC_PAUSE_FILE", str(pause))
    monkeypatch.setenv("CDC_FAULT", "apply:after-merge")
    monkeypatch.setenv("CDC_FAULT_RAISE", "1")
    ended: list = []

    def crashing_apply() -> None:
        try:
            ended.append(apply(pipe, spark))
        except CrashPointReached as crash:
            ended.append(crash)

    worker = threading.Thread(target=crashing_apply, daemon=True)
    worker.start()
    while not pause.exists():  # the apply holds with one table of the cut committed
        assert worker.is_alive(), f"apply ended without reaching the pause: {ended}"
        worker.join(0.05)
    # Live, the tables are torn: one has the cut's change, the other not yet. Pinned at the
    # recorded cut (pyiceberg; Polars through `cdc sql`), both are as the first cut left them.
    live = {t: catalog(tmp_path).load_table(t).scan().to_arrow().to_pylist() for t in SOURCE}
    items_done = any(r["note"] == "changed" for r in live["public.items"])
    users_done = any(r.get("full_name") == "renamed" for r in live["public.users"])
    assert items_done != users_done, live
    pinned, at_pinned = tables_at_cut(catalog(tmp_path), lake)
    assert pinned.cut_id == first.cut_id and pinned.versions == first.versions
    assert {t: rows.to_pylist() for t, rows in at_pinned.items()} == {
        t: rows.to_pylist() for t, rows in at_first.items()
    }
    runner = CliRunner()
    query = "SELECT count(*) AS n, sum(CASE WHEN note = 'changed' THEN 1 ELSE 0 END) AS changed FROM items"
    result = runner.invoke(cli, ["sql", str(pipe.file), "--sink", "ice", query], catch_exceptions=False)
    assert result.exit_code == 0 and result.stdout.splitlines() == ["n\tchanged", "8\t0"], result.output
    assert f"-- sink ice: cut {first.cut_id} " in result.stderr and "engine polars" in result.stderr
    monkeypatch.delenv("CDC_PAUSE")  # first: the SCD2 follower must not hold at the point after this
    pause.unlink()
    worker.join(600)  # a hang guard only
    assert not worker.is_alive() and ended and isinstance(ended[0], CrashPointReached), ended
    monkeypatch.delenv("CDC_FAULT")
    users = catalog(tmp_path).load_table("public.users")
    # merge-on-read: the two-row MERGE into items wrote position deletes and rewrote no data file
    merged = dict(
        catalog(tmp_path).load_table("public.items").current_snapshot().summary.additional_properties
    )
    assert int(merged.get("added-position-delete-files", 0)) >= 1 and "deleted-data-files" not in merged, (
        merged
    )
    assert users.schema().find_field("full_name").field_id == field_id  # a rename is metadata
    widened = catalog(tmp_path).load_table("public.items").schema().find_field("amt")
    assert (widened.field_id, str(widened.field_type)) == (amt_id, "decimal(14, 3)"), widened  # metadata too
    # copy-on-write (table_options): users' cut-2 MERGE rewrote its data file, no position deletes
    copied = users.current_snapshot()
    assert copied.summary["pgcdc.cut"] and copy_on_write(users, copied), copied.summary
    snapshots = {t: len(catalog(tmp_path).load_table(t).snapshots()) for t in SOURCE}

    _runs, lines = apply(pipe, spark)  # the replay of the same cut
    out = "\n".join(lines)
    assert out.count("public.users: already applied") == 2 and "public.items: already applied" in out, out
    assert {t: len(catalog(tmp_path).load_table(t).snapshots()) for t in SOURCE} == snapshots
    # no marker commit per cut: the property names the follower and base only, the position is the
    # newest `pgcdc.cut` of its snapshots, which the checkpoint keeps per table (issue 37 item 1)
    items = catalog(tmp_path).load_table("public.items")
    marker = json.loads(items.properties["cdc.follower"])
    assert "end" not in marker and "cut_id" not in marker and marker["sink"] == "ice", marker
    applied = ckpt(pipe, "ice")
    assert applied["written"]["public.items"] == applied["cut_id"]
    assert items.current_snapshot().summary["pgcdc.cut"] == str(applied["cut_id"])
    renamed = (("id",), "SELECT id::text, full_name, n, score FROM users", ("id", "full_name", "n", "score"))
    read_back(tmp_path, pg_db, SOURCE | {"public.users": renamed})
    # SCD2 history: the 5 snapshot rows ended by the truncate, the row after it ended by cut 2's update
    users = history(pg_db, "public.users")
    assert [(r["full_name"], r["_cdc_end_lsn"] is None) for r in users].count(("renamed", True)) == 1, users
    assert len(users) == 7 and sum(r["_cdc_end_lsn"] is None for r in users) == 1, users
    items = [r for r in history(pg_db, "public.items") if r["region"] == "eu"]
    by_id: dict[int, list] = {}
    for r in items:
        by_id.setdefault(r["id"], []).append(r)
    assert [r["_cdc_end_lsn"] is None for r in by_id[2]] == [False] and 6 not in {
        r["id"] for r in items if r["_cdc_end_lsn"] is None
    }
    four = by_id[4]  # two versions: the second kept the TOASTed note the update did not send
    assert len(four) == 2 and four[0]["_cdc_end_lsn"] == four[1]["_cdc_start_lsn"], four
    assert (
        four[1]["amt"] == Decimal("12345678901.500")  # beyond numeric(12,3): the SCD2 table widened too
        and four[1]["note"] == four[0]["note"]
        and len(four[0]["note"]) == 6400
    )

    # The replay recorded the second cut once; read at it, every table equals the source; the
    # first cut stays readable, with Spark too (its snapshot, its schema).
    cuts = list_cuts(lake)
    assert [c.cut_id for c in cuts] == [cuts[0].cut_id, first.cut_id] and cuts[0].cut_id > first.cut_id
    latest, at_latest = tables_at_cut(catalog(tmp_path), lake)
    for name, (key, query_, columns) in (SOURCE | {"public.users": renamed}).items():
        got = keyed(at_latest[name].to_pylist(), key, columns)
        assert got == source(pg_db, key, query_, columns), name
    assert (
        latest.versions["public.items"]
        == catalog(tmp_path).load_table("public.items").current_snapshot().snapshot_id
    )
    result = runner.invoke(cli, ["sql", str(pipe.file), "--sink", "ice", "--cuts"])
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 2, result.output
    from pipelines.lakesql import run_sql
    from sinks.registry import load_pipeline

    out: list[str] = []
    notes: list[str] = []
    args = (
        "SELECT name FROM users",
        "ice",
        first.cut_id,
        10,
        False,
        False,
        out.append,
        notes.append,
        "spark",
    )
    assert run_sql(load_pipeline(pipe.file), lambda: spark, *args) == 0  # the column's name at that cut
    assert out == ["name", "after truncate"] and "engine spark" in notes[0], (out, notes)
    result = runner.invoke(cli, ["sql", str(pipe.file), "--sink", "ice", "SELECT * FROM nosuch"])
    assert result.exit_code == 2 and "Polars refused the query" in result.stderr, result.output
    result = runner.invoke(
        cli, ["sql", str(pipe.file), "--sink", "ice", "--engine", "datafusion", "SELECT 1"]
    )
    assert result.exit_code == 2 and "--engine datafusion does not read iceberg" in result.stderr, (
        result.output
    )

    # `cdc maintain` beside an apply: compaction (data files bin-packed, those with position deletes
    # rewritten) commits while cut 3 applies in this thread; nothing lost or doubled.
    from pipelines.maintain import run_maintain

    pipeline = load_pipeline(pipe.file)
    sql(
        pg_db,
        "UPDATE items SET amt = amt + 1 WHERE id IN (1, 3)",
        "DELETE FROM items WHERE id = 5",
        "INSERT INTO events VALUES ('u2', NULL, 2), ('u4', 'login', 4)",  # appended beside maintain
        # dropped at the source: NULL in every row of the SQLite follower (dropped_columns: null),
        # kept with its last values by the SCD2 one; the update brings the DROP into the log
        "ALTER TABLE users DROP COLUMN n",
        "UPDATE users SET score = 8",
    )
    stream(pipe)
    done: list = []
    args3 = (pipeline, spark.newSession(), ["ice"], None, 1, True, True)
    with logsetup.collected(*MAINTAIN) as lines:  # maintain's lines, not apply's
        beside = threading.Thread(target=lambda: done.append(run_maintain(*args3)), daemon=True)
        beside.start()
        apply_ok(pipe, spark)
        beside.join(600)  # a hang guard only
    assert done == [0], "\n".join(lines)
    report = "\n".join(lines)
    assert "sink ice: public.items: " in report and "retention 168 h" in report, report
    no_n = (("id",), "SELECT id::text, full_name, score FROM users", ("id", "full_name", "score"))
    read_back(tmp_path, pg_db, SOURCE | {"public.users": no_n})
    nulled = catalog(tmp_path).load_table("public.users")
    assert [r["n"] for r in nulled.scan().to_arrow().to_pylist()] == [None], "dropped_columns: null"
    kept = [r for r in history(pg_db, "public.users") if r["_cdc_end_lsn"] is None]
    assert [(r["n"], r["score"]) for r in kept] == [(-3, 8)], kept  # scd2: keep, the last value

    # No apply running: retention 0 keeps the newest cut's snapshots (and each table's newest one
    # carrying its follower's cut); older snapshots, their files and the older cut records go.
    latest = list_cuts(lake)[0]
    with logsetup.collected(*MAINTAIN) as lines:
        assert run_maintain(pipeline, spark.newSession(), ["ice"], 0.0, 1, True, True) == 0
    report = "\n".join(lines)
    assert "_cdc_cuts: 2 cut(s) older than the retention forgotten" in report, report
    assert [c.cut_id for c in list_cuts(lake)] == [latest.cut_id], report
    expired = re.search(r"sink ice: public\.items: .*\((\d+) snapshot\(s\) expired", report)
    assert expired and int(expired[1]) > 0, report
    for name in SOURCE:
        table = catalog(tmp_path).load_table(name)
        kept = {s.snapshot_id for s in table.snapshots()}
        assert latest.versions[name] in kept and first.versions[name] not in kept, (name, kept, report)
        summary = table.current_snapshot().summary
        assert int(summary["total-delete-files"]) == 0, (name, summary, report)
    _rec, now = tables_at_cut(catalog(tmp_path), lake)
    for name, (key, query_, columns) in (SOURCE | {"public.users": no_n}).items():
        assert keyed(now[name].to_pylist(), key, columns) == source(pg_db, key, query_, columns), name

    # cut 4: the apply goes on after maintenance, with derived views added to the pipeline file
    # (their first build) and, with `dropped_columns: drop`, a column dropped from the SQLite
    # follower's table (Iceberg schema evolution: metadata only)
    def add_views(doc: dict[str, Any]) -> None:
        doc["views"] = VIEWS
        for sink in doc["sinks"]:
            sink["iceberg"]["views"] = [
                v for v, followers in VIEW_FOLLOWERS.items() if sink["name"] in followers
            ]
        ice = doc["sinks"][0]
        ice["dropped_columns"] = "drop"
        ice["iceberg"]["table_options"]["public.items"] = {"write_mode": "copy-on-write"}
        ice["iceberg"]["tables"] = [*SOURCE, "public.events"]  # with `views`, tables are named

    edit_pipeline(pipe.file, add_views)
    result = runner.invoke(cli, ["validate", str(pipe.file)], catch_exceptions=False)
    assert (
        "ok   view items_by_region: incremental (3 columns, key region; sinks: ice, icepg)" in result.output
    )
    assert "ok   view item_notes: incremental (4 columns, key region, id; sinks: ice)" in result.output
    assert result.exit_code == 0, result.output
    note_id = catalog(tmp_path).load_table("public.items").schema().find_field("note").field_id
    items_uuid = catalog(tmp_path).load_table("public.items").metadata.table_uuid
    sql(pg_db, "ALTER TABLE items DROP COLUMN blob", "UPDATE items SET amt = 0 WHERE id = 7")
    stream(pipe)
    runs, lines = apply(pipe, spark)
    out = "\n".join(lines)
    assert not [r for r in runs if r.error is not None], out
    assert "view item_notes: cut " in out and "first build" in out, out
    assert "public.items: column(s) blob dropped at the source: dropped from the table" in out, out
    # items switched to copy-on-write: its properties altered in place (same table), and its cut-4
    # MERGE (one row updated) rewrote a data file and wrote no position deletes
    assert "sink ice: public.items: write mode set to copy-on-write (table properties only)" in out, out
    items_t = catalog(tmp_path).load_table("public.items")
    assert (
        items_t.metadata.table_uuid == items_uuid
        and items_t.properties["write.merge.mode"] == "copy-on-write"
    )
    cut4 = list_cuts(lake)[0].cut_id
    merged4 = next(
        s for s in items_t.snapshots() if s.summary.additional_properties.get("pgcdc.cut") == str(cut4)
    )
    assert copy_on_write(items_t, merged4), merged4.summary
    no_blob = (
        ("region", "id"),
        "SELECT region, id, amt, big::text, ts, doc::text, tags, note FROM items",
        ("region", "id", "amt", "big", "ts", "doc", "tags", "note"),
    )
    tables = SOURCE | {"public.users": no_n, "public.items": no_blob}
    read_back(tmp_path, pg_db, tables)
    items = catalog(tmp_path).load_table("public.items").schema()
    assert "blob" not in {f.name for f in items.fields} and items.find_field("note").field_id == note_id
    assert all(r["blob"] for r in history(pg_db, "public.items") if r["region"] == "eu"), "scd2 keeps blob"
    views_match(tmp_path, pg_db)

    # cut 5: the views' incremental cut reaches the followers as their changed rows only: an
    # update (a TOASTed note unchanged), an insert, a delete, a row leaving the view by its filter
    sql(
        pg_db,
        "UPDATE items SET amt = amt + 10 WHERE id IN (1, 3)",
        "INSERT INTO items (region, id, amt, note) VALUES ('us', 2, 5, 'us two')",
        "DELETE FROM items WHERE id = 4",
        "UPDATE items SET amt = -1 WHERE id = 8",
    )
    stream(pipe)
    before = {v: len(catalog(tmp_path).load_table(f"views.{v}").snapshots()) for v in VIEW_FOLLOWERS}
    runs, lines = apply(pipe, spark)
    out = "\n".join(lines)
    assert not [r for r in runs if r.error is not None], out
    assert re.search(r"view item_notes: cut \d+: \+1 ~3 -2 \(incremental\)", out), out
    notes = catalog(tmp_path).load_table("views.item_notes")
    merged = notes.current_snapshot().summary  # one MERGE of the changed view rows
    assert int(merged["pgcdc.cut"]) > 0 and len(notes.snapshots()) == before["item_notes"] + 1, merged
    views_match(tmp_path, pg_db)
    read_back(tmp_path, pg_db, tables)
    record, at_cut = tables_at_cut(catalog(tmp_path), lake)
    assert {"views.items_by_region", "views.item_notes"} <= set(record.versions), record
    assert at_cut["views.item_notes"].num_rows == sql(pg_db, "SELECT count(*) FROM items WHERE amt > 0")[0][0]
    query = "SELECT region, items FROM items_by_region ORDER BY region"
    result = runner.invoke(cli, ["sql", str(pipe.file), "--sink", "ice", query], catch_exceptions=False)
    want_lines = [
        "region\titems",
        *(f"{r}\t{n}" for r, n in sql(pg_db, "SELECT region, count(*) FROM items GROUP BY 1 ORDER BY 1")),
    ]
    assert result.exit_code == 0 and result.stdout.splitlines() == want_lines, result.output
    events_match(tmp_path, pg_db)  # (cdc verify runs after the rebuild below)

    # `cdc status` (no JVM): the Iceberg follower's position, backlog and each table's snapshot at
    # its recorded cut (the ids a reader pins)

    result = runner.invoke(cli, ["status", str(pipe.file), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    ice = next(f for f in json.loads(result.stdout)["followers"] if f["sink"] == "ice")
    record = list_cuts(lake)[0]
    assert ice["cut_id"] == record.cut_id and ice["events_behind_log"] == 0 and ice["lag_s"] == 0, ice
    current = {t: catalog(tmp_path).load_table(t).current_snapshot().snapshot_id for t in SOURCE}
    assert ice["iceberg_cut"]["cut_id"] == record.cut_id, ice
    assert {t: ice["iceberg_cut"]["snapshots"][t] for t in SOURCE} == current, ice
    # its self-check without Spark (pyiceberg on both catalogs, SQLite and PostgreSQL: each table,
    # its marker property, the newest cut among its current snapshot's ancestors): nothing lost
    checked = {f["sink"]: f for f in json.loads(result.stdout)["followers"]}
    assert "self_check" not in checked["ice"] and "self_check" not in checked["icepg"], checked
    result = runner.invoke(cli, ["status", str(pipe.file)], catch_exceptions=False)
    assert f"follower ice (iceberg): tables at cut {record.cut_id} (" in result.output, result.output
    assert result.exit_code == 0 and "was not checked" not in result.output, result.output

    # Behind the tool: users dropped, items rolled back to its cut-4 snapshot (cut 5's MERGE stays
    # in the metadata, not in the table). `cdc status` finds both (exit 1, the fix); the next
    # apply rebuilds them from the log's base.
    cut5 = record.cut_id
    assert ckpt(pipe, "ice")["written"]["public.items"] == cut5 > cut4
    catalog(tmp_path).drop_table("public.users")
    rolled = catalog(tmp_path).load_table("public.items")
    rolled.manage_snapshots().rollback_to_snapshot(merged4.snapshot_id).commit()
    kept = [s.summary.additional_properties.get("pgcdc.cut") for s in rolled.snapshots()]
    assert str(cut5) in kept, kept  # still in the metadata: the ancestors alone tell it is gone
    result = runner.invoke(cli, ["status", str(pipe.file)], catch_exceptions=False)
    out = result.output
    assert result.exit_code == 1, out
    assert (
        "follower ice LOST DATA it had applied (found now): public.items (the engine holds the table" in out
    )
    assert f"with commits up to cut {cut4}, the checkpoint says cut {cut5} wrote it" in out, out
    assert "public.users (the table is gone from the engine (deleted or moved away))" in out, out
    assert "--once --sink ice`: it rebuilds the lost tables" in out and "follower icepg LOST" not in out, out
    runs, lines = apply(pipe, spark, "ice")
    out = "\n".join(lines)
    assert not [r for r in runs if r.error is not None], out
    assert "sink ice: the follower lost data it had applied (public.items: " in out, out
    assert "public.users: the table is gone" in out and "rebuilding from the log's base" in out, out
    read_back(tmp_path, pg_db, tables)
    assert catalog(tmp_path).load_table("public.items").metadata.table_uuid != items_uuid
    verified(pipe, spark, "ice")
    result = runner.invoke(cli, ["status", str(pipe.file)], catch_exceptions=False)
    assert result.exit_code == 0 and "follower ice lost data at" in result.output, result.output

    # `cdc reset --to-cut` (back to cut 4): the next apply applies cut 5's changes again with new
    # ones; the rows still there are left as they are (newer positions win), the result is the source
    sql(
        pg_db,
        "UPDATE items SET amt = amt + 100 WHERE id = 1",
        "INSERT INTO users VALUES ('00000000-0000-0000-0000-000000000002', 'after reset', 9)",
    )
    stream(pipe)
    result = runner.invoke(cli, ["reset", str(pipe.file), "--sink", "ice", "--to-cut", str(cut4), "--yes"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["status", str(pipe.file), "--json"], catch_exceptions=False)
    ice = next(f for f in json.loads(result.stdout)["followers"] if f["sink"] == "ice")
    assert ice["cut_id"] == cut4 and ice["events_behind_log"] > 0, ice
    apply_ok(pipe, spark)
    read_back(tmp_path, pg_db, tables)
    views_match(tmp_path, pg_db)
    events_match(tmp_path, pg_db)

    # `cdc reset --rebuild`: the next apply drops the follower's tables and makes them again from
    # the log's base (new tables, the write modes of table_options), equal to the source
    result = runner.invoke(cli, ["reset", str(pipe.file), "--sink", "ice", "--rebuild", "--yes"])
    assert result.exit_code == 0, result.output
    apply_ok(pipe, spark, "ice")
    rebuilt = catalog(tmp_path).load_table("public.items")
    assert (
        rebuilt.metadata.table_uuid != items_uuid
        and rebuilt.properties["write.merge.mode"] == "copy-on-write"
    )
    read_back(tmp_path, pg_db, tables)
    views_match(tmp_path, pg_db)
    events_match(tmp_path, pg_db)
    verified(pipe, spark)

    # a type change Iceberg cannot express (int -> text): each follower stops before writing, naming
    # the column and the fix (`cdc stream` from the CLI re-bases the rewritten table by itself, which
    # makes it again; this in-process stream does not); the fix as printed rebuilds it from the log
    sql(pg_db, "ALTER TABLE users ALTER COLUMN score TYPE text USING score::text")
    sql(pg_db, "UPDATE users SET score = 'seven'")
    stream(pipe)
    runs, lines = apply(pipe, spark)
    out = "\n".join(lines)
    assert {r.sink for r in runs if r.error is not None} == {"ice", "icepg"}, out
    assert "column 'score' is int but the source now needs string, which Iceberg cannot widen to" in out, out
    assert "fix: drop the Iceberg table (it is rebuilt from the log on the next apply)" in out, out
    catalog(tmp_path).drop_table("public.users")
    pg_catalog(pg_db).drop_table("public.users")
    apply_ok(pipe, spark)
    retyped = catalog(tmp_path).load_table("public.users")
    assert str(retyped.schema().find_field("score").field_type) == "string", retyped.schema()
    read_back(tmp_path, pg_db, tables)
    verified(pipe, spark)
