"""README "Schema changes" rows checked on real PostgreSQL, the local log and an SCD1 Delta
follower read back with plain Spark: `SET/DROP DEFAULT` (no re-base, rows exact), `REPLICA
IDENTITY FULL`, a primary-key change (`DROP CONSTRAINT pkey, ADD PRIMARY KEY (..)`) and `SET
SCHEMA` (followed by OID like a rename once the file names the new schema). `cdc verify` exit 0
after each, no `cdc snapshot` after the first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.capture import no_traceback
from tests.fixtures.lake import LAKE, apply_ok, make_pipe, snapshot, verified
from tests.harness import cdc, flush_wal, sql, write_pipeline

pytestmark = pytest.mark.integration


def delta(spark, path: Path) -> dict:
    return {r["id"]: r["v"] for r in spark.read.format("delta").load(str(path)).select("id", "v").collect()}


def source(dsn: str, table: str) -> dict:
    return dict(sql(dsn, f"SELECT id, v FROM {table}"))


def test_defaults_replica_identity_full_key_change_and_set_schema(pg_db: str, tmp_path: Path, spark) -> None:
    sql(
        pg_db,
        "CREATE TABLE df(id int PRIMARY KEY, v text)",
        "CREATE TABLE ri(id int PRIMARY KEY, v text)",
        "CREATE TABLE pk(id int PRIMARY KEY, code int NOT NULL, v text)",
        "CREATE TABLE mv(id int PRIMARY KEY, v text)",
        *(f"INSERT INTO {t} SELECT g, 'x' || g FROM generate_series(1, 3) g" for t in ("df", "ri", "mv")),
        "INSERT INTO pk SELECT g, g * 10, 'x' || g FROM generate_series(1, 3) g",
        "CREATE SCHEMA other",
    )
    tables = ["public.df", "public.ri", "public.pk", "public.mv"]
    pipe = make_pipe(tmp_path, pg_db, tables, sinks=[LAKE])
    snapshot(pipe)
    apply_ok(pipe, spark)

    def stream() -> tuple[int, str, str]:
        flush_wal(pg_db)
        run = cdc("stream", pipe.file, "--until", "current")
        no_traceback(run)
        return run.code, run.out, run.err

    sql(
        pg_db,
        "ALTER TABLE df ALTER COLUMN v SET DEFAULT 'dflt'",
        "INSERT INTO df(id) VALUES (100)",
        "ALTER TABLE df ALTER COLUMN v DROP DEFAULT",
        "UPDATE df SET v = 'u1' WHERE id = 1",
        "INSERT INTO df(id) VALUES (101)",
        "ALTER TABLE ri REPLICA IDENTITY FULL",
        "UPDATE ri SET v = 'full' WHERE id = 1",
        "DELETE FROM ri WHERE id = 2",
        "UPDATE pk SET v = 'before pk' WHERE id = 1",
        "ALTER TABLE pk DROP CONSTRAINT pk_pkey, ADD PRIMARY KEY (code)",
        "UPDATE pk SET v = 'after pk' WHERE id = 2",
        "UPDATE pk SET id = 33 WHERE code = 30",  # the old key column changes: no longer the key
        "INSERT INTO pk VALUES (100, 1000, 'new')",
        "DELETE FROM pk WHERE code = 10",
    )
    code, out, err = stream()
    assert code == 0 and "re-bas" not in out, f"{code}\n{out}\n{err}"  # a default change rewrites nothing
    apply_ok(pipe, spark)
    lake = tmp_path / "lake"
    for t in ("df", "ri", "pk"):
        assert delta(spark, lake / "public" / t) == source(pg_db, t), t
    assert delta(spark, lake / "public" / "df")[101] is None
    verified(pipe, spark)

    # SET SCHEMA is a rename of the schema part: the same table (OID), followed once the file names it
    sql(
        pg_db,
        "INSERT INTO mv VALUES (10, 'before')",
        "ALTER TABLE mv SET SCHEMA other",
        "INSERT INTO other.mv VALUES (11, 'after')",
    )
    code, out, err = stream()
    assert code == 3 and "table public.mv was renamed to other.mv" in err and "  fix: " in err, (
        f"{code}\n{out}\n{err}"
    )
    write_pipeline(tmp_path, pg_db, ["public.df", "public.ri", "public.pk", "other.mv"], sinks=[LAKE])
    code, out, err = stream()
    assert code == 0 and "follows it under the new name" in out, f"{code}\n{out}\n{err}"
    apply_ok(pipe, spark)
    assert delta(spark, lake / "other" / "mv") == source(pg_db, "other.mv")
    assert delta(spark, lake / "public" / "mv") == {1: "x1", 2: "x2", 3: "x3"}  # kept as it was
    verified(pipe, spark)


def test_replica_identity_using_another_index(pg_db: str, tmp_path: Path) -> None:
    """With REPLICA IDENTITY USING INDEX on a unique index that is not the primary key, PostgreSQL
    sends a deleted row's old values with that index's columns only (no primary key). `cdc validate`
    names it up front; `cdc stream` stops at the delete with a SourceError (exit 3) and the fix,
    not an internal error, and acknowledges nothing past it (a second run stops at the same place)."""
    sql(
        pg_db,
        "CREATE TABLE ri(id int PRIMARY KEY, code int NOT NULL UNIQUE, v text)",
        "INSERT INTO ri SELECT g, g * 10, 'x' || g FROM generate_series(1, 3) g",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.ri"], sinks=[LAKE])
    snapshot(pipe)
    ok = cdc("validate", pipe.file)
    assert ok.code == 0 and "REPLICA IDENTITY" not in ok.out, f"{ok.code}\n{ok.out}\n{ok.err}"
    sql(pg_db, "ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_code_key", "DELETE FROM ri WHERE id = 2")
    flush_wal(pg_db)
    bad = cdc("validate", pipe.file)
    assert bad.code == 3, f"{bad.code}\n{bad.out}\n{bad.err}"
    assert (
        "table public.ri has REPLICA IDENTITY USING INDEX ri_code_key, without the primary key" in bad.out
    ), bad.out
    assert "fix: run ALTER TABLE public.ri REPLICA IDENTITY DEFAULT;" in bad.out, bad.out
    for _ in range(2):  # the second run meets the same delete: nothing was acknowledged past it
        run = cdc("stream", pipe.file, "--until", "current")
        assert run.code == 3, f"{run.code}\n{run.out}\n{run.err}"
        assert (
            "error: table public.ri has REPLICA IDENTITY USING INDEX ri_code_key, without the primary key"
            in run.err
        )
        assert "  fix: run ALTER TABLE public.ri REPLICA IDENTITY DEFAULT (or FULL)" in run.err, run.err
        # the remedy names the pipeline file as given, so it runs as printed
        assert f"`cdc teardown {pipe.file} --drop-slot --yes` and `cdc snapshot {pipe.file}`" in run.err, (
            run.err
        )
        assert "internal error" not in run.out + run.err
        no_traceback(run)
