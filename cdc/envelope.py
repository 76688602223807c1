"""Rendering log records as Debezium-compatible change events (DESIGN.md §5).

Key: the key columns as a JSON object. Value: the envelope below; a delete is followed by a
tombstone (same key, null value) when a keyed record stream is produced (`records`).

A table without a key (docs/keyless-tables.md) has its records keyed by their position instead,
`{"_cdc_lsn": <commit LSN>, "_cdc_seq": <sequence>}` (the columns followers identify its rows by),
so no two records share a key and a compacted topic keeps every one; its deletes (REPLICA IDENTITY
FULL: `before` is the whole deleted row) get no tombstone, which would compact the delete itself
away, and with it the removal of one row of that content.

    {"before": {...}|null, "after": {...}|null,
     "source": {"version", "connector": "postgresql", "name", "ts_ms", "snapshot", "db", "sequence",
                "schema", "table", "txId", "lsn", "xmin"},
     "op": "c"|"u"|"d"|"r"|"t", "ts_ms": ...}

Unchanged TOAST values are never sent as a value: they carry Debezium's placeholder
`__debezium_unavailable_value` (base64 of it for bytea), so consumers keep their current value.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from cdc.ground import clock
from cdc.ground.formats import VERSION
from cdc.ground.tables import TableName
from cdc.log.base import LogRecord, TableSchema
from cdc.pgoutput import UNCHANGED
from cdc.pgtypes import Converter
from cdc.schema import schema_types
from cdc.typemap import c_kind, converter

try:  # the optional C speedup, built by `pip install -e .` (setup.py)
    # re-exported: the Kafka fast path renders with it; a C extension the checker cannot read
    from cdc import _render as _render  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - no C compiler at install time
    _render = None

UNAVAILABLE = "__debezium_unavailable_value"
UNAVAILABLE_BYTES = base64.b64encode(UNAVAILABLE.encode()).decode()
CONNECTOR_VERSION = f"pgcdc-{VERSION}"  # source.version: the cdc that wrote the record
TRUNCATE_KEY = b'{"__cdc_truncate":true}'  # compacted topics need a key; one for every truncate of a table


# The slots of the value template (EnvelopeRenderer.pieces), in order.
_SLOTS = (b"%b", b"%b", b"%b", b"%d", b"%d", b"%b", b"%d", b"%b", b"%d")


def position_key_json(lsn: int, seq: int) -> bytes:
    """The record key of a keyless table's event: its position (the bytes orjson gives for it)."""
    return b'{"_cdc_lsn":%d,"_cdc_seq":%d}' % (lsn, seq)


def _placeholder(type_name: str) -> str:
    return UNAVAILABLE_BYTES if type_name == "bytea" else UNAVAILABLE


def pure_python_reason() -> str | None:
    """Why rows are not rendered by cdc._render (C), or None when they are."""
    if _render is None:
        return "the C speedup cdc._render is not built (run scripts/setup.sh)"
    if os.environ.get("CDC_PURE_PYTHON"):
        return "CDC_PURE_PYTHON is set"
    return None


def speedups() -> bool:
    """Whether rows are rendered by cdc._render (C): built, and CDC_PURE_PYTHON not set."""
    return pure_python_reason() is None


