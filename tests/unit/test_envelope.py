"""The envelope as JSON bytes (cdc.envelope.EnvelopeRenderer.value_json): the same bytes as
orjson.dumps of the envelope spelled out as a dict (DESIGN.md §5), for every op, missing
commit time or xid, unchanged TOAST values, and names that need JSON escaping or hold %."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from cdc.envelope import CONNECTOR_VERSION, UNAVAILABLE, EnvelopeRenderer
from cdc.ground.tables import TableName
from cdc.log.base import Column, LogRecord, TableSchema
from cdc.pgoutput import UNCHANGED

pytestmark = pytest.mark.unit

TYPES = {
    20: {"oid": 20, "name": "int8", "kind": "base"},
    25: {"oid": 25, "name": "text", "kind": "base"},
    1082: {"oid": 1082, "name": "date", "kind": "base"},
}
SCHEMA = TableSchema(
    (Column("id", 20, -1), Column('n"%s\\é', 25, -1), Column("day", 1082, -1)), ("id",), TYPES
)
ROW = ["7", 'a "quoted" %d\\ value ☃', "1970-01-03"]
ROW_JSON = {"id": 7, 'n"%s\\é': 'a "quoted" %d\\ value ☃', "day": 2}
OLD = ["7", "old", "1970-01-02"]
OLD_JSON = {"id": 7, 'n"%s\\é': "old", "day": 1}


def record(op: str, values: list | None, before: list | None, **over: Any) -> LogRecord:
    fields = {
        "table": TableName('sch"%', "tåble%d"),
        "offset": 5,
        "lsn": 1000,
        "seq": 3,
        "op": op,
        "key": b'["7"]',
        "values": values,
        "before": before,
        "before_kind": None,
        "schema": SCHEMA,
        "xid": 42,
        "commit_ts": 1_700_000_000_123_456,
        "event_lsn": 990,
    }
    return LogRecord(**{**fields, **over})


def expected(rec: LogRecord, before: Any, after: Any, now_ms: int) -> dict:
    lsn = rec.event_lsn if rec.event_lsn is not None else rec.lsn
    return {
        "before": before,
        "after": after,
        "source": {
            "version": CONNECTOR_VERSION,
            "connector": "postgresql",
            "name": 'srv"%x',
            "ts_ms": None if rec.commit_ts is None else rec.commit_ts // 1000,
            "snapshot": "true" if rec.op == "r" else "false",
            "db": "d%b\\",
            "sequence": f'["{rec.lsn}","{lsn}"]',
            "schema": rec.table.schema,
            "table": rec.table.name,
            "txId": rec.xid,
            "lsn": lsn,
            "xmin": None,
        },
        "op": rec.op,
        "ts_ms": now_ms,
        "transaction": None,
    }


CASES = [
    (record("c", ROW, None), None, ROW_JSON),
    (record("r", ROW, None, xid=None, commit_ts=None, event_lsn=None, seq=0), None, ROW_JSON),
    (record("u", ROW, OLD), OLD_JSON, ROW_JSON),
    (record("u", ROW, None), None, ROW_JSON),
    (record("u", [ROW[0], UNCHANGED, ROW[2]], None), None, {**ROW_JSON, 'n"%s\\é': UNAVAILABLE}),
    (record("d", None, OLD), OLD_JSON, None),
    (record("d", None, [OLD[0], None, None]), {"id": 7, 'n"%s\\é': None, "day": None}, None),
    (record("t", None, None, key=None), None, None),
]


@pytest.mark.parametrize(
    ("rec", "before", "after"), CASES, ids=[f"{c[0].op}{i}" for i, c in enumerate(CASES)]
)
def test_value_json_is_the_envelope_dict_serialized(rec: LogRecord, before: Any, after: Any) -> None:
    renderer = EnvelopeRenderer("d%b\\", 'srv"%x')
    want = expected(rec, before, after, 1234)
    assert orjson.loads(renderer.value_json(rec, 1234)) == want
    assert renderer.value_json(rec, 1234) == orjson.dumps(want)  # byte for byte: key order, no spaces


def test_records_add_a_tombstone_after_a_delete_and_no_key_for_a_truncate() -> None:
    renderer = EnvelopeRenderer("db", "srv")
    out = list(
        renderer.records([record("c", ROW, None), record("d", None, OLD), record("t", None, None, key=None)])
    )
    assert [(r.op, k, v is None) for r, k, v in out] == [
        ("c", b'{"id":7}', False),
        ("d", b'{"id":7}', False),
        ("d", b'{"id":7}', True),
        ("t", None, False),
    ]
    assert orjson.loads(out[0][2])["ts_ms"] > 1_700_000_000_000  # the wall clock
