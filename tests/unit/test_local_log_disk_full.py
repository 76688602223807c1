"""A full disk under the local log is one clear error naming the log and the fix (the crash
campaign, bench/chaos.py, found SQLite's bare "disk I/O error" reported as an internal error),
and the log keeps its last durable cut: the stream starts again from there."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.ground.errors import LogError
from cdc.ground.tables import TableName
from cdc.log.base import Column, TableSchema
from cdc.log.local import LocalLog

pytestmark = pytest.mark.unit

T = TableName("public", "t")
SCHEMA = TableSchema((Column("id", 23, -1),), ("id",), {23: {"oid": 23, "name": "int4", "kind": "base"}})


def rows(lsn: int, count: int) -> list[tuple]:
    return [
        (lsn, i, "c", f"k{lsn}-{i}".encode(), b"x" * 2000, None, None, 1, 7, 0, lsn + 1) for i in range(count)
    ]


def test_a_full_disk_is_a_clear_log_error_and_the_last_cut_stays(tmp_path: Path) -> None:
    log = LocalLog(tmp_path / "log")
    tid = log.ensure_table(T)
    log.schema_version(tid, SCHEMA, 1)
    log.append(tid, rows(10, 5))
    kept = log.commit(10)
    # SQLite's own limit on the file's size stands in for the filesystem: the same SQLITE_FULL
    pages = log.db.execute("PRAGMA page_count").fetchone()[0]
    log.db.execute(f"PRAGMA max_page_count = {pages + 5}")
    with pytest.raises(LogError) as caught:
        for lsn in range(20, 2000, 10):
            log.append(tid, rows(lsn, 50))
            log.commit(lsn)
    text = str(caught.value) + caught.value.fix
    assert str(tmp_path / "log") in text and "MB free" in text, text
    assert "free space" in caught.value.fix and "last durable cut" in caught.value.fix
    log.rollback()
    log.close()
    again = LocalLog(tmp_path / "log")
    assert again.latest_cut().id >= kept.id  # what was durable is still there
    again.close()
