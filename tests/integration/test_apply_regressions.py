"""Apply-path regressions: a new log after teardown, a follower table that went missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pipelines.teardown import run_teardown
from sinks.registry import load_pipeline
from snapshot.runner import run_snapshot
from tests.harness import apply_once, sql, stream_in_process, verify, write_pipeline

pytestmark = pytest.mark.integration


def _pipeline(tmp_path: Path, dsn: str) -> Path:
    return write_pipeline(
        tmp_path, dsn, ["public.t"], name="reg", sinks=[{"name": "lake", "delta": {"path": "lake"}}]
    )


def _snapshot(file: Path) -> None:
    run_snapshot(load_pipeline(file), progress=False)


def test_new_log_after_teardown_is_applied(pg_db: str, tmp_path: Path, spark) -> None:
    """Cut ids start over in a new log; Delta's idempotent writes must not take them for old ones."""
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 6) g",
    )
    file = _pipeline(tmp_path, pg_db)
    _snapshot(file)
    for round_ in range(3):
        sql(pg_db, f"UPDATE t SET v = 'r{round_}' WHERE id = {round_ + 1}")
        stream_in_process(file)
        apply_once(file, spark)
    run_teardown(load_pipeline(file), True)
    sql(pg_db, "INSERT INTO t VALUES (7, 'new')")
    _snapshot(file)
    apply_once(file, spark)
    code, report = verify(file, spark)
    assert code == 0, report


def test_follower_table_moved_away_is_rebuilt(pg_db: str, tmp_path: Path, spark) -> None:
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'a' FROM generate_series(1, 20) g",
    )
    file = _pipeline(tmp_path, pg_db)
    _snapshot(file)
    sql(pg_db, "UPDATE t SET v = 'b' WHERE id <= 5", "DELETE FROM t WHERE id = 20")
    stream_in_process(file)
    apply_once(file, spark)
    shutil.rmtree(tmp_path / "lake" / "public" / "t")
    sql(pg_db, "UPDATE t SET v = 'c' WHERE id = 6")
    stream_in_process(file)
    apply_once(file, spark)
    code, report = verify(file, spark)
    assert code == 0, report


def test_demo_shows_all_three_followers(tmp_path: Path) -> None:
    """`cdc demo` (the README's first command) ends with every follower verified identical and
    prints a search hit and a cache lookup. Run with `--iceberg` (one demo run for both: the flag
    only adds a follower): the Iceberg follower verifies too, pyiceberg reads the row counts the
    demo printed, and the pyiceberg + Polars command it prints runs as printed. It runs with an
    empty cache, as on a new machine (CI's first run): its JVM makes the class archive as it exits
    (pipelines/jvmarchive.py), quietly, and the archive is kept."""
    import os
    import subprocess

    from tests.harness import REPO

    cache = tmp_path / "cache"
    done = subprocess.run(
        [str(REPO / ".venv" / "bin" / "cdc"), "demo", "--iceberg", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=os.environ | {"XDG_CACHE_HOME": str(cache)},
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "verify: all followers identical to the source" in out, out
    for sink in ("lake", "search", "cache", "ice"):
        assert f"sink {sink}: public.customers: identical" in out, out
    assert "hit(s) for 'oak lamp'" in out and "name=oak lamp" in out, out
    assert '"name":"customer 100 jr"' in out and '"bio":"' in out and "(6,400 chars)" in out, out
    assert "Traceback" not in out and "Exception" not in out, out
    assert len(list((cache / "cdc" / "jvm").glob("*.jsa"))) == 1, out  # made at exit, kept
    # The demo's lake opens in delta-rs, no Spark (README "Reading the lake"): every table has the
    # rows the demo counted with Spark, and the Polars command it prints runs as printed.
    from deltalake import DeltaTable

    for table in ("customers", "products", "orders"):
        rows = DeltaTable(str(tmp_path / "demo" / "lake" / "public" / table)).to_pyarrow_table().num_rows
        assert rows > 0 and f"Delta table public.{table}: {rows:,} rows" in out, (table, rows, out)
    (command,) = [line.strip() for line in out.splitlines() if "polars.read_delta(" in line]
    polars_run = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert polars_run.returncode == 0 and "shape:" in polars_run.stdout, polars_run.stdout + polars_run.stderr
    from tests.fixtures.readers import iceberg_catalog

    ice = iceberg_catalog(tmp_path / "demo" / "ice")  # pyiceberg, not the sink's read path
    for table in ("customers", "products", "orders"):
        rows = ice.load_table(f"public.{table}").scan().to_arrow().num_rows
        lake = DeltaTable(str(tmp_path / "demo" / "lake" / "public" / table)).to_pyarrow_table().num_rows
        assert rows == lake and f"Iceberg table public.{table}: {rows:,} rows" in out, (table, rows, out)
    (command,) = [line.strip() for line in out.splitlines() if "SqlCatalog(" in line]
    iceberg_run = subprocess.run(command, shell=True, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert iceberg_run.returncode == 0 and "shape:" in iceberg_run.stdout, (
        iceberg_run.stdout + iceberg_run.stderr
    )
