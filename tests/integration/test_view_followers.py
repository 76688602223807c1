"""Followers of derived views through the life of their base tables (issue 20.3/20.4), one scenario,
in-process: every follower kind takes `views.<name>` like a table.

order_docs (orders JOIN customers) is followed by a Delta sink that also follows a table, a tantivy
sink and a Redis sink; customer_revenue (GROUP BY) by a second Redis sink. Each follower is read
back with its own reader (delta-rs, tantivy's searcher, redis-py) and compared with PostgreSQL's own
result of the view's SQL, and `cdc verify` exits 0 after each step:
1. bootstrap;
2. a customer renamed (all its orders' documents change), an order moving to another customer,
   deletes, and a column added to a base table (the views do not select it: unchanged); one sink
   applies the cut, the Delta sink crashes between its write and its checkpoint;
3. the view moves on before the Delta sink comes back: it applies its pending cut with exactly the
   view's rows of that cut, then the newest (inserts, deletes on both sides);
4. a base table truncated (and refilled in the same cut);
5. `cdc snapshot --tables public.customers` (a re-snapshot): recomputed in full, said so;
6. the view's SQL changed in the pipeline file: detected, rebuilt from scratch (a new epoch: the
   followers start it over), said in the output; the new column reaches the followers; a follower
   changed by hand is named by `cdc verify` with the key;
7. a column the view uses dropped at the source: its followers stop with an error naming the view
   and the column; customer_revenue's follower goes on (verify 0 for it).
(ViewBatch's type mapping on its own: tests/unit/test_viewbatch_types.py.)
"""

from __future__ import annotations

import decimal
import json
from pathlib import Path

import pytest
import redis

from pipelines.faults import CrashPointReached
from tests.fixtures.lake import apply, apply_ok, ckpt, make_pipe, snapshot, stream, verified
from tests.fixtures.readers import delta_rows, redis_rows, tantivy_docs
from tests.fixtures.views import assert_view_is_source, pg_view
from tests.harness import edit_pipeline, sql, verify

pytestmark = [pytest.mark.integration]  # the view followers' one end-to-end scenario

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
SINKS = [
    {"name": "lake", "delta": {"path": "lake", "tables": ["public.orders"], "views": ["order_docs"]}},
    {"name": "docs", "search": {"engine": "tantivy", "path": "search", "views": ["order_docs"]}},
    {"name": "cache", "redis": {"url": "", "views": ["order_docs"]}},
    {"name": "revenue", "redis": {"url": "", "views": ["customer_revenue"]}},
]


def views(docs_sql: str = DOCS) -> list[dict]:
    return [
        {"name": "order_docs", "sql": docs_sql, "key": ["id"]},
        {"name": "customer_revenue", "sql": REVENUE, "key": ["customer_id"]},
    ]


def _followers(tmp_path: Path, redis_db: str) -> tuple[dict, dict, dict]:
    """order_docs as delta-rs, tantivy's searcher and redis-py read it: {id: (total, customer)}."""
    lake = delta_rows(None, tmp_path / "lake" / "views" / "order_docs")
    docs = tantivy_docs(tmp_path / "search" / "views" / "order_docs")
    client = redis.Redis.from_url(redis_db, decode_responses=True)
    try:
        cached = redis_rows(client, "views.order_docs:")
    finally:
        client.close()
    return (
        {int(k[0]): (r["total"], r["customer"]) for k, r in lake.items()},
        {int(k): (decimal.Decimal(str(r["total"])), r["customer"]) for k, r in docs.items()},
        {
            int(k.rsplit(":", 1)[1]): (decimal.Decimal(str(r["total"])), r["customer"])
            for k, r in cached.items()
        },
    )


def _source_view(dsn: str) -> dict:
    columns, rows = pg_view(dsn, DOCS, ["id"])
    total, customer = columns.index("total"), columns.index("customer")
    return {int(k[0]): (r[total], r[customer]) for k, r in rows.items()}


