"""Issue 33.3 on real PostgreSQL: with `exclude_columns` the publication has a column list, and
PostgreSQL refuses `ALTER COLUMN ... TYPE` of a listed column; `cdc migrate --sql FILE` runs it in one
transaction with the publication's column list, the excluded column never reaches the log, and the
Delta follower stays exact (`cdc verify`). A file that changes rows of such a table is refused and
rolled back; a failing file changes nothing."""

from __future__ import annotations

import json

import psycopg2
import pytest

from cdc.filters import published
from cdc.ground import logsetup
from cdc.ground.tables import TableName
from cdc.session import libpq_options
from pipelines.validate import run_validate
from sinks.registry import load_pipeline
from tests.fixtures.capture import log_read, no_traceback
from tests.fixtures.lake import LAKE, apply_ok, delta_df, make_pipe, snapshot, verified
from tests.harness import cdc, flush_wal, sql

pytestmark = pytest.mark.integration

USERS = TableName("public", "users")


def _column_type(dsn: str, column: str) -> str:
    conn = psycopg2.connect(dsn, options=libpq_options())
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'users'::regclass AND attname = %s",
                (column,),
            )
            return cur.fetchone()[0]
    finally:
        conn.close()


def _published_columns(dsn: str, publication: str) -> tuple[str, ...] | None:
    conn = psycopg2.connect(dsn, options=libpq_options())
    try:
        return published(conn, publication)[USERS][0]
    finally:
        conn.close()


def _stream(pipe) -> None:
    """`cdc stream --until current` as a user runs it (with the re-baser a type change's rewrite needs)."""
    flush_wal(pipe.dsn)
    run = cdc("stream", pipe.file, "--until", "current")
    assert run.code == 0, run.out + run.err


def test_migrate_alters_a_column_of_a_table_with_a_column_list(tmp_path, pg_db, spark):
    sql(
        pg_db,
        "CREATE TABLE users(id int PRIMARY KEY, name text, login_count int, password_hash text)",
        "INSERT INTO users SELECT g, 'u' || g, g, 'secret' || g FROM generate_series(1, 40) g",
    )
    options = {"public.users": {"exclude_columns": ["password_hash"]}}
    pipe = make_pipe(tmp_path, pg_db, ["public.users"], sinks=[LAKE], postgres={"table_options": options})
    snapshot(pipe)
    apply_ok(pipe, spark)
    with logsetup.collected() as lines:
        assert run_validate(load_pipeline(pipe.file)) == 0, lines
    warned = "\n".join(lines)
    assert "warn table public.users: its publication column list" in warned and "cdc migrate" in warned, (
        warned
    )
    assert _published_columns(pg_db, f"cdc_{pipe.name}") == ("id", "name", "login_count")

    # the problem: PostgreSQL refuses the routine migration
    with pytest.raises(psycopg2.Error, match="publication"):
        sql(pg_db, "ALTER TABLE users ALTER COLUMN login_count TYPE bigint")

    # a file that also changes rows of the table: refused, rolled back
    bad = tmp_path / "bad.sql"
    bad.write_text(
        "ALTER TABLE users ALTER COLUMN login_count TYPE bigint;\nUPDATE users SET name = 'x' WHERE id = 1;\n"
    )
    run = cdc("migrate", pipe.file, "--sql", bad)
    assert run.code == 2, run.out + run.err
    no_traceback(run)
    assert "changes rows of public.users" in run.err and "fix:" in run.err, run.err
    assert _column_type(pg_db, "login_count") == "integer"
    assert _published_columns(pg_db, f"cdc_{pipe.name}") == ("id", "name", "login_count")

    # a failing file: PostgreSQL's error, nothing changed
    broken = tmp_path / "broken.sql"
    broken.write_text(
        "ALTER TABLE users ALTER COLUMN login_count TYPE bigint; ALTER TABLE users ALTER COLUMN nope TYPE int;"
    )
    run = cdc("migrate", pipe.file, "--sql", broken)
    assert run.code == 3 and "nope" in run.err and "rolled back" in run.err, run.out + run.err
    assert _column_type(pg_db, "login_count") == "integer"

    # the way: cdc migrate
    good = tmp_path / "widen.sql"
    good.write_text("ALTER TABLE users ALTER COLUMN login_count TYPE bigint;\n")
    run = cdc("migrate", pipe.file, "--sql", good)
    assert run.code == 0, run.out + run.err
    assert "captures columns (id, name, login_count)" in run.out, run.out
    assert _column_type(pg_db, "login_count") == "bigint"
    assert _published_columns(pg_db, f"cdc_{pipe.name}") == ("id", "name", "login_count")

    sql(pg_db, "UPDATE users SET login_count = 5000000000, password_hash = 'new' WHERE id <= 5")
    _stream(pipe)
    events = log_read(pipe, "--table", "public.users")
    assert events and all("password_hash" not in json.dumps(e) for e in events)
    assert any((e.get("after") or {}).get("login_count") == 5000000000 for e in events)
    apply_ok(pipe, spark)
    lake = delta_df(spark, pipe, "public.users")
    assert "password_hash" not in lake.columns
    assert {r["id"]: r["login_count"] for r in lake.where("id <= 5").collect()} == {
        i: 5000000000 for i in range(1, 6)
    }
    verified(pipe, spark)