class EnvelopeRenderer:
    """Turns LogRecords into the envelope's key and value as JSON bytes; caches converters per
    schema and the constant parts of `source` per table.

    The hot path of publishing to Kafka: the value is assembled from pre-encoded pieces around
    one orjson call per row image, rather than by serializing a nested dict per record. The
    bytes are exactly what orjson.dumps of the envelope dict gives (tests/unit/test_envelope.py).
    """

    def __init__(self, database: str, name: str):
        self.database = database
        self.name = name
        self._cache: dict[int, tuple[list[str], list[Converter], list[str], tuple[int, ...]]] = {}
        self._templates: dict[tuple[TableName, bool], bytes] = {}
        self._c_plans: dict[int, tuple[TableSchema, Any]] = {}

    def _plan(self, schema: TableSchema) -> tuple[list[str], list[Converter], list[str], tuple[int, ...]]:
        plan = self._cache.get(id(schema))
        if plan is None:
            types = schema_types(schema)
            names = [c.name for c in schema.columns]
            convs = [converter(types[c.type_oid], c.typmod) for c in schema.columns]
            placeholders = [_placeholder(types[c.type_oid].name) for c in schema.columns]
            plan = self._cache[id(schema)] = (names, convs, placeholders, schema.key_indexes)
        return plan

    def c_plan(self, schema: TableSchema):
        """The cdc._render.Plan of a schema (only when speedups() is true)."""
        entry = self._c_plans.get(id(schema))
        if entry is None or entry[0] is not schema:
            names, convs, placeholders, key_idx = self._plan(schema)
            kinds = [c_kind(conv) for conv in convs]
            plan = _render.Plan(
                bytes(kind for kind, _ in kinds),
                bytes(precision for _, precision in kinds),
                tuple(orjson.dumps(name) + b":" for name in names),
                tuple(convs),
                tuple(orjson.dumps(p) for p in placeholders),
                tuple(key_idx),
                orjson.dumps,
            )
            entry = self._c_plans[id(schema)] = (schema, plan)
        return entry[1]

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
        if not record.schema.key:  # keyless: the position (module docstring)
            return {"_cdc_lsn": record.lsn, "_cdc_seq": record.seq}
        names, convs, _, key_idx = self._plan(record.schema)
        source = record.values if record.op != "d" else record.before
        if source is not None and all(source[i] is not None and source[i] is not UNCHANGED for i in key_idx):
            return {names[i]: convs[i](source[i]) for i in key_idx}
        from cdc.keys import key_texts

        texts = key_texts(record.key or b"")
        return {names[i]: convs[i](t) for i, t in zip(key_idx, texts, strict=True)}

    def key_json(self, record: LogRecord) -> bytes | None:
        key = self.key(record)
        return None if key is None else orjson.dumps(key)

    def pieces(self, table: TableName, snapshot: bool) -> tuple[bytes, ...]:
        """The value's 10 constant pieces around its 9 slots: before, after, source.ts_ms,
        sequence's two LSNs, txId, source.lsn, op, ts_ms. Names are JSON-encoded once."""
        text = orjson.dumps
        return (
            b'{"before":',
            b',"after":',
            b"".join(
                (
                    b',"source":{"version":', text(CONNECTOR_VERSION),
                    b',"connector":"postgresql","name":', text(self.name),
                    b',"ts_ms":',
                )
            ),
            b"".join(
                (
                    b',"snapshot":', b'"true"' if snapshot else b'"false"',
                    b',"db":', text(self.database),
                    b',"sequence":"[\\"',
                )
            ),
            b'\\",\\"',
            b"".join((b'\\"]","schema":', text(table.schema), b',"table":', text(table.name), b',"txId":')),
            b',"lsn":',
            b',"xmin":null},"op":"',
            b'","ts_ms":',
            b',"transaction":null}',
        )  # fmt: skip

    def _template(self, table: TableName, snapshot: bool) -> bytes:
        """`pieces` as one %-template (any % in a name doubled)."""
        template = self._templates.get((table, snapshot))
        if template is None:
            pieces = [piece.replace(b"%", b"%%") for piece in self.pieces(table, snapshot)]
            template = self._templates[(table, snapshot)] = b"".join(
                piece + slot for piece, slot in zip(pieces, (*_SLOTS, b""), strict=True)
            )
        return template

    def value_json(self, record: LogRecord, now_ms: int | None = None) -> bytes:
        """The envelope (module docstring) of the record as compact JSON."""
        op = record.op
        dumps = orjson.dumps
        before = b"null"
        if op in ("u", "d") and record.before is not None:
            before = dumps(self.row(record.schema, record.before))
        after = dumps(self.row(record.schema, record.values)) if op in ("c", "u", "r") else b"null"
        return self.value_from_parts(
            record.table,
            op,
            before,
            after,
            record.commit_ts,
            record.lsn,
            record.event_lsn,
            record.xid,
            now_ms if now_ms is not None else clock.now_ms(),
        )

    def value_from_parts(
        self,
        table: TableName,
        op: str,
        before: bytes,
        after: bytes,
        commit_ts: int | None,
        lsn: int,
        event_lsn: int | None,
        xid: int | None,
        now_ms: int,
    ) -> bytes:
        """The envelope around the before and after row JSON (b"null" for none)."""
        if event_lsn is None:
            event_lsn = lsn
        return self._template(table, op == "r") % (
            before,
            after,
            b"null" if commit_ts is None else b"%d" % (commit_ts // 1000),
            lsn,
            event_lsn,
            b"null" if xid is None else b"%d" % xid,
            event_lsn,
            op.encode(),
            now_ms,
        )

    def records(self, records: Iterable[LogRecord]) -> Iterator[tuple[LogRecord, bytes | None, bytes | None]]:
        """(record, key JSON, value JSON) as a keyed topic holds them: deletes followed by a
        tombstone (value None). The key is None only for truncates."""
        now_ms = 0
        for n, record in enumerate(records):
            if (
                not n & 1023
            ):  # ts_ms is the time of rendering; one clock read per 1024 records is close enough
                now_ms = clock.now_ms()
            key = self.key_json(record)
            yield record, key, self.value_json(record, now_ms)
            if record.op == "d" and record.schema.key:  # a keyless delete has no tombstone
                yield record, key, None
