"""Rendering staging-log parts with the C speedup (cdc._render): stored rows straight to records.

The Python path (render.python_records) decodes each stored row into a LogRecord, fills
unchanged TOAST values, converts every value and serializes a dict. Here one C call per row
image gives its key and row JSON from the stored bytes (pgoutput TupleData or a COPY line),
and the envelope is the renderer's template around them. The records are the same bytes
either way (tests/unit/test_render_speedups.py renders parts both ways and compares).

A row the C code declines (see cdc/_render.c) is rendered the Python way, on its own. A run
of events holding an update with an unchanged TOAST value is left wholly to the Python path
(event_records returns None): filling those values keeps state across the run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from cdc.envelope import TRUNCATE_KEY, EnvelopeRenderer, _render
from cdc.log.kafka.recordbatch import RecordsBody
from cdc.log.local import EventRun, LocalLog, SegmentSlice, event_record, snapshot_record
from cdc.pgoutput import UNCHANGED
from cdc.tables import TableName

Record = tuple[bytes, bytes | None, bytes]  # key, value (None: tombstone), encoded headers

_MARK = b"\x00after\x00"  # cannot occur in JSON: splits a value template around the after image


def _now_ms() -> int:
    return int(time.time() * 1000)


def bodies(records: list[Record], limit: int) -> Iterator[RecordsBody]:
    """recordbatch.batched of a list of records, encoded in C: the same batch bodies."""
    start = 0
    while start < len(records):
        timestamp = _now_ms()
        data, count = _render.encode_batch(records, start, limit)
        yield RecordsBody(data, count, timestamp)
        start += count


def snapshot_records(
    renderer: EnvelopeRenderer, log: LocalLog, table: TableName, part: SegmentSlice
) -> list[Record]:
    """The slice's rows as 'r' records (snapshot rows share one position, so one header)."""
    schema = log.schema(table, part.version)
    render = renderer.c_plan(schema).render
    copy, flags = _render.COPY, _render.WANT_KEY | _render.WANT_ROW | _render.ALLOW_UNCHANGED
    headers = _render.position_headers(part.lsn, 0, 0, part.version)
    out: list[Record] = []
    append = out.append
    head = tail = b""
    now_ms = 0
    for n, line in enumerate(log.segment_lines(part)):
        if not n & 1023:  # ts_ms: as EnvelopeRenderer.records reads the clock
            now_ms = _now_ms()
            head, _, tail = renderer.value_from_parts(
                table, "r", b"null", _MARK, None, part.lsn, part.lsn, None, now_ms
            ).partition(_MARK)
        rendered = render(line, copy, flags)
        if rendered is None:
            record = snapshot_record(table, part, schema, line)
            append((renderer.key_json(record) or TRUNCATE_KEY, renderer.value_json(record, now_ms), headers))
        else:
            append((rendered[0], head + rendered[1] + tail, headers))
    return out


def event_records(
    renderer: EnvelopeRenderer, log: LocalLog, table: TableName, part: EventRun
) -> list[Record] | None:
    """The run's events as records (a tombstone after each delete), or None when an update in it
    has unchanged TOAST values to fill."""
    tupledata = _render.TUPLEDATA
    key_row, row_only = _render.WANT_KEY | _render.WANT_ROW, _render.WANT_ROW | _render.ALLOW_UNCHANGED
    key_row_unchanged = key_row | _render.ALLOW_UNCHANGED
    position_headers = _render.position_headers
    plans: dict[int, tuple] = {}
    out: list[Record] = []
    append = out.append
    # The envelope template and op of each op (value_from_parts, inlined: this loop is the hot path).
    ops = {op: (renderer.template(table, op == "r"), op.encode()) for op in "cudr"}
    now_ms = 0
    for n, row in enumerate(log.event_rows(table, part)):
        _, lsn, seq, op, _, payload, before, _, sv, xid, ts, elsn = row
        if not n & 1023:
            now_ms = _now_ms()
        headers = position_headers(lsn, seq, ts or 0, sv)  # each event has a position of its own
        entry = plans.get(sv)
        if entry is None:
            schema = log.schema(table, sv)
            entry = plans[sv] = (schema, renderer.c_plan(schema).render)
        schema, render = entry
        rendered = None
        before_json = b"null"
        if op == "c" or op == "r":
            rendered = render(payload, tupledata, key_row_unchanged) if payload else None
        elif op == "u":
            rendered = render(payload, tupledata, key_row) if payload else None
            if rendered is False:
                return None
            if rendered is not None and before:
                image = render(before, tupledata, row_only)
                if image is None:
                    rendered = None
                else:
                    before_json = image[1]
        elif op == "d" and before:
            image = render(before, tupledata, key_row_unchanged)
            if image is not None:
                rendered, before_json = (image[0], b"null"), image[1]
        if rendered is None:  # a row for the Python path (truncates too)
            record = event_record(table, row, schema)
            if op == "u" and UNCHANGED in (record.values or ()):
                return None
            key_json = renderer.key_json(record)
            value = renderer.value_json(record, now_ms)
        else:
            key_json = rendered[0]
            template, op_bytes = ops[op]
            event_lsn = lsn if elsn is None else elsn
            value = template % (
                before_json,
                rendered[1],
                b"null" if ts is None else b"%d" % (ts // 1000),
                lsn,
                event_lsn,
                b"null" if xid is None else b"%d" % xid,
                event_lsn,
                op_bytes,
                now_ms,
            )
        key_json = key_json if key_json is not None else TRUNCATE_KEY
        append((key_json, value, headers))
        if op == "d":
            append((key_json, None, headers))
    return out
