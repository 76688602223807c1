"""DDL capture messages (cdc/ddl.py) as the stream reads them, and the mode lines it says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc import ddl
from cdc.ground.tables import TableName
from cdc.log.base import Column, TableSchema
from cdc.log.local import LocalLog
from pipelines.apply.cut import schema_changed

pytestmark = pytest.mark.unit


def test_a_ddl_message_gives_columns_with_attnums_and_fast_defaults() -> None:
    body = {
        "v": 1,
        "event": "ddl",
        "tag": "ALTER TABLE",
        "oid": "16411",
        "schema": "public",
        "table": "t",
        "columns": [
            [1, "id", "23", -1, 0, True, None, None, True],
            [3, "tier", "25", -1, 0, False, "'std'::text", "std", False],
        ],
        "key": ["id"],
    }
    event = ddl.parse(json.dumps(body).encode())
    assert event.oid == 16411 and event.table == "t" and event.key == ("id",)
    assert event.columns == (Column("id", 23, -1, 0, None, 1), Column("tier", 25, -1, 0, "std", 3))


@pytest.mark.parametrize(
    "content",
    [b"not json", b'{"v": 2, "event": "ddl", "oid": 1}', b'{"v": 1, "event": "grant", "oid": 1}', b"[1]"],
)
def test_a_message_this_version_cannot_read_is_refused(content: bytes) -> None:
    with pytest.raises(ddl.DdlMessageError):
        ddl.parse(content)


def test_mode_lines_say_on_off_and_gone_with_the_fix() -> None:
    on = ddl.TriggerState(("ddl_command_end", "table_rewrite", "sql_drop"), ())
    off = ddl.TriggerState((), ("ddl_command_end", "table_rewrite", "sql_drop"))
    half = ddl.TriggerState(("table_rewrite", "sql_drop"), ("ddl_command_end",))
    assert ddl.mode_line(on, True)[0].startswith("DDL capture: on") and ddl.mode_line(on, True)[1] is None
    line, fix = ddl.mode_line(off, False, "cdc ddl install p.yml")
    assert line.startswith("DDL capture: off") and "cdc ddl install p.yml" in line and fix is None
    line, fix = ddl.mode_line(off, True, "cdc ddl install p.yml")  # installed, then every trigger dropped
    assert "dropped or disabled behind the tool's back" in line and fix and "cdc ddl install p.yml" in fix
    line, fix = ddl.mode_line(half, False)
    assert "ddl_command_end" in line and fix


def test_a_schema_version_alone_makes_a_table_worth_applying(tmp_path: Path) -> None:
    t = TableName("public", "t")
    log = LocalLog(tmp_path / "log")
    try:
        tid = log.ensure_table(t)
        log.schema_version(tid, TableSchema((Column("id", 23, -1, attnum=1),), ("id",)), 100)
        log.schema_version(
            tid, TableSchema((Column("id", 23, -1, attnum=1), Column("w", 25, -1, attnum=2)), ("id",)), 500
        )
        assert schema_changed(log, t, 400, 600)  # a version at 500, between the follower's cut and this one
        assert not schema_changed(log, t, 501, 900)
        assert not schema_changed(log, t, 200, 499)  # the cut ends before the version's commit
        assert schema_changed(log, t, 500, 500)  # recorded at the cut's own position (idle-table check)
        assert not schema_changed(log, t, None, 900)  # a follower that bootstraps takes the newest anyway
    finally:
        log.close()
