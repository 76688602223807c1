"""Two LocalLog handles on one file, as `cdc stream` and `cdc snapshot --tables` are: tables and
schema versions registered by one are seen by the other instead of colliding."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.ground.tables import TableName
from cdc.log.base import Column, TableSchema
from cdc.log.local import LocalLog

pytestmark = pytest.mark.unit

T = TableName("public", "b")
TYPES = {23: {"oid": 23, "name": "int4", "kind": "base"}}
V1 = TableSchema((Column("id", 23, -1),), ("id",), TYPES)
V2 = TableSchema((Column("id", 23, -1), Column("n", 23, -1)), ("id",), TYPES)
V3 = TableSchema((Column("id", 23, -1), Column("m", 23, -1)), ("id",), TYPES)


@pytest.fixture
def two(tmp_path: Path):
    stream, snapshot = LocalLog(tmp_path / "log"), LocalLog(tmp_path / "log")
    yield stream, snapshot
    stream.close()
    snapshot.close()


def test_a_table_added_by_the_other_process_is_reused(two) -> None:
    stream, snapshot = two
    assert stream.table_id(T) is None  # the stream looked before the snapshot added it
    tid = snapshot.ensure_table(T)
    assert stream.ensure_table(T) == tid
    assert [t.table for t in stream.tables()] == [T]


def test_a_version_added_by_the_other_process_is_not_reissued(two) -> None:
    stream, snapshot = two
    tid = stream.ensure_table(T)
    assert stream.schema_version(tid, V1, 10) == 1  # the stream caches v1 as the latest
    assert snapshot.schema_version(tid, V2, 20) == 2
    assert stream.schema_version(tid, V2, 30) == 2  # the same layout: reused, not a duplicate
    assert stream.schema_version(tid, V3, 40) == 3
    assert snapshot.schema_version(tid, V3, 50) == 3
    assert [(v, since) for v, since, _ in snapshot.schema_history(T)] == [(1, 10), (2, 20), (3, 40)]


def test_a_version_written_inside_an_open_batch_reads_under_its_lock(two) -> None:
    stream, snapshot = two
    tid = snapshot.ensure_table(T)
    assert stream.schema_version(tid, V1, 10) == 1
    assert snapshot.schema_version(tid, V2, 20) == 2
    with stream.write():
        assert stream.schema_version(tid, V3, 30) == 3
    assert snapshot.schema_by_version(tid, 3) == V3