def test_view_followers_through_base_table_changes(tmp_path, pg_db, spark, redis_db, monkeypatch):
    sql(pg_db, *SETUP)
    sinks = [{**s, "redis": {**s["redis"], "url": redis_db}} if "redis" in s else s for s in SINKS]
    pipe = make_pipe(tmp_path, pg_db, ["public.customers", "public.orders"], sinks=sinks, views=views())
    docs_sql = DOCS

    def followers_are_source() -> None:
        want = _source_view(pg_db)
        assert _followers(tmp_path, redis_db) == (want, want, want)
        # every column of the Delta follower (delta-rs) is the view's SQL run by PostgreSQL
        assert_view_is_source(
            pg_db, tmp_path / "lake" / "views" / "order_docs", docs_sql, ["id"], spark=spark
        )

    def step(*expect_in_output: str) -> str:
        """Stream, apply every sink, check the output, the followers and `cdc verify` (its report)."""
        stream(pipe)
        runs, lines = apply(pipe, spark)
        out = "\n".join(lines)
        assert not [x for x in runs if x.error], out
        for text in expect_in_output:
            assert text in out, out
        followers_are_source()
        return verified(pipe, spark)

    # 1. bootstrap
    snapshot(pipe)
    apply_ok(pipe, spark)
    assert len(_source_view(pg_db)) == 12
    followers_are_source()

    # 2. a customer renamed, an order moved, an order deleted, a column added to customers; the
    #    search follower applies the cut, the Delta follower dies after writing it (the view's rows
    #    included), before its checkpoint
    sql(
        pg_db,
        "ALTER TABLE customers ADD COLUMN phone text",
        "UPDATE customers SET name = 'renamed', phone = '555' WHERE id = 1",
        "UPDATE orders SET customer_id = 3 WHERE id = 2",
        "DELETE FROM orders WHERE id = 3",
    )
    stream(pipe)
    apply_ok(pipe, spark, "docs")  # the view stage (its own base follower) and one follower at this cut
    monkeypatch.setenv("CDC_FAULT", "apply:after-merge")
    monkeypatch.setenv("CDC_FAULT_RAISE", "1")
    with pytest.raises(CrashPointReached):
        apply(pipe, spark, "lake")
    monkeypatch.delenv("CDC_FAULT")
    epoch, version, _lsn = ckpt(pipe)["pending"]["views"]["order_docs"]  # the view's rows of this cut

    # 3. the view moves on before the Delta follower comes back: it applies its pending cut with
    #    exactly the view's rows of that cut, then the newest cut (the changes in between not skipped)
    sql(pg_db, "INSERT INTO orders VALUES (20, 2, 'new', 99.99)", "DELETE FROM customers WHERE id = 5")
    report = step()
    done = ckpt(pipe)
    assert done["pending"] is None and done["tables"]["views.order_docs"][0] == epoch
    assert done["tables"]["views.order_docs"][1] > version
    want = _source_view(pg_db)
    assert want[5][1] == "renamed" and 3 not in want and 20 in want
    for sink in ("lake", "docs", "cache"):
        assert f"sink {sink}: views.order_docs: identical: source {len(want)} rows" in report, report
    assert "sink lake: public.orders: identical" in report
    assert "sink revenue: views.customer_revenue: identical" in report

    # 4. truncate of a base table (refilled in the same cut): the views follow it
    sql(
        pg_db,
        "TRUNCATE orders",
        "INSERT INTO orders SELECT g, 1 + g % 3, 'paid', g FROM generate_series(20, 26) g",
    )
    step()

    # 5. a base table re-snapshotted (cdc snapshot --tables)
    sql(pg_db, "UPDATE customers SET name = 'renamed again' WHERE id = 1")
    snapshot(pipe, ["public.customers"])
    step("base table public.customers has a new base in the log (re-snapshotted)")

    # 6. the view's SQL changed in the file: rebuilt from scratch (a new epoch), said so
    docs_sql = DOCS.replace("c.email", "c.email, c.phone")
    edit_pipeline(pipe.file, lambda doc: doc.update(views=views(docs_sql)))
    step("view order_docs: cut", "its SQL or key changed in the pipeline file: rebuilt from scratch")
    assert ckpt(pipe)["tables"]["views.order_docs"][0] == epoch + 1
    # a follower changed behind the tool's back: verify names the view and the key
    client = redis.Redis.from_url(redis_db)
    try:
        key = sorted(client.scan_iter(match="views.order_docs:*"))[0].decode()
        value = json.loads(client.get(key))
        client.set(key, json.dumps({**value, "customer": "changed by hand"}))
    finally:
        client.close()
    code, report = verify(pipe.file, spark, "cache")
    assert code == 1, report
    changed_id = key.rsplit(":", 1)[1]
    assert "views.order_docs: DIFFERENT" in report and f"different: id={changed_id}" in report, report

    # 7. a column the view uses dropped: order_docs' followers stop naming the view and the column,
    #    customer_revenue's follower goes on (the log learns of the drop from the next change of a
    #    customers row: pgoutput sends the table's new shape with it)
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
    assert set(failed) == {"lake", "docs", "cache"}, out
    for error in failed.values():
        assert (
            "view order_docs: column email it uses is not in the captured tables any more" in error.problem
        ), out
    verified(pipe, spark, "revenue")
