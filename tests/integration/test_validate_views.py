"""`cdc validate` with derived views (issue 20.1, README "Derived views"): each view is analysed by
sqlglot, its columns resolved by sqlglot against the captured schemas (Spark, on empty tables, only
for a view sqlglot cannot resolve: issue 33 item 6), without reading or changing the source; a line per view says whether it is maintained incrementally or recomputed and why, and a view
that cannot work (a table not captured, a key column it does not output, a column the table does not
have) is a FAIL line with its fix and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.ground import logsetup
from pipelines.validate import run_validate
from sinks.registry import load_pipeline
from tests.fixtures.nojvm import cdc_watched
from tests.harness import sql, write_pipeline

pytestmark = pytest.mark.integration

ORDER_DOCS = {
    "name": "order_docs",
    "sql": "SELECT o.id, o.status, c.name AS customer FROM public.orders o JOIN public.customers c ON c.id = o.customer_id",
    "key": ["id"],
}
REVENUE = {
    "name": "customer_revenue",
    "sql": "SELECT customer_id, count(*) AS orders, sum(total) AS revenue FROM public.orders GROUP BY customer_id",
    "key": ["customer_id"],
}
LATEST = {
    "name": "latest",
    "sql": "SELECT id, total FROM public.orders ORDER BY id DESC LIMIT 10",
    "key": ["id"],
}


def validate(tmp_path: Path, dsn: str, views: list[dict], name: str) -> tuple[int, list[str]]:
    f = write_pipeline(
        tmp_path,
        dsn,
        ["public.orders", "public.customers"],
        name=name,
        views=views,
        sinks=[
            {
                "name": "lake",
                "delta": {"path": str(tmp_path / name / "lake"), "views": [v["name"] for v in views]},
            }
        ],
    )
    with logsetup.collected() as lines:
        code = run_validate(load_pipeline(f))
    return code, lines


def test_validate_views(pg_db: str, tmp_path: Path, spark) -> None:
    sql(
        pg_db,
        "CREATE TABLE customers (id int PRIMARY KEY, name text)",
        "CREATE TABLE orders (id int PRIMARY KEY, customer_id int, total numeric(10,2), status text)",
        "CREATE TABLE audit (id int PRIMARY KEY, what text)",
    )
    code, lines = validate(tmp_path, pg_db, [ORDER_DOCS, REVENUE, LATEST], "good")
    out = "\n".join(lines)
    assert code == 0, out
    assert "ok   view order_docs: incremental (3 columns, key id; sinks: lake)" in out, out
    assert "ok   view customer_revenue: incremental (3 columns, key customer_id; sinks: lake)" in out, out
    assert "ok   view latest: full recomputation each cut: LIMIT/OFFSET" in out, out
    # views sqlglot resolves are checked without Spark: `cdc validate` starts no JVM
    run, jvm, _pyspark = cdc_watched("validate", tmp_path / "good.yml")
    assert run.code == 0 and not jvm, run
    assert "ok   view order_docs: incremental (3 columns, key id; sinks: lake)" in run.out, run.out

    # views that cannot work, each a FAIL line with its fix, next to one that can (still checked):
    # a table the pipeline does not capture (it exists in the source), a key column the view does not
    # output, a column the table does not have (found by Spark on the captured schema)
    uncaptured = dict(ORDER_DOCS, name="audit_docs", sql="SELECT a.id, a.what FROM public.audit a")
    no_key = dict(ORDER_DOCS, key=["order_id"])
    no_column = dict(
        REVENUE,
        name="amounts",
        sql="SELECT customer_id, sum(amount) AS n FROM public.orders GROUP BY customer_id",
    )
    code, lines = validate(tmp_path, pg_db, [uncaptured, no_key, no_column, REVENUE], "bad")
    out = "\n".join(lines)
    assert code == 2, out
    assert "FAIL view audit_docs: it reads public.audit, which the pipeline does not capture" in out, out
    assert "fix: add public.audit to source.postgres.tables" in out, out
    assert (
        "FAIL view order_docs: key column 'order_id' is not a column of the view (it outputs id, status, customer)"
        in out
    ), out
    assert "FAIL view amounts: Spark cannot run its SQL:" in out and "`amount`" in out, out
    assert "_cdc_check_" not in out, out  # Spark's message names the table, not our temp view
    assert "ok   view customer_revenue: incremental" in out, out
    assert "3 problem(s) found; nothing was changed" in out, out
