"""Rendering log records as Debezium-compatible change events (DESIGN.md §5).

Key: the key columns as a JSON object. Value: the envelope below; a delete is followed by a
tombstone (same key, null value) when a keyed record stream is produced (`records`).

    {"before": {...}|null, "after": {...}|null,
     "source": {"version", "connector": "postgresql", "name", "ts_ms", "snapshot", "db", "sequence",
                "schema", "table", "txId", "lsn", "xmin"},
     "op": "c"|"u"|"d"|"r"|"t", "ts_ms": ...}

Unchanged TOAST values are never sent as a value: they carry Debezium's placeholder
`__debezium_unavailable_value` (base64 of it for bytea), so consumers keep their current value.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

from cdc.log.base import LogRecord, TableSchema
from cdc.pgoutput import UNCHANGED
from cdc.schema import schema_types
from cdc.typemap import Converter, converter

UNAVAILABLE = "__debezium_unavailable_value"
UNAVAILABLE_BYTES = base64.b64encode(UNAVAILABLE.encode()).decode()
CONNECTOR_VERSION = "pgcdc-0.1.0"


def _placeholder(type_name: str) -> str:
    return UNAVAILABLE_BYTES if type_name == "bytea" else UNAVAILABLE


class EnvelopeRenderer:
    """Turns LogRecords into (key, value) JSON-ready dicts; caches converters per schema."""

    def __init__(self, database: str, name: str):
        self.database = database
        self.name = name
        self._cache: dict[int, tuple[list[str], list[Converter], list[str], tuple[int, ...]]] = {}

    def _plan(self, schema: TableSchema) -> tuple[list[str], list[Converter], list[str], tuple[int, ...]]:
        plan = self._cache.get(id(schema))
        if plan is None:
            types = schema_types(schema)
            names = [c.name for c in schema.columns]
            convs = [converter(types[c.type_oid], c.typmod) for c in schema.columns]
            placeholders = [_placeholder(types[c.type_oid].name) for c in schema.columns]
            plan = self._cache[id(schema)] = (names, convs, placeholders, schema.key_indexes)
        return plan

    def row(self, schema: TableSchema, values: list[Any] | None) -> dict[str, Any] | None:
        if values is None:
            return None
        names, convs, placeholders, _ = self._plan(schema)
        return {
            name: None if v is None else placeholder if v is UNCHANGED else conv(v)
            for name, v, conv, placeholder in zip(names, values, convs, placeholders, strict=True)
        }

    def key(self, record: LogRecord) -> dict[str, Any] | None:
        if record.op == "t":
            return None
        names, convs, _, key_idx = self._plan(record.schema)
        source = record.values if record.op != "d" else record.before
        if source is not None and all(source[i] is not None and source[i] is not UNCHANGED for i in key_idx):
            return {names[i]: convs[i](source[i]) for i in key_idx}
        from cdc.keys import key_texts

        texts = key_texts(record.key or b"")
        return {names[i]: convs[i](t) for i, t in zip(key_idx, texts, strict=True)}

    def value(self, record: LogRecord, now_ms: int | None = None) -> dict[str, Any]:
        snapshot = record.op == "r"
        commit_ms = record.commit_ts // 1000 if record.commit_ts is not None else None
        event_lsn = record.event_lsn if record.event_lsn is not None else record.lsn
        source = {
            "version": CONNECTOR_VERSION,
            "connector": "postgresql",
            "name": self.name,
            "ts_ms": commit_ms,
            "snapshot": "true" if snapshot else "false",
            "db": self.database,
            "sequence": f'["{record.lsn}","{event_lsn}"]',
            "schema": record.table.schema,
            "table": record.table.name,
            "txId": record.xid,
            "lsn": event_lsn,
            "xmin": None,
        }
        before = None
        if record.op in ("u", "d") and record.before is not None:
            before = self.row(record.schema, record.before)
        after = self.row(record.schema, record.values) if record.op in ("c", "u", "r") else None
        return {
            "before": before,
            "after": after,
            "source": source,
            "op": record.op,
            "ts_ms": now_ms if now_ms is not None else int(time.time() * 1000),
            "transaction": None,
        }

    def records(self, records: Iterator[LogRecord]) -> Iterator[tuple[LogRecord, dict | None, dict | None]]:
        """(record, key, value) as a keyed topic holds them: deletes followed by a tombstone."""
        for record in records:
            key = self.key(record)
            yield record, key, self.value(record)
            if record.op == "d":
                yield record, key, None
