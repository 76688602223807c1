"""The pure parts of consistent reads at a cut and of `cdc maintain` (sinks/delta/cuts.py,
sinks/delta/conflicts.py): which recorded cut a reader gets, view names, which errors count as a
Delta commit conflict (retried), and that a retry runs the work again until it commits."""

from __future__ import annotations

import datetime as dt

import pytest

from cdc.ground.errors import UsageError
from sinks.delta.conflicts import is_conflict, retry_conflicts
from sinks.delta.cuts import _pick, view_names

pytestmark = pytest.mark.unit

T0 = dt.datetime(2026, 1, 1, 12, 0, 0)


def row(cut_id: int, minutes: int, log_id: str = "a") -> dict:
    return {
        "cut_id": cut_id,
        "lsn": 100 + cut_id,
        "log_id": log_id,
        "versions": {"public.t": cut_id * 2},
        "paths": {"public.t": "public/t"},
        "applied_at": T0 + dt.timedelta(minutes=minutes),
    }


def test_latest_cut_is_the_newest_row_even_when_ids_start_over() -> None:
    rows = [row(7, 0), row(8, 1), row(1, 2, log_id="b")]  # a new log: ids start over
    assert _pick(rows, "/lake", None).cut_id == 1
    assert _pick(rows, "/lake", 8).versions == {"public.t": 16}
    with pytest.raises(UsageError, match="cut 9 is not recorded"):
        _pick(rows, "/lake", 9)
    with pytest.raises(UsageError, match="no cut is recorded"):
        _pick([], "/lake", None)


def test_view_names_follow_the_source_tables() -> None:
    assert view_names(["public.a", "sales.b"]) == {"public.a": "a", "sales.b": "b"}
    assert view_names(["public.o", "sales.o"]) == {"public.o": "public_o", "sales.o": "sales_o"}


def test_conflicts_are_retried_other_errors_are_not() -> None:
    class ConcurrentAppendException(Exception):
        pass

    assert is_conflict(ConcurrentAppendException("Files were added to the root of the table"))
    assert is_conflict(RuntimeError("[DELTA_CONCURRENT_DELETE_READ] ... a concurrent update"))
    assert is_conflict(RuntimeError("[DELTA_METADATA_CHANGED] MetadataChangedException: ..."))
    assert not is_conflict(RuntimeError("[DELTA_MISSING_DELTA_TABLE] not a Delta table"))

    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConcurrentAppendException("conflict")
        return "committed"

    assert retry_conflicts(flaky) == "committed" and len(calls) == 3
    with pytest.raises(ValueError):
        retry_conflicts(lambda: (_ for _ in ()).throw(ValueError("not a conflict")))


def test_sql_and_maintain_refuse_a_sink_that_is_not_delta_or_iceberg(tmp_path) -> None:
    """Exit 2 naming the sink, before Spark starts; an engine that does not read the sink's kind too."""
    from click.testing import CliRunner

    from pipelines.cli import cli

    file = tmp_path / "p.yml"
    file.write_text(
        "name: p\nsource:\n  postgres:\n    dsn: postgresql://x@127.0.0.1:1/x\n    tables: [public.t]\n"
        "sinks:\n  - name: cache\n    redis: {url: 'redis://127.0.0.1:1', tables: [public.t]}\n"
    )
    runner = CliRunner()
    result = runner.invoke(cli, ["maintain", str(file)])
    assert result.exit_code == 2 and "error: pipeline p has no delta or iceberg sink" in result.stderr, (
        result.output
    )
    result = runner.invoke(cli, ["sql", str(file), "--sink", "cache", "SELECT 1"])
    assert (
        result.exit_code == 2
        and "error: sink 'cache' is a redis sink, not a delta or iceberg sink" in result.stderr
    ), result.output
    assert "  fix: name a delta or iceberg sink with --sink" in result.stderr
    result = runner.invoke(cli, ["maintain", str(file), "--sink", "cache"])
    assert result.exit_code == 2 and "cdc maintain looks after Delta and Iceberg followers" in result.stderr
    file.write_text(
        "name: p\nsource:\n  postgres:\n    dsn: postgresql://x@127.0.0.1:1/x\n    tables: [public.t]\n"
        "sinks:\n  - name: ice\n    iceberg: {warehouse: ice}\n"
    )
    result = runner.invoke(cli, ["sql", str(file), "--engine", "datafusion", "SELECT 1"])
    assert result.exit_code == 2 and "--engine datafusion does not read iceberg followers (sink ice)" in (
        result.stderr
    ), result.output
    assert "  fix: --engine polars or --engine spark" in result.stderr
    result = runner.invoke(cli, ["sql", str(file), "SELECT 1"])  # nothing applied yet
    assert result.exit_code == 2 and "no cut is recorded" in result.stderr, result.output


def test_polars_names_every_table_qualified_and_bare() -> None:
    from pipelines.lakesql_polars import polars_names

    names = polars_names(["public.orders", "sales.orders", "public.items"])
    assert names == {
        "public.items": ["public.items", "items"],
        "public.orders": ["public.orders", "public_orders", "orders"],
        "sales.orders": ["sales.orders", "sales_orders"],
    }
