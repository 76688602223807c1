"""What Debezium consumers expect of the `kafka` log's records (issue 22 item 8), read back with
kafka-python from a real broker:

* snapshot records carry the snapshot's time: `source.ts_ms` (not null) and the `cdc.ts` header
  (not 0);
* a primary-key change (delete + tombstone + create) carries Debezium's headers: the delete and
  its tombstone `__debezium.newkey` (the new key), the create `__debezium.oldkey` (the old key);
  other records carry neither;
* followers read such topics unchanged (`cdc verify` identical).
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from tests.fixtures.kafka_log import apply_ok, make_kpipe, snapshot, stream_until_current, verified
from tests.fixtures.topics import topic_records as raw_records
from tests.harness import sql

pytestmark = pytest.mark.integration


def test_snapshot_time_and_key_change_headers(pg_db: str, tmp_path: Path, kafka, spark) -> None:
    sql(pg_db, "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'one'), (2, 'two')")
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], kafka.bootstrap)
    before_ms = int(time.time() * 1000)
    snapshot(pipe)
    after_ms = int(time.time() * 1000)
    sql(pg_db, "UPDATE t SET id = 10, v = 'ten' WHERE id = 1", "UPDATE t SET v = 'deux' WHERE id = 2")
    stream_until_current(pipe)

    records = raw_records(kafka.bootstrap, pipe.topic("public.t"))
    rows = [
        (orjson.loads(r.key), orjson.loads(r.value) if r.value is not None else None, dict(r.headers or []))
        for r in records
    ]
    snap = [(k, v, h) for k, v, h in rows if v is not None and v["op"] == "r"]
    assert len(snap) == 2
    for _key, value, headers in snap:
        ts_ms = value["source"]["ts_ms"]
        assert ts_ms is not None and before_ms - 1000 <= ts_ms <= after_ms, (ts_ms, before_ms, after_ms)
        assert int(headers["cdc.ts"]) // 1000 == ts_ms  # the header in µs, the same instant

    changes = [(k, v["op"] if v else None, h) for k, v, h in rows if v is None or v["op"] != "r"]
    assert [(k, op) for k, op, _ in changes] == [
        ({"id": 1}, "d"),
        ({"id": 1}, None),
        ({"id": 10}, "c"),
        ({"id": 2}, "u"),
    ]
    (_, _, deleted), (_, _, tombstone), (_, _, created), (_, _, updated) = changes
    assert orjson.loads(deleted["__debezium.newkey"]) == {"id": 10} and "__debezium.oldkey" not in deleted
    assert orjson.loads(tombstone["__debezium.newkey"]) == {"id": 10}
    assert orjson.loads(created["__debezium.oldkey"]) == {"id": 1} and "__debezium.newkey" not in created
    assert not {"__debezium.oldkey", "__debezium.newkey"} & set(updated)
    assert not any({"__debezium.oldkey", "__debezium.newkey"} & set(h) for _k, _v, h in snap)

    apply_ok(pipe, spark)
    verified(pipe, spark)
