"""Rendering staging-log parts with the C speedup (cdc._render): stored rows straight to records.

The Python path (render.python_records) decodes each stored row into a LogRecord, fills
unchanged TOAST values, converts every value and serializes a dict. Here C does the work from
the stored bytes: a run of events is one render_events call (keys, envelopes around the
EnvelopeRenderer's pieces, position headers, tombstones), a snapshot slice one Plan.render
call per COPY line, and the records are encoded into batches by encode_batch. The records are
the same bytes either way (tests/unit/test_render_speedups.py renders parts both ways).

A row the C code declines (see cdc/_render.c) is rendered the Python way, on its own, in its
place. A run of events holding an update with an unchanged TOAST value is left wholly to the
Python path (event_records returns None): filling those values keeps state across the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from cdc.envelope import TRUNCATE_KEY, EnvelopeRenderer, _render, position_key_json
from cdc.ground import clock
from cdc.ground.tables import TableName
from cdc.keys import snapshot_seq
from cdc.log.kafka import keychange
from cdc.log.kafka.recordbatch import RecordsBody
from cdc.log.local import EventRun, LocalLog, SegmentSlice, event_record, snapshot_record
from cdc.pgoutput import UNCHANGED

Record = tuple[bytes, bytes | None, bytes]  # key, value (None: tombstone), encoded headers

_MARK = b"\x00after\x00"  # cannot occur in JSON: splits a value template around the after image


def bodies(records: list[Record], limit: int) -> Iterator[RecordsBody]:
    """recordbatch.batched of a list of records, encoded in C: the same batch bodies."""
    start = 0
    while start < len(records):
        timestamp = clock.now_ms()
        data, count = _render.encode_batch(records, start, limit)
        yield RecordsBody(data, count, timestamp)
        start += count


def snapshot_records(
    renderer: EnvelopeRenderer, log: LocalLog, table: TableName, part: SegmentSlice
) -> list[Record]:
    """The slice's rows as 'r' records (snapshot rows share one position, so one header; a keyless
    table's rows each have their own, from the line's byte offset: cdc.keys.snapshot_seq)."""
    schema = log.schema(table, part.version)
    render = renderer.c_plan(schema).render
    copy, flags = _render.COPY, _render.WANT_KEY | _render.WANT_ROW | _render.ALLOW_UNCHANGED
    keyless = not schema.key
    ts_us = part.ts_ms * 1000  # the snapshot's time: source.ts_ms and the cdc.ts header (0: not known)
    headers = _render.position_headers(part.lsn, 0, ts_us, part.version)
    out: list[Record] = []
    append = out.append
    head = tail = b""
    now_ms = 0
    for n, (at, line) in enumerate(log.segment_lines_at(part)):
        if not n & 1023:  # ts_ms: as EnvelopeRenderer.records reads the clock
            now_ms = clock.now_ms()
            head, _, tail = renderer.value_from_parts(
                table, "r", b"null", _MARK, ts_us or None, part.lsn, part.lsn, None, now_ms
            ).partition(_MARK)
        rendered = render(line, copy, flags)
        if keyless:
            seq = snapshot_seq(part.off, at)
            headers = _render.position_headers(part.lsn, seq, ts_us, part.version)
        if rendered is None:
            record = snapshot_record(table, part, schema, line, at)
            append((renderer.key_json(record) or TRUNCATE_KEY, renderer.value_json(record, now_ms), headers))
        elif keyless:
            append((position_key_json(part.lsn, seq), head + rendered[1] + tail, headers))
        else:
            append((rendered[0], head + rendered[1] + tail, headers))
    return out


def event_records(
    renderer: EnvelopeRenderer, log: LocalLog, table: TableName, part: EventRun
) -> list[Record] | None:
    """The run's events as records (a tombstone after each delete), or None when an update in it
    has unchanged TOAST values to fill."""
    rows = log.event_rows(table, part).fetchall()

    def plan_for(sv: int) -> Any:  # a cdc._render.Plan (C, untyped)
        return renderer.c_plan(log.schema(table, sv))

    pieces, snapshot_pieces = renderer.pieces(table, False), renderer.pieces(table, True)
    rendered = _render.render_events(rows, plan_for, pieces, snapshot_pieces, clock.now_ms)
    if rendered is False:
        return None
    records, fallbacks = rendered
    for at, row_index in reversed(fallbacks):  # rows the C code left to Python (truncates too)
        row = rows[row_index]
        record = event_record(table, row, log.schema(table, row[8]))
        if record.op == "u" and UNCHANGED in (record.values or ()):
            return None
        key = renderer.key_json(record) or TRUNCATE_KEY
        headers = _render.position_headers(
            record.lsn, record.seq, record.commit_ts or 0, record.schema_version
        )
        value = renderer.value_json(record, clock.now_ms())
        records[at : at + 1] = (
            [(key, value, headers), (key, None, headers)] if record.op == "d" else [(key, value, headers)]
        )
    keyless: dict[int, bool] = {}

    def is_keyless(sv: int) -> bool:
        if sv not in keyless:
            keyless[sv] = not log.schema(table, sv).key
        return keyless[sv]

    return list(keychange.mark(_positioned(rows, records, is_keyless)))


def _positioned(
    rows: list[tuple[Any, ...]], records: list[Record], keyless: Callable[[int], bool]
) -> Iterator[tuple[keychange.Position, Record]]:
    """Each record with its row's position (a delete's row gives two records: it and its tombstone).
    A keyless table's record is keyed by its position and its delete has no tombstone (as
    EnvelopeRenderer.records gives them: cdc/envelope.py)."""
    at = 0
    for row in rows:  # off, lsn, seq, op, key, payload, before, before_kind, sv, xid, ts, elsn
        event = (row[3], row[1], row[2], row[11])
        count = 2 if row[3] == "d" else 1
        if row[3] != "t" and keyless(row[8]):
            _, value, headers = records[at]
            yield event, (position_key_json(row[1], row[2]), value, headers)
        else:
            for i in range(count):
                yield event, records[at + i]
        at += count
