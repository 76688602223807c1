"""`cdc serve` on the `kafka` log: initial rows and live changes from the topics, and two servers
with no coordination between them, a client moving from one to the other with its Last-Event-ID."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.kafka_log import make_kpipe, snapshot, start_stream, stop_stream
from tests.fixtures.serve import initial_rows, sse, start_server
from tests.harness import sql

pytestmark = pytest.mark.integration


def _ids(events) -> list[int]:
    return [
        (c["after"] or c["before"])["id"] for e in events if e.event == "change" for c in e.data["changes"]
    ]


def test_two_servers_on_the_kafka_log(pg_db: str, kafka, tmp_path: Path) -> None:
    sql(
        pg_db,
        "CREATE TABLE items (id int PRIMARY KEY, name text)",
        "INSERT INTO items SELECT g, 'i' || g FROM generate_series(1, 5) g",
    )
    pipe = make_kpipe(tmp_path, pg_db, ["public.items"], kafka.bootstrap, sinks=[])
    snapshot(pipe)
    stream = start_stream(pipe)
    one = start_server(pipe.file, "--heartbeat", "0.5")
    two = start_server(pipe.file, "--heartbeat", "0.5")
    try:
        body, rows = initial_rows(one, "public.items")
        assert sorted(r["after"]["id"] for r in rows) == [1, 2, 3, 4, 5] and {r["op"] for r in rows} == {"r"}
        sql(
            pg_db,
            "BEGIN; INSERT INTO items VALUES (6, 'a'); INSERT INTO items VALUES (7, 'b'); COMMIT",
            "DELETE FROM items WHERE id = 1",
        )
        with sse(one, "public.items", timeout=60, **{"from": body["position"]}) as events:
            first = events.until(lambda e: e.event == "change")
        assert _ids(first) == [6, 7]  # one source transaction, one event
        sql(pg_db, "INSERT INTO items VALUES (8, 'c')")
        with sse(two, "public.items", last_event_id=first[-1].id, timeout=60) as events:  # the other server
            rest = events.until(lambda e: e.event == "change" and 8 in _ids([e]))
        changes = [c for e in rest if e.event == "change" for c in e.data["changes"]]
        assert [(c["op"], (c["after"] or c["before"])["id"]) for c in changes] == [("d", 1), ("c", 8)]
        _, rows = initial_rows(two, "public.items")
        assert sorted(r["after"]["id"] for r in rows) == [2, 3, 4, 5, 6, 7, 8]
    finally:
        one.stop()
        two.stop()
        stop_stream(stream)
