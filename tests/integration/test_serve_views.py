"""`cdc serve` of a derived view (issue 40): its rows at the latest cut, then each later cut's changes
from the out table's change data feed (delta-rs in the server, no JVM), resumed by Last-Event-ID.
Two Spark runs of the view stage (`cdc apply --once` in-process): the first cut, then one after
source writes. The oracle is the view's SQL run by PostgreSQL over the source (tests/fixtures/views.py).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx
import pytest

from tests.fixtures.lake import apply_ok, make_pipe, snapshot, stream
from tests.fixtures.serve import OTHER_TOKEN, TOKEN, Server, start_server
from tests.fixtures.views import norm, pg_view
from tests.harness import sql

pytestmark = pytest.mark.integration

SETUP = (
    "CREATE TABLE customers(id int PRIMARY KEY, name text NOT NULL)",
    "CREATE TABLE orders(id int PRIMARY KEY, customer_id int NOT NULL, total numeric(10,2))",
    "INSERT INTO customers SELECT g, 'c' || g FROM generate_series(1, 4) g",
    "INSERT INTO orders SELECT g, 1 + g % 4, g * 2.50 FROM generate_series(1, 12) g",
)
DOCS = "SELECT o.id, o.total, c.name AS customer FROM public.orders o JOIN public.customers c ON c.id = o.customer_id"
WRITES = (
    "UPDATE customers SET name = 'renamed' WHERE id = 2",  # orders 1, 5, 9: updated
    "DELETE FROM orders WHERE id = 3",
    "INSERT INTO orders VALUES (13, 4, 99.99)",
)


def _source(dsn: str) -> dict[int, tuple]:
    columns, rows = pg_view(dsn, DOCS, ["id"])
    return {
        int(k[0]): tuple(r[columns.index(c)] for c in ("id", "total", "customer")) for k, r in rows.items()
    }


def _row(doc: dict[str, Any] | None) -> tuple | None:
    """A view row of the feed as PostgreSQL's tuple: numeric comes as its exact text."""
    if doc is None:
        return None
    return (doc["id"], norm(Decimal(doc["total"])), doc["customer"])


def _sse(server: Server, path: str, **headers: str) -> tuple[httpx.Client, Any]:
    client = httpx.Client(timeout=30)
    req = client.build_request(
        "GET", server.url + path, headers={"Authorization": f"Bearer {TOKEN}", **headers}
    )
    return client, client.send(req, stream=True)


def _events(resp: httpx.Response, until: str) -> list[tuple[str, str | None, dict]]:
    """(event, id, data) up to and including the first event of kind `until`."""
    import orjson

    got, kind, ident, data = [], "message", None, []
    for line in resp.iter_lines():
        if line == "":
            if data:
                got.append((kind, ident, orjson.loads("\n".join(data))))
                if kind == until:
                    return got
            kind, ident, data = "message", None, []
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("id:"):
            ident = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    raise AssertionError(f"the stream ended before a {until} event: {got}")


def test_a_derived_view_served_rows_then_cuts_resumed(tmp_path, pg_db, spark) -> None:
    sql(pg_db, *SETUP)
    pipe = make_pipe(
        tmp_path,
        pg_db,
        ["public.customers", "public.orders"],
        sinks=[{"name": "lake", "delta": {"path": "lake", "views": ["order_docs"]}}],
        views=[{"name": "order_docs", "sql": DOCS, "key": ["id"]}],
    )
    snapshot(pipe)
    apply_ok(pipe, spark)  # the view's first cut
    server = start_server(pipe.file, "--heartbeat", "0.5", "--poll", "0.05")
    try:
        assert (
            server.get("/v1/views/order_docs", token=OTHER_TOKEN).status_code == 403
        )  # its list lacks views.order_docs
        assert server.get("/v1/views/nope").status_code == 404
        listed = server.get("/v1/views").json()["views"]
        first = server.get("/v1/views/order_docs", limit=5)
        assert first.status_code == 200, first.text
        body = first.json()
        assert listed == [{"name": "order_docs", "position": body["position"], "cut": body["cut"]["id"]}]
        rows, nxt = list(body["rows"]), body["next"]
        while nxt:  # paged at the same version
            page = httpx.get(
                server.url + nxt, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
            ).json()
            assert page["position"] == body["position"]
            rows, nxt = rows + page["rows"], page["next"]
        before = _source(pg_db)
        assert {r["after"]["id"]: _row(r["after"]) for r in rows} == before and len(rows) == 12
        assert {r["op"] for r in rows} == {"r"}

        # a client follows from the initial rows' position while the source changes and the view moves on
        client, resp = _sse(server, f"/v1/views/order_docs/changes?from={body['position']}")
        assert resp.status_code == 200 and resp.headers["x-cdc-client"].startswith("c")
        sql(pg_db, *WRITES)
        stream(pipe)
        apply_ok(pipe, spark)  # the second cut
        after = _source(pg_db)
        got = _events(resp, "change")
        resp.close()
        client.close()
        (_, ident, ev) = got[-1]
        assert [k for k, _, _ in got[:-1]] == ["heartbeat"] * (len(got) - 1)
        want = {
            k: ("c" if k not in before else "d" if k not in after else "u", before.get(k), after.get(k))
            for k in set(before) | set(after)
            if before.get(k) != after.get(k)
        }
        assert {
            c["after"]["id"] if c["after"] else c["before"]["id"]: (
                c["op"],
                _row(c["before"]),
                _row(c["after"]),
            )
            for c in ev["changes"]
        } == want
        assert sorted(want) == [1, 3, 5, 9, 13]  # the cut as one event: three updates, a delete, an insert
        assert ident == ev["position"] and ev["cut"] > body["cut"]["id"]
        tid, version = ident.split("-")
        assert tid == body["position"].split("-")[0] and int(version) > int(body["position"].split("-")[1])
        assert server.get("/v1/views/order_docs").json()["position"] == ident  # the rows now at that cut

        # resume: from the initial position the same cut again; from its id nothing twice, a heartbeat
        client, resp = _sse(
            server, "/v1/views/order_docs/changes?from=0badc0de-0", **{"Last-Event-ID": body["position"]}
        )
        again = _events(resp, "change")
        resp.close()
        client.close()
        assert again[-1][1] == ident and again[-1][2] == ev
        client, resp = _sse(server, "/v1/views/order_docs/changes", **{"Last-Event-ID": ident})
        beat = _events(resp, "heartbeat")
        resp.close()
        client.close()
        assert [(k, i) for k, i, _ in beat] == [("heartbeat", ident)]
        answer = server.get("/v1/views/order_docs/poll", **{"from": body["position"], "timeout": 1}).json()
        assert [e["id"] for e in answer["events"]] == [ident] and answer["position"] == ident
        # a position of another out table (the view rebuilt): must refetch
        client, resp = _sse(server, "/v1/views/order_docs/changes?from=0badc0de-1")
        control = _events(resp, "control")[-1]
        resp.close()
        client.close()
        assert control[2]["control"] == "must-refetch" and control[2]["reason"] == "rebuilt"
    finally:
        server.stop()
