"""`cdc serve` on a real PostgreSQL with a running `cdc stream`: initial rows, SSE and long-poll,
exact resume (after a disconnect and a server restart), control events, auth, slow clients.
One database, pipeline and stream for the module; servers come and go."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures.capture import Pipe, make_pipe, snapshot, start_stream, stop_stream
from tests.fixtures.serve import OTHER_TOKEN, Server, initial_rows, module_database, sse, start_server
from tests.harness import sql

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pipe(pg, tmp_path_factory) -> Iterator[Pipe]:
    with module_database(pg) as dsn:
        sql(
            dsn,
            "CREATE TABLE items (id int PRIMARY KEY, name text, qty int)",
            "INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, 25) g",
            "CREATE TABLE big (id int PRIMARY KEY, body text)",
        )
        p = make_pipe(tmp_path_factory.mktemp("serve"), dsn, ["public.items", "public.big"])
        snapshot(p)
        proc = start_stream(p)
        try:
            yield p
        finally:
            stop_stream(proc)


@pytest.fixture(scope="module")
def server(pipe: Pipe) -> Iterator[Server]:
    srv = start_server(pipe.file, "--heartbeat", "0.5", "--client-queue", "4", "--ring", "8")
    yield srv
    srv.stop()


def test_initial_rows_paged_then_changes(pipe: Pipe, server: Server) -> None:
    body, rows = initial_rows(server, "public.items", limit=10)
    assert sorted(r["after"]["id"] for r in rows) == list(range(1, 26))
    assert {r["op"] for r in rows} == {"r"} and rows[0]["source"]["table"] == "items"
    position = body["position"]
    sql(pipe.dsn, "BEGIN; UPDATE items SET qty = 100 WHERE id = 1; INSERT INTO items VALUES (26, 'new', 1); COMMIT")
    with sse(server, "public.items", **{"from": position}) as stream:
        ev = stream.until(lambda e: e.event == "change")[-1]
    assert [c["op"] for c in ev.data["changes"]] == ["u", "c"]  # one whole source transaction
    assert int(ev.id) == ev.data["position"] > position
    assert ev.data["changes"][0]["after"] == {"id": 1, "name": "item 1", "qty": 100}


def test_auth_refused(server: Server) -> None:
    assert server.get("/v1/tables/public.items", token=None).status_code == 401
    assert server.get("/v1/tables/public.items", token="wrong-token-0123456789").status_code == 401
    refused = server.get("/v1/tables/public.items", token=OTHER_TOKEN)
    assert refused.status_code == 403 and "may not read" in refused.json()["error"]
    assert httpx.get(server.url + "/v1/tables/public.items/changes?from=0", timeout=10).status_code == 401
    assert server.get("/v1/tables", token=OTHER_TOKEN).json() == {"tables": []}
