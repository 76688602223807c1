"""`cdc validate` and the slot's safety net (issue 34 item 4, README "Slots and WAL retention"):
`max_slot_wal_keep_size = -1` is a warning (exit 0) naming the setting to use and what it means for
the slot; a limit is an ok line saying what happens past it. Real PostgreSQL (the session `pg`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.services import LocalPostgres
from tests.harness import cdc, sql, write_pipeline

pytestmark = pytest.mark.integration


@pytest.fixture
def wal_keep(pg: LocalPostgres) -> Iterator[None]:
    """Whatever a test sets, the server's own setting afterwards."""
    yield
    sql(pg.dsn(), "ALTER SYSTEM RESET max_slot_wal_keep_size", "SELECT pg_reload_conf()")


def test_unlimited_wal_keep_is_a_warning_with_the_setting_to_use(
    pg: LocalPostgres, pg_db: str, tmp_path: Path, wal_keep: None
) -> None:
    sql(pg_db, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    f = write_pipeline(
        tmp_path, pg_db, ["public.t"], name="keep", log={"local": {"path": str(tmp_path / "log")}}
    )
    sql(pg.dsn(), "ALTER SYSTEM SET max_slot_wal_keep_size = -1", "SELECT pg_reload_conf()")
    run = cdc("validate", f)
    assert run.code == 0, run  # a warning, not a failure
    assert (
        "warn max_slot_wal_keep_size = -1 (no limit): while the pipeline is stopped or behind, slot cdc_keep"
        in run.out
    )
    assert (
        "fix: set a limit the WAL disk can spare, e.g. ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'"
        in run.out
    )
    # what the limit means for the slot: invalidated past it, then a new snapshot
    assert "is then invalidated (wal_status lost) instead" in run.out
    assert f"needs a new snapshot (drop the slot, then `cdc snapshot {f}`)" in run.out
    assert "all checks passed" in run.out, run.out

    sql(pg.dsn(), "ALTER SYSTEM SET max_slot_wal_keep_size = '2GB'", "SELECT pg_reload_conf()")
    run = cdc("validate", f)
    assert run.code == 0, run
    assert (
        "ok   max_slot_wal_keep_size = 2GB: a slot that falls more than that behind is invalidated" in run.out
    )
    assert "warn max_slot_wal_keep_size" not in run.out, run.out
