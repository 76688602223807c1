"""`cdc serve` on a real PostgreSQL with a running `cdc stream`: initial rows, SSE and long-poll,
exact resume (after a disconnect and a server restart), control events, auth, slow clients.
One database, pipeline and stream for the module; servers come and go."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from pipelines.devservices.certs import issue, make_ca
from tests.fixtures.browser import chromium
from tests.fixtures.capture import Pipe, make_pipe, snapshot, start_stream, stop_stream
from tests.fixtures.serve import OTHER_TOKEN, TOKEN, Server, initial_rows, module_database, sse, start_server
from tests.harness import cdc, cdc_here, sql, write_pipeline

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
    srv = start_server(pipe.file, "--heartbeat", "0.5", "--client-queue", "4", "--ring", "8", "--example")
    yield srv
    srv.stop()


def test_initial_rows_paged_then_changes(pipe: Pipe, server: Server) -> None:
    body, rows = initial_rows(server, "public.items", limit=10)
    assert sorted(r["after"]["id"] for r in rows) == list(range(1, 26))
    assert {r["op"] for r in rows} == {"r"} and rows[0]["source"]["table"] == "items"
    position = body["position"]
    sql(
        pipe.dsn,
        "BEGIN; UPDATE items SET qty = 100 WHERE id = 1; INSERT INTO items VALUES (26, 'new', 1); COMMIT",
    )
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
    assert (
        server.get("/v1/views/order_docs").status_code == 404
    )  # no view in this pipeline (tests/integration/test_serve_views.py)


@pytest.mark.parametrize(
    ("route", "name", "value"),
    [("", "cut", "latest"), ("", "page", "two"), ("", "limit", ""), ("/changes", "from", "abc")],
)
def test_a_parameter_that_is_not_a_number_is_a_400_naming_it(
    server: Server, route: str, name: str, value: str
) -> None:
    refused = server.get("/v1/tables/public.items" + route, **{name: value})
    assert refused.status_code == 400, (refused.status_code, refused.text)
    assert refused.json()["error"].startswith("bad parameter: ") and "cut" in refused.json()["fix"]


def _insert_txns(dsn: str, first: int, count: int) -> None:
    sql(dsn, *[f"INSERT INTO items VALUES ({i}, 'n{i}', {i})" for i in range(first, first + count)])


def _ids(events) -> list[int]:
    return [c["after"]["id"] for e in events if e.event == "change" for c in e.data["changes"]]


def test_filters_and_long_poll(pipe: Pipe, server: Server) -> None:
    body, rows = initial_rows(server, "public.items", where="qty>=20")
    assert sorted(r["after"]["id"] for r in rows) == [1, 20, 21, 22, 23, 24, 25]  # id 1 has qty 100
    position = body["position"]
    sql(pipe.dsn, "INSERT INTO items VALUES (100, 'a', 5)", "INSERT INTO items VALUES (101, 'b', 50)")
    got = []
    while len(got) < 1:  # long-poll until the matching transaction comes
        answer = server.get(
            "/v1/tables/public.items/poll", **{"from": position, "timeout": 10, "where": "qty>=20"}
        ).json()
        assert answer["control"] is None
        got += answer["events"]
        position = answer["position"]
    assert [c["after"]["id"] for e in got for c in e["data"]["changes"]] == [101]
    with sse(server, "public.items", key="100", **{"from": body["position"]}) as stream:
        assert _ids(stream.until(lambda e: e.event == "change")) == [100]


def test_resume_after_disconnect_and_server_restart(pipe: Pipe, server: Server) -> None:
    body, _ = initial_rows(server, "public.items")
    start = body["position"]
    _insert_txns(pipe.dsn, 200, 5)
    with sse(server, "public.items", **{"from": start}) as stream:
        first = stream.until(lambda e: e.event == "change" and 202 in _ids([e]))
    assert _ids(first) == [200, 201, 202]
    last_id = first[-1].id
    _insert_txns(pipe.dsn, 205, 3)
    with sse(server, "public.items", last_event_id=last_id) as stream:  # a browser's reconnect
        second = stream.until(lambda e: e.event == "change" and 207 in _ids([e]))
    assert _ids(second) == [203, 204, 205, 206, 207]  # no gap, no double
    # a new server (its ring empty): the same position resumes from the log; then 20 more transactions
    # than the ring holds (8) are read from the log by the client's own request
    other = start_server(pipe.file, "--heartbeat", "0.5", "--ring", "8")
    try:
        _insert_txns(pipe.dsn, 208, 20)
        with sse(other, "public.items", last_event_id=last_id) as stream:
            third = stream.until(lambda e: e.event == "change" and 227 in _ids([e]))
        assert _ids(third) == list(range(203, 228))
        ids = [int(e.id) for e in third if e.event == "change"]
        assert ids == sorted(set(ids))
        with sse(other, "public.items", **{"from": start}) as stream:
            beat = stream.until(lambda e: e.event == "heartbeat")
        assert _ids(beat) == list(range(200, 228)) and int(beat[-1].id) == ids[-1]
    finally:
        other.stop()


def test_slow_client_cut_off_with_its_position(pipe: Pipe, server: Server) -> None:
    body, _ = initial_rows(server, "public.big")
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(
        f"GET /v1/tables/public.big/changes?from={body['position']} HTTP/1.0\r\nHost: x\r\n"
        f"Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    time.sleep(0.5)  # subscribed; now it reads nothing while 40 transactions of 200 kB arrive (queue: 4)
    sql(pipe.dsn, *[f"INSERT INTO big VALUES ({i}, repeat(md5('{i}'), 6250))" for i in range(40)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(
            s["table"] == "public.big"
            for s in server.get("/v1/tables").json()["tables"]
            if s["position"] > body["position"]
        ):
            break
        time.sleep(0.2)
    time.sleep(2)
    data = b""
    sock.settimeout(30)
    while b"event: control" not in data or b"\n\n" not in data.split(b"event: control")[1].replace(
        b"\r\n", b"\n"
    ):
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    sock.close()
    text = data.decode(errors="replace")
    assert "event: control" in text, text[-500:]
    control = text.split("event: control", 1)[1]
    assert '"reason":"slow-client"' in control
    before = text.split("event: control")[0].splitlines()
    offsets = [int(line.split(":", 1)[1]) for line in before if line.startswith("id:")]
    got = [
        c["after"]["id"]
        for line in before
        if line.startswith("data:")
        for c in orjson.loads(line[5:]).get("changes", [])
    ]
    resume = orjson.loads(next(line[5:] for line in control.splitlines() if line.startswith("data:")))[
        "position"
    ]
    assert len(got) < 40 and resume == offsets[-1]
    with sse(server, "public.big", **{"from": resume}) as stream:
        rest = stream.until(lambda e: e.event == "change" and 39 in _ids([e]))
    assert got + _ids(rest) == list(
        range(40)
    )  # every transaction once, in order: before the cut, then the rest
    assert (
        server.get("/metrics", token=None).text.count(
            'pgcdc_serve_slow_clients_dropped_total{pipeline="test",table="public.big"} 1.0'
        )
        == 1
    )


def _lag(server: Server, client: str) -> float | None:
    """The lag gauge of one client on /metrics (None: no series for it)."""
    for line in server.get("/metrics", token=None).text.splitlines():
        if line.startswith("pgcdc_serve_client_lag{") and f'client="{client}"' in line:
            assert 'pipeline="test"' in line, line
            return float(line.rsplit(" ", 1)[1])
    return None


def test_lag_per_client_on_metrics_and_max_clients(pipe: Pipe) -> None:
    """A client that reads nothing: its catch-up on 40 transactions of 400 kB (more than the sockets'
    buffers hold) fills its connection, so the 5 transactions after it stay queued: its lag on
    /metrics, under the id the server gave it (X-Cdc-Client), is exactly those 5 positions; the
    series goes when it disconnects; a third stream of a --max-clients 2 server is refused (503)."""
    srv = start_server(pipe.file, "--heartbeat", "0.5", "--client-queue", "1000", "--max-clients", "2")
    try:
        body, _ = initial_rows(srv, "public.big")
        start = body["position"]
        sql(
            pipe.dsn, *[f"INSERT INTO big VALUES ({i}, repeat(md5('{i}'), 12500))" for i in range(1000, 1040)]
        )
        deadline = time.monotonic() + 120
        newest = start
        while newest < start + 40 and time.monotonic() < deadline:
            time.sleep(0.2)
            newest = next(
                t["position"] for t in srv.get("/v1/tables").json()["tables"] if t["table"] == "public.big"
            )
        assert newest >= start + 40, (start, newest)
        host, port = srv.url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.sendall(
            f"GET /v1/tables/public.big/changes?from={start} HTTP/1.0\r\nHost: x\r\n"
            f"Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        head = b""
        sock.settimeout(30)
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        client = next(
            line.split(":", 1)[1].strip()
            for line in head.decode().splitlines()
            if line.lower().startswith("x-cdc-client:")
        )
        time.sleep(1.5)  # its catch-up (16 MB) is written to its connection, the next heartbeat waits
        assert _lag(srv, client) == 0.0
        sql(pipe.dsn, *[f"INSERT INTO big VALUES ({i}, 'small')" for i in range(2000, 2005)])
        deadline = time.monotonic() + 60
        now = newest
        while now < newest + 5 and time.monotonic() < deadline:
            time.sleep(0.2)
            now = next(
                t["position"] for t in srv.get("/v1/tables").json()["tables"] if t["table"] == "public.big"
            )
        assert now == newest + 5 and _lag(srv, client) == 5.0
        with sse(srv, "public.items", **{"from": initial_rows(srv, "public.items")[0]["position"]}) as other:
            other_id = other.response.headers["x-cdc-client"]
            assert other_id != client and _lag(srv, other_id) == 0.0
            refused = srv.get("/v1/tables/public.items/changes", **{"from": 0})
            assert (
                refused.status_code == 503
                and "--max-clients" in refused.json()["error"]
                and refused.headers["retry-after"]
            )
        sock.close()
        deadline = time.monotonic() + 30
        while (
            _lag(srv, client) is not None or _lag(srv, other_id) is not None
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _lag(srv, client) is None and _lag(srv, other_id) is None  # gone with their clients
        out, err = srv.stop()
        assert f"client {client} follows public.big" in err and TOKEN not in out + err
    finally:
        if srv.proc.poll() is None:
            srv.stop()


def test_status_lists_the_server_and_metrics_count(pipe: Pipe, server: Server) -> None:
    run = cdc("status", pipe.file)
    assert f"serve: {server.url} (pid {server.proc.pid}, 2 table(s)" in run.out, run.out
    body, _ = initial_rows(server, "public.items")
    sql(pipe.dsn, "INSERT INTO items VALUES (300, 'counted', 1)")
    answer = server.get("/v1/tables/public.items/poll", **{"from": body["position"], "timeout": 20}).json()
    assert [c["after"]["id"] for e in answer["events"] for c in e["data"]["changes"]] == [300]
    server.get("/v1/tables", token=None)
    text = server.get("/metrics", token=None).text
    sent = [
        line
        for line in text.splitlines()
        if line.startswith('pgcdc_serve_events_sent_total{pipeline="test",table="public.items"}')
    ]
    assert sent and float(sent[0].split()[-1]) > 0
    assert 'pgcdc_serve_requests_refused_total{code="401",pipeline="test"}' in text


def test_tls_exit_codes_and_no_secret_printed(
    pipe: Pipe, server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = make_ca(tmp_path)
    cert, key = issue(tmp_path, "serve", "/CN=localhost", "IP:127.0.0.1,DNS:localhost")
    tls = start_server(pipe.file, "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        assert tls.url.startswith("https://")
        answer = httpx.get(
            tls.url + "/v1/tables",
            headers={"Authorization": f"Bearer {TOKEN}"},
            verify=ssl.create_default_context(cafile=str(ca)),
            timeout=10,
        )
        assert answer.status_code == 200 and answer.json()["tables"]
        with pytest.raises(httpx.HTTPError):
            httpx.get(tls.url.replace("https://", "http://") + "/v1/tables", timeout=5)
    finally:
        out, err = tls.stop()
    assert tls.proc.returncode == 0, err  # SIGTERM is how a server is meant to stop
    assert TOKEN not in out + err and "Traceback" not in out + err
    # the refusals come before anything is served: in this process (cdc_here), with the environment set here
    monkeypatch.setenv("CDC_SERVE_TOKENS", "")
    no_token = cdc_here("serve", pipe.file, "--port", "0")
    assert no_token.code == 2 and "no token" in no_token.err and "Traceback" not in no_token.err
    monkeypatch.setenv("CDC_SERVE_TOKENS", f"{TOKEN}=*")
    busy = cdc_here("serve", pipe.file, "--port", server.url.rsplit(":", 1)[1])
    assert busy.code == 2 and "cannot listen" in busy.err and TOKEN not in busy.out + busy.err
    half = cdc_here("serve", pipe.file, "--tls-cert", str(cert))
    assert half.code == 2 and "go together" in half.err


def test_a_sinks_columns_masks_and_rename(pipe: Pipe, server: Server) -> None:
    """--sink serves what that sink gets: its columns, masks and name for the table."""
    options = {"public.items": {"exclude_columns": ["qty"], "mask": {"name": "redact"}, "rename": "goods"}}
    other = pipe.dir / "with-sink"  # another file of the same pipeline (same state_dir, so the same log)
    other.mkdir(exist_ok=True)
    file = write_pipeline(
        other,
        pipe.dsn,
        ["public.items", "public.big"],
        state_dir=str(pipe.dir / ".cdc" / "test"),
        sinks=[
            {
                "name": "app",
                "delta": {
                    "path": str(pipe.dir / "lake"),
                    "tables": ["public.items"],
                    "table_options": options,
                },
            }
        ],
    )
    shaped = start_server(file, "--sink", "app", "--heartbeat", "0.5")
    try:
        assert [t["name"] for t in shaped.get("/v1/tables").json()["tables"]] == ["goods"]
        assert shaped.get("/v1/tables/public.items").status_code == 404
        body, rows = initial_rows(shaped, "goods")
        assert rows and all(
            set(r["after"]) == {"id", "name"} and r["after"]["name"] == "[redacted]" for r in rows
        )
        sql(pipe.dsn, "INSERT INTO items VALUES (700, 'secret name', 7)")
        with sse(shaped, "goods", **{"from": body["position"]}) as stream:
            ev = stream.until(lambda e: e.event == "change")[-1]
        assert (
            ev.data["changes"][0]["after"] == {"id": 700, "name": "[redacted]"}
            and ev.data["table"] == "goods"
        )
    finally:
        shaped.stop()


def test_example_page_in_a_real_browser(pipe: Pipe, server: Server) -> None:
    """Debian's chromium shows the example page: a write at the source changes the row in the DOM;
    a reload resumes from the saved position (no event twice) and keeps following."""
    with chromium() as open_page:
        page = open_page()
        page.goto(f"{server.url}/#token={TOKEN}&table=public.items")
        page.wait("document.getElementById('status').textContent === 'live'", what="status live")
        assert page.eval("document.getElementById('row-3') !== null")
        sql(pipe.dsn, "INSERT INTO items VALUES (500, 'from the source', 1)")
        page.wait(
            "(document.getElementById('row-500') || {}).textContent?.includes('from the source')",
            what="row 500",
        )
        sql(pipe.dsn, "UPDATE items SET name = 'changed' WHERE id = 500")
        page.wait(
            "document.getElementById('row-500').textContent.includes('changed')", what="row 500 changed"
        )
        page.reload()
        page.wait("document.getElementById('status').textContent === 'live'", what="status live after reload")
        sql(pipe.dsn, "UPDATE items SET name = 'after reload' WHERE id = 500")
        page.wait(
            "document.getElementById('row-500').textContent.includes('after reload')",
            what="row 500 after reload",
        )
        seen = page.eval("JSON.parse(sessionStorage.getItem('cdc-serve:public.items')).seen")
        assert len(seen) >= 3 and seen == sorted(
            set(seen)
        )  # every event id once, in order, across the reload
        shown = page.eval("document.querySelectorAll('#rows tr').length")
    _, rows = initial_rows(server, "public.items")
    assert shown == len(rows)


def test_compaction_forces_a_restart_control_event(pipe: Pipe, server: Server) -> None:
    body, _ = initial_rows(server, "public.items")
    old = body["position"]
    sql(pipe.dsn, "DELETE FROM items WHERE id = 2")
    deadline = time.monotonic() + 30
    while server.get("/v1/tables/public.items").json()["position"] == old and time.monotonic() < deadline:
        time.sleep(0.2)
    assert cdc("log", "compact", pipe.file, "--tombstone-retention", "0s").code == 0
    with sse(server, "public.items", **{"from": old}) as stream:
        ev = stream.next()
    assert ev.event == "control" and ev.data["control"] == "must-refetch" and ev.data["reason"] == "compacted"
    answer = server.get("/v1/tables/public.items/poll", **{"from": old}).json()
    assert answer["control"]["reason"] == "compacted" and answer["events"] == []
    body, rows = initial_rows(server, "public.items")  # starting over works
    assert 2 not in [r["after"]["id"] for r in rows]
