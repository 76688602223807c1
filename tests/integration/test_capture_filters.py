"""Source-side column lists and row filters (issue 17 items 1 and 3, README "Choosing what is
captured"), against real PostgreSQL 15, Spark/Delta and delta-rs.

The excluded column and the filtered rows never reach the log (read back with `cdc log read`),
rows an UPDATE moves into or out of the filter arrive as inserts and deletes, and the Delta
follower (read with delta-rs) ends equal to `SELECT <columns> FROM t WHERE <predicate>`, which
`cdc verify` compares too. Changing the options on a running pipeline re-bases the tables.
Bad options are refused before anything changes at the source, naming table, column and rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc.ground import logsetup
from sinks.registry import load_pipeline
from tests.fixtures.capture import Pipe, log_read, make_pipe, no_traceback
from tests.fixtures.readers import delta_rows
from tests.harness import apply_once, cdc, flush_wal, sql, verify

pytestmark = pytest.mark.integration

LAKE = [{"name": "lake", "delta": {"path": "lake"}}]

SCHEMA = """
CREATE TABLE users (tenant_id int, id int, email text, password_hash text, PRIMARY KEY (tenant_id, id));
CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL, total numeric(10,2), note text);
ALTER TABLE orders REPLICA IDENTITY FULL;
INSERT INTO users SELECT t, i + (t - 7) * 20, 'u' || i || '@x', 'hash' || i FROM generate_series(7, 8) t, generate_series(1, 20) i;
INSERT INTO orders SELECT i, CASE WHEN i % 3 = 0 THEN 'draft' ELSE 'paid' END, i * 1.5, 'n' || i FROM generate_series(1, 30) i;
"""

USERS = {"exclude_columns": ["password_hash"], "where": "tenant_id = 7"}
ORDERS = {"where": "status <> 'draft'"}


def _write(tmp_path: Path, dsn: str, options: dict) -> Pipe:
    return make_pipe(
        tmp_path, dsn, ["public.users", "public.orders"], sinks=LAKE, postgres={"table_options": options}
    )


def _validate(pipe: Pipe) -> str:
    """`cdc validate` in-process (the CLI's exit codes and messages: test_bad_options_refused_before_any_change)."""
    from pipelines.validate import run_validate

    with logsetup.collected() as lines:
        assert run_validate(load_pipeline(pipe.file)) == 0, lines
    return "\n".join(lines)


def _stream(pipe: Pipe) -> str:
    """`cdc stream --until current` in-process, with the CLI's re-baser; what it said."""
    from cdc.reader import run_stream
    from snapshot.rebase import ThreadRebaser

    flush_wal(pipe.dsn)
    pipeline = load_pipeline(pipe.file)
    with logsetup.collected() as lines:
        run_stream(pipeline, until="current", rebaser=ThreadRebaser(pipeline))
    return "\n".join(lines)


def _filtered(dsn: str, query: str, key: tuple[str, ...]) -> dict[tuple, dict]:
    """The source's rows as the follower must have them: {key texts: {column: text}}."""
    rows = sql(dsn, f"SELECT row_to_json(q)::text FROM ({query}) q")
    out = {}
    for (text,) in rows:
        row = json.loads(text)
        out[tuple(str(row[k]) for k in key)] = {k: None if v is None else str(v) for k, v in row.items()}
    return out


def _lake(spark, pipe: Pipe, table: str, key: tuple[str, ...], columns: list[str]) -> dict[tuple, dict]:
    rows = delta_rows(spark, pipe.dir / "lake" / "public" / table, key)
    return {k: {c: None if r.get(c) is None else str(r[c]) for c in columns} for k, r in rows.items()}


def _lake_matches(spark, pipe: Pipe, users_cols: list[str]) -> None:
    users = _filtered(
        pipe.dsn, f"SELECT {', '.join(users_cols)} FROM users WHERE tenant_id = 7", ("tenant_id", "id")
    )
    assert _lake(spark, pipe, "users", ("tenant_id", "id"), users_cols) == users


def test_columns_and_row_filters_end_to_end(pg_db: str, tmp_path: Path, spark) -> None:
    sql(pg_db, SCHEMA)
    pipe = _write(tmp_path, pg_db, {"public.users": USERS, "public.orders": ORDERS})
    assert "captures columns (tenant_id, id, email) and rows WHERE tenant_id = 7" in _validate(pipe)
    from snapshot.runner import run_snapshot

    run_snapshot(load_pipeline(pipe.file), progress=False)
    sql(
        pg_db,
        "INSERT INTO users VALUES (7, 100, 'new@x', 'secret'), (8, 100, 'other@x', 'secret')",
        "UPDATE users SET tenant_id = 7 WHERE id = 21",  # moves into the filter
        "UPDATE users SET tenant_id = 8 WHERE id = 2",  # moves out of it
        "UPDATE users SET email = 'changed@x', password_hash = 'h2' WHERE tenant_id = 7 AND id = 3",
        "UPDATE orders SET status = 'paid' WHERE id = 3",  # draft -> paid: into the filter
        "UPDATE orders SET status = 'draft' WHERE id = 4",  # paid -> draft: out of it
        "UPDATE orders SET note = 'draft note' WHERE id = 6",  # a draft stays out
        "DELETE FROM orders WHERE id IN (5, 9)",  # a paid and a draft row
    )
    _stream(pipe)

    events = log_read(pipe)
    users = [e for e in events if e and e["source"]["table"] == "users"]
    orders = [e for e in events if e and e["source"]["table"] == "orders"]
    assert users and orders
    for e in users:  # the excluded column and the other tenant never left PostgreSQL
        for image in (e["before"], e["after"]):
            assert image is None or ("password_hash" not in image and image["tenant_id"] == 7), e
    for e in orders:
        for image in (e["before"], e["after"]):
            assert image is None or image.get("status") != "draft" or e["op"] == "d", e
    moved_in = [
        e for e in users if e["op"] == "c" and e["after"]["id"] == 21 and e["source"]["snapshot"] == "false"
    ]
    moved_out = [e for e in users if e["op"] == "d" and e["before"]["id"] == 2]
    assert moved_in and moved_out, "an UPDATE across the filter arrives as an insert and a delete"
    assert [
        e["op"]
        for e in orders
        if e["source"]["snapshot"] == "false" and (e["after"] or e["before"])["id"] == 3
    ] == ["c"]
    assert [
        e["op"]
        for e in orders
        if e["source"]["snapshot"] == "false" and (e["after"] or e["before"])["id"] == 4
    ] == ["d"]

    apply_once(pipe.file, spark)
    code, report = verify(pipe.file, spark)
    assert code == 0, report
    _lake_matches(spark, pipe, ["tenant_id", "id", "email"])
    orders_cols = ["id", "status", "total", "note"]
    want = _filtered(
        pg_db, "SELECT id, status, total::text AS total, note FROM orders WHERE status <> 'draft'", ("id",)
    )
    assert _lake(spark, pipe, "orders", ("id",), orders_cols) == want

    # 17.3: a running pipeline's options change: email left out too, another filter on orders
    _write(
        tmp_path,
        pg_db,
        {
            "public.users": {**USERS, "exclude_columns": ["password_hash", "email"]},
            "public.orders": {"where": "status = 'draft'"},
        },
    )
    noted = _validate(pipe)
    assert "table public.users: source.postgres.table_options changed" in noted, noted
    assert "nothing was changed" in noted
    sql(pg_db, "UPDATE users SET email = 'later@x' WHERE tenant_id = 7 AND id = 4")
    streamed = _stream(pipe)  # sets the publication again and re-bases both tables
    assert "public.users: source.postgres.table_options changed" in streamed, streamed
    assert "re-base public.orders: done" in streamed, streamed
    published = sql(
        pg_db, "SELECT tablename, attnames::text, rowfilter FROM pg_publication_tables ORDER BY 1"
    )
    assert published == [
        ("orders", "{id,status,total,note}", "(status = 'draft'::text)"),
        ("users", "{tenant_id,id}", "(tenant_id = 7)"),
    ]
    after = [e for e in log_read(pipe, "--table", "public.users") if e and e["after"]]
    assert all("email" not in e["after"] for e in after[-20:])
    apply_once(pipe.file, spark)  # followers rebuild both tables from their new base (delta-rs reads them)
    _lake_matches(spark, pipe, ["tenant_id", "id"])
    lake = delta_rows(spark, pipe.dir / "lake" / "public" / "users", ("tenant_id", "id"))
    assert all(r.get("email") is None for r in lake.values()), (
        "a column left out is gone from the current rows"
    )
    want = _filtered(
        pg_db, "SELECT id, status, total::text AS total, note FROM orders WHERE status = 'draft'", ("id",)
    )
    assert _lake(spark, pipe, "orders", ("id",), orders_cols) == want


@pytest.mark.parametrize(
    ("options", "code", "expected"),
    [
        (  # a row filter on a column outside the replica identity
            {"public.users": {"where": "email LIKE '%@x'"}},
            3,
            "the row filter of table public.users uses column email, which is not part of its replica identity "
            "(tenant_id, id) (rule: a row filter of a publication that publishes UPDATE and DELETE may use replica "
            "identity columns only)",
        ),
        (  # a key column left out
            {"public.users": {"exclude_columns": ["id"]}},
            3,
            "column id of table public.users is a key (replica identity) column and cannot be left out (rule:",
        ),
        (  # a typo in a column name, checked against the source
            {"public.orders": {"columns": ["id", "stauts"]}},
            3,
            "table public.orders has no column 'stauts' (did you mean 'status'?) (rule: a column list names columns",
        ),
        (  # a typo in the table name: the pipeline file alone is wrong
            {"public.user": {"columns": ["id"]}},
            2,
            "table_options: public.user is not among `tables` (did you mean 'public.users'?)",
        ),
    ],
    ids=["filter-not-identity", "key-excluded", "column-typo", "table-typo"],
)
def test_bad_options_refused_before_any_change(
    pg_db: str, tmp_path: Path, options: dict, code: int, expected: str
) -> None:
    sql(pg_db, SCHEMA)
    pipe = _write(tmp_path, pg_db, options)
    for verb in ("validate", "snapshot"):
        run = cdc(verb, pipe.file)
        no_traceback(run)
        assert run.code == code, (verb, run.out, run.err)
        text = " ".join((run.out + run.err).split())
        assert expected in text, text
        assert "fix:" in run.out + run.err
    assert sql(pg_db, "SELECT count(*) FROM pg_publication")[0][0] == 0, "nothing changed at the source"
    assert (
        sql(pg_db, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()")[0][0] == 0
    )


def test_filter_postgresql_refuses_is_exit_3(pg_db: str, tmp_path: Path) -> None:
    """A rule PostgreSQL checks only when the publication is set (no mutable functions in a row
    filter): `cdc snapshot` exits 3 with PostgreSQL's message, before any slot exists."""
    sql(pg_db, SCHEMA)
    pipe = _write(tmp_path, pg_db, {"public.users": {"where": "tenant_id > random() * 10"}})
    run = cdc("snapshot", pipe.file)
    no_traceback(run)
    assert run.code == 3, (run.out, run.err)
    text = " ".join((run.out + run.err).split())
    assert "PostgreSQL refused a column list or row filter of source.postgres.table_options" in text, text
    assert "fix:" in text
    assert sql(pg_db, "SELECT count(*) FROM pg_publication")[0][0] == 0
    assert (
        sql(pg_db, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()")[0][0] == 0
    )
