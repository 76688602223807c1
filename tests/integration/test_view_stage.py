"""The view stage (issue 20.2): a join view and an aggregate view kept in their out tables
(`<state_dir>/views/out/<view>`) cut by cut, incrementally, from the internal base follower.

After each cut the out table (read with delta-rs) equals the view's SQL run by PostgreSQL over the
source rows; the apply output says how each view was maintained; a crash between the out table's
write and the view's state file re-applies exactly that cut (Delta skips the MERGE it holds).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.views.state import base_path, out_path, view_state
from tests.fixtures.lake import apply, make_pipe, snapshot, state_dir, stream, txn_commits
from tests.fixtures.views import assert_view_is_source
from tests.harness import apply_crashing, sql

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
]  # ~4 min of CPU alone (5 applies, each a base follower + 2 views + a view follower)

SETUP = (
    "CREATE TABLE customers(id int PRIMARY KEY, name text NOT NULL, email text)",
    "CREATE TABLE orders(id int PRIMARY KEY, customer_id int NOT NULL, status text, total numeric(10,2))",
    "INSERT INTO customers SELECT g, 'c' || g, 'c' || g || '@x' FROM generate_series(1, 6) g",
    "INSERT INTO orders SELECT g, 1 + g % 5, 'new', g * 1.50 FROM generate_series(1, 20) g",
)
DOCS = (
    "SELECT o.id, o.status, o.total, c.name AS customer, c.email "
    "FROM public.orders o JOIN public.customers c ON c.id = o.customer_id"
)
REVENUE = (
    "SELECT customer_id, count(*) AS orders, sum(total) AS revenue, max(total) AS biggest "
    "FROM public.orders WHERE status <> 'void' GROUP BY customer_id"
)
VIEWS = [
    {"name": "order_docs", "sql": DOCS, "key": ["id"]},
    {"name": "customer_revenue", "sql": REVENUE, "key": ["customer_id"]},
]
# the stage runs for views a selected sink follows
SINKS = [{"name": "docs", "delta": {"path": "docs", "views": ["order_docs", "customer_revenue"]}}]


def check(pipe, pg_db: str, spark) -> None:
    state = state_dir(pipe)
    assert_view_is_source(pg_db, out_path(state, "order_docs"), DOCS, ["id"], "order_docs", spark)
    assert_view_is_source(
        pg_db, out_path(state, "customer_revenue"), REVENUE, ["customer_id"], "revenue", spark
    )


def cut(pipe, spark, *statements: str, dsn: str) -> list[str]:
    sql(dsn, *statements)
    stream(pipe)
    runs, lines = apply(pipe, spark)
    assert all(r.error is None for r in runs), "\n".join(lines)
    return [line for line in lines if line.startswith("view ")]


def test_join_and_aggregate_views_are_maintained_cut_by_cut(
    pg_db: str, tmp_path: Path, spark, monkeypatch
) -> None:
    sql(pg_db, *SETUP)
    pipe = make_pipe(tmp_path, pg_db, ["public.customers", "public.orders"], SINKS, views=VIEWS)
    snapshot(pipe)
    runs, lines = apply(pipe, spark)
    assert all(r.error is None for r in runs), "\n".join(lines)
    said = [line for line in lines if line.startswith("view ")]
    first_build = "(full recomputation: first build; new epoch 1: its followers start it over)"
    assert said == [
        f"view order_docs: cut {cut_of(pipe)}: +20 ~0 -0 {first_build}",
        f"view customer_revenue: cut {cut_of(pipe)}: +5 ~0 -0 {first_build}",
    ], said
    check(pipe, pg_db, spark)
    state = state_dir(pipe)
    # the base state: an internal Delta follower of both tables, with Change Data Feed, no user sink
    for table in ("customers", "orders"):
        assert (base_path(state) / "public" / table / "_delta_log").is_dir()
    first = view_state(pipe_pipeline(pipe), "order_docs")
    assert first is not None and first.epoch == 1 and first.key == ["id"] and first.error is None
    assert [c[0] for c in first.columns] == ["id", "status", "total", "customer", "email"]
    assert oct((state / "views" / "order_docs.json").stat().st_mode & 0o777) == "0o600"

    # One cut changes both sides: inserts, updates, deletes; an order moves to another customer
    # (5 -> 7); a customer is renamed (all of its orders' documents change); a customer is deleted
    # with its orders; a customer without orders is renamed (no view row depends on it).
    said = cut(
        pipe,
        spark,
        "INSERT INTO customers VALUES (7, 'c7', NULL), (8, 'c8', 'e8')",
        "INSERT INTO orders VALUES (21, 7, 'new', 9.99), (22, 6, 'new', 1.00)",
        "UPDATE orders SET status = 'paid' WHERE id IN (2, 3)",
        "UPDATE orders SET customer_id = 7 WHERE id = 4",
        "DELETE FROM orders WHERE id = 5",
        "UPDATE orders SET status = 'void' WHERE id = 10",  # leaves the revenue view's filter
        "UPDATE customers SET name = 'renamed', email = 'r@x' WHERE id = 2",  # its orders 1, 6, 11, 16
        "DELETE FROM orders WHERE customer_id = 3",  # orders 2, 7, 12, 17
        "DELETE FROM customers WHERE id = 3",
        "UPDATE customers SET name = 'nobody' WHERE id = 8",
        dsn=pg_db,
    )
    assert said == [
        # +21 +22; ~3 (paid) ~4 (moved) ~10 (void) ~1 ~6 ~11 ~16 (renamed); -5 -2 -7 -12 -17
        f"view order_docs: cut {cut_of(pipe)}: +2 ~7 -5 (incremental)",
        # groups 6 and 7 new; 1 and 5 lose orders; 3 gone; 4 recomputed, unchanged (not rewritten)
        f"view customer_revenue: cut {cut_of(pipe)}: +2 ~2 -1 (incremental)",
    ], said
    check(pipe, pg_db, spark)

    # A crash between the out table's MERGE and the view's state file: the next run maintains
    # exactly that cut again and Delta skips the MERGE it already holds.
    before = view_state(pipe_pipeline(pipe), "order_docs")
    assert before is not None
    sql(
        pg_db,
        "UPDATE orders SET total = total + 1 WHERE id IN (1, 6)",
        "INSERT INTO orders VALUES (23, 1, 'new', 3)",
    )
    stream(pipe)
    apply_crashing(pipe.file, spark, "views:after-merge")  # CDC_FAULT, raised in-process
    crashed = json.loads((state_dir(pipe) / "views" / "order_docs.json").read_text())
    crashed_cut = cut_of(pipe)  # the base follower applied it before the view crashed
    assert crashed["cut_id"] == before.cut_id and crashed["pending"]["cut_id"] == crashed_cut > before.cut_id
    out = out_path(state_dir(pipe), "order_docs")
    app_id = f"cdc-view:{pipe.name}:order_docs"
    assert len(txn_commits(out, app_id, crashed_cut)) == 1  # the MERGE is in the out table
    runs, lines = apply(pipe, spark)  # the same cut (nothing streamed since)
    assert all(r.error is None for r in runs), "\n".join(lines)
    assert f"view order_docs: cut {crashed_cut}: already applied (incremental)" in lines, lines
    assert len(txn_commits(out, app_id, crashed_cut)) == 1  # not written twice
    after = view_state(pipe_pipeline(pipe), "order_docs")
    assert after is not None and after.cut_id == crashed_cut and after.pending is None
    assert after.version == before.version + 1 and after.epoch == before.epoch
    check(pipe, pg_db, spark)


def cut_of(pipe) -> int:
    """The cut the base follower applied last."""
    return json.loads((state_dir(pipe) / "checkpoints" / "_views.json").read_text())["cut_id"]


def pipe_pipeline(pipe):
    from cdc.ground.config import load_pipeline

    return load_pipeline(pipe.file)
