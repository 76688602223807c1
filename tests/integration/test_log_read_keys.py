"""`cdc log read --keys` on the local log: a snapshot is stored at one offset, so each snapshot
row says which row of it it is (`row`); stream events have offsets of their own."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.harness import cdc, sql, stream_changes, write_pipeline

pytestmark = pytest.mark.integration


def test_log_read_keys_numbers_snapshot_rows(pg_db: str, tmp_path: Path) -> None:
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' FROM generate_series(1, 4) g",
    )
    file = write_pipeline(tmp_path, pg_db, ["public.t"])
    assert cdc("snapshot", file).code == 0
    sql(pg_db, "INSERT INTO t VALUES (5, 'new')", "UPDATE t SET v = 'x' WHERE id = 2")
    stream_changes(file, pg_db)

    run = cdc("log", "read", file, "--keys")
    assert run.code == 0, run
    records = [orjson.loads(line) for line in run.out.splitlines()]
    snap = [r for r in records if r["value"]["op"] == "r"]
    assert [r["row"] for r in snap] == [1, 2, 3, 4]  # each snapshot row told apart
    assert sorted(r["key"]["id"] for r in snap) == [1, 2, 3, 4]
    assert len({r["offset"] for r in snap}) == 1  # one offset holds the snapshot
    events = [r for r in records if r["value"]["op"] != "r"]
    assert [(r["value"]["op"], r["key"]) for r in events] == [("c", {"id": 5}), ("u", {"id": 2})]
    assert all("row" not in r for r in events)
    offsets = [r["offset"] for r in events]
    assert len(set(offsets)) == 2 and min(offsets) > snap[0]["offset"]
    assert list(records[0]) == ["table", "offset", "row", "key", "value"]
