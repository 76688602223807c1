"""Followers of derived views (issue 20.3/20.4): every follower kind takes `views.<name>` like a table.

A join view through the apply job into a Delta, a tantivy and a Redis follower, through cuts of
changes on both sides and a follower crash between its write and its checkpoint; read back with
delta-rs, tantivy's searcher and redis-py, `cdc verify` 0, and a row changed by hand in a follower
named by verify. (ViewBatch's type mapping on its own: tests/unit/test_viewbatch_types.py.)
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
from tests.fixtures.views import pg_view
from tests.harness import sql, verify

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # four applies and three verifies of three followers

# ---- a join view through the apply job, followed by every kind, checked by `cdc verify` ----------
SETUP = (
    "CREATE TABLE customers(id int PRIMARY KEY, name text NOT NULL)",
    "CREATE TABLE orders(id int PRIMARY KEY, customer_id int NOT NULL, total numeric(10,2))",
    "INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 5) g",
    "INSERT INTO orders SELECT g, 1 + g % 5, g * 2.50 FROM generate_series(1, 12) g",
)
DOCS = (
    "SELECT o.id, o.total, c.name AS customer"
    " FROM public.orders o JOIN public.customers c ON c.id = o.customer_id"
)


def _followers(tmp_path: Path, redis_db: str) -> tuple[dict, dict, dict]:
    """The view as delta-rs, tantivy's searcher and redis-py read it: {id: (total, customer)}."""
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
    _cols, rows = pg_view(dsn, DOCS, ["id"])
    return {int(k[0]): (r[1], r[2]) for k, r in rows.items()}


def test_join_view_in_delta_search_and_redis_followers(tmp_path, pg_db, spark, redis_db, monkeypatch):
    """order_docs (orders JOIN customers) followed by a Delta sink that also follows a table, a tantivy
    sink and a Redis sink: bootstrap, then cuts with a customer renamed (all its orders change), an
    order moving to another customer, deletes on both sides and an insert, the Delta follower
    crashing between its write and its checkpoint while the view moves on; each follower equals
    PostgreSQL's own result of the SQL (read with delta-rs, tantivy, redis-py) and `cdc verify` says
    identical; a follower changed by hand is named by its key."""
    sql(pg_db, *SETUP)
    sinks = [
        {"name": "lake", "delta": {"path": "lake", "tables": ["public.orders"], "views": ["order_docs"]}},
        {"name": "docs", "search": {"engine": "tantivy", "path": "search", "views": ["order_docs"]}},
        {"name": "cache", "redis": {"url": redis_db, "views": ["order_docs"]}},
    ]
    views = [{"name": "order_docs", "sql": DOCS, "key": ["id"]}]
    pipe = make_pipe(tmp_path, pg_db, ["public.customers", "public.orders"], sinks=sinks, views=views)
    snapshot(pipe)
    apply_ok(pipe, spark)
    want = _source_view(pg_db)
    assert len(want) == 12
    assert _followers(tmp_path, redis_db) == (want, want, want)

    sql(
        pg_db,
        "UPDATE customers SET name = 'renamed' WHERE id = 1",
        "UPDATE orders SET customer_id = 3 WHERE id = 2",
        "DELETE FROM orders WHERE id = 3",
    )
    stream(pipe)
    apply_ok(pipe, spark, "docs")  # the view stage (its own base follower) and one follower at this cut
    # the Delta follower dies after writing this cut (the view's rows included), before its checkpoint
    monkeypatch.setenv("CDC_FAULT", "apply:after-merge")
    monkeypatch.setenv("CDC_FAULT_RAISE", "1")
    with pytest.raises(CrashPointReached):
        apply(pipe, spark, "lake")
    monkeypatch.delenv("CDC_FAULT")
    epoch, version, _lsn = ckpt(pipe)["pending"]["views"]["order_docs"]  # the view's rows of this cut
    # the view moves on before the follower comes back: it applies its pending cut with exactly the
    # view's rows of that cut, then the newest cut (the view's changes in between are not skipped)
    sql(pg_db, "INSERT INTO orders VALUES (20, 2, 99.99)", "DELETE FROM customers WHERE id = 5")
    stream(pipe)
    apply_ok(pipe, spark)
    done = ckpt(pipe)
    assert done["pending"] is None and done["tables"]["views.order_docs"][0] == epoch
    assert done["tables"]["views.order_docs"][1] > version
    want = _source_view(pg_db)
    assert sorted(want) != list(range(1, 13)) and want[5][1] == "renamed"
    assert _followers(tmp_path, redis_db) == (want, want, want)
    report = verified(pipe, spark)
    for sink in ("lake", "docs", "cache"):
        assert f"sink {sink}: views.order_docs: identical: source {len(want)} rows" in report, report
    assert "sink lake: public.orders: identical" in report

    # a follower changed behind the tool's back: verify names the view and the key
    client = redis.Redis.from_url(redis_db)
    try:
        key = "views.order_docs:5"
        value = json.loads(client.get(key))
        client.set(key, json.dumps({**value, "customer": "changed by hand"}))
    finally:
        client.close()
    code, report = verify(pipe.file, spark, "cache")
    assert code == 1, report
    assert "views.order_docs: DIFFERENT" in report and "different: id=5" in report, report
