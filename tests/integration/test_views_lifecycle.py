"""Derived views through the life of their base tables (issue 20.3/20.5), one scenario, in-process.

Two views over orders/customers, each followed by its own sink (order_docs by a Delta follower,
customer_revenue by a Redis follower); `cdc verify` exits 0 after every step where it applies:
1. bootstrap;
2. a column added to a base table (the views do not select it: unchanged);
3. a base table truncated (and refilled in the same cut): both views follow it;
4. `cdc snapshot --tables public.customers` (a re-snapshot of a base table): recomputed in full;
5. the view's SQL changed in the pipeline file: detected, rebuilt from scratch (a new epoch: its
   follower starts it over), said in the output; the new column reaches the follower;
6. a column the view uses dropped at the source: that view's follower stops with an error naming
   the view and the column; the other view's follower goes on (verify 0 for it).
"""

from __future__ import annotations

import pytest
import yaml

from tests.fixtures.lake import apply, make_pipe, snapshot, stream, verified
from tests.fixtures.views import assert_view_is_source
from tests.harness import sql

pytestmark = pytest.mark.integration

SETUP = (
    "CREATE TABLE customers(id int PRIMARY KEY, name text NOT NULL, email text)",
    "CREATE TABLE orders(id int PRIMARY KEY, customer_id int NOT NULL, status text, total numeric(10,2))",
    "INSERT INTO customers SELECT g, 'c' || g, 'c' || g || '@example.com' FROM generate_series(1, 5) g",
    "INSERT INTO orders SELECT g, 1 + g % 5, 'new', g * 2.50 FROM generate_series(1, 12) g",
)
DOCS = (
    "SELECT o.id, o.status, o.total, c.name AS customer, c.email"
    " FROM public.orders o JOIN public.customers c ON c.id = o.customer_id"
)
REVENUE = (
    "SELECT customer_id, count(*) AS orders, sum(total) AS revenue FROM public.orders GROUP BY customer_id"
)


def views(docs_sql: str = DOCS) -> list[dict]:
    return [
        {"name": "order_docs", "sql": docs_sql, "key": ["id"]},
        {"name": "customer_revenue", "sql": REVENUE, "key": ["customer_id"]},
    ]


def test_views_through_base_table_changes(tmp_path, pg_db, spark, redis_db):
    sql(pg_db, *SETUP)
    sinks = [
        {"name": "lake", "delta": {"path": "lake", "views": ["order_docs"]}},
        {"name": "cache", "redis": {"url": redis_db, "views": ["customer_revenue"]}},
    ]
    pipe = make_pipe(tmp_path, pg_db, ["public.customers", "public.orders"], sinks=sinks, views=views())

    docs_sql = DOCS

    def step(*expect_in_output: str) -> str:
        stream(pipe)
        runs, lines = apply(pipe, spark)
        out = "\n".join(lines)
        assert not [x for x in runs if x.error], out
        for text in expect_in_output:
            assert text in out, out
        verified(pipe, spark)
        # the Delta follower of order_docs, read with delta-rs, is the view's SQL run by PostgreSQL
        assert_view_is_source(
            pg_db, pipe.dir / "lake" / "views" / "order_docs", docs_sql, ["id"], spark=spark
        )
        return out

    # 1. bootstrap
    snapshot(pipe)
    step()

    # 2. a column added to a base table: the views do not select it
    sql(
        pg_db,
        "ALTER TABLE customers ADD COLUMN phone text",
        "UPDATE customers SET phone = '555', name = name || '!' WHERE id = 2",
    )
    step()

    # 3. truncate of a base table (refilled in the same cut): both views follow it
    sql(
        pg_db,
        "TRUNCATE orders",
        "INSERT INTO orders SELECT g, 1 + g % 3, 'paid', g FROM generate_series(20, 26) g",
    )
    step()

    # 4. a base table re-snapshotted (cdc snapshot --tables)
    sql(pg_db, "UPDATE customers SET name = 'renamed' WHERE id = 1")
    snapshot(pipe, ["public.customers"])
    step("base table public.customers has a new base in the log (re-snapshotted)")

    # 5. the view's SQL changed in the file: rebuilt from scratch, said so
    docs_sql = DOCS.replace("c.email", "c.email, c.phone")
    doc = yaml.safe_load(pipe.file.read_text())
    doc["views"] = views(docs_sql)
    pipe.file.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = step("view order_docs: cut", "its SQL or key changed in the pipeline file: rebuilt from scratch")

    # 6. a column the view uses dropped: order_docs' follower stops naming the view and the column,
    #    customer_revenue's follower goes on
    # (the log learns of the drop from the next change of a customers row: pgoutput sends the table's
    # new shape with it)
    sql(
        pg_db,
        "ALTER TABLE customers DROP COLUMN email",
        "UPDATE customers SET name = name || '.' WHERE id = 2",
        "INSERT INTO orders VALUES (99, 2, 'new', 1.00)",
    )
    stream(pipe)
    runs, lines = apply(pipe, spark)
    out = "\n".join(lines)
    failed = {x.sink: x.error for x in runs if x.error}
    assert set(failed) == {"lake"}, out
    assert (
        "view order_docs: column email it uses is not in the captured tables any more"
        in failed["lake"].problem
    ), out
    verified(pipe, spark, "cache")
