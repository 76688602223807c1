"""What a read of the embedded log is made of, usable without a LocalLog (Spark executors and the
Kafka publisher decode parts themselves): the parts a range is split into, and stored rows and
snapshot lines decoded to LogRecords."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cdc.ground.tables import TableName
from cdc.keys import key_from_copy_fields, position_key, snapshot_seq
from cdc.log.base import LogRecord, TableSchema
from cdc.pgoutput import decode_tuple


def decode_text_tuple(payload: bytes | None) -> list[Any] | None:
    """pgoutput TupleData -> [str | None | UNCHANGED, ...]."""
    if not payload:
        return None
    values, _ = decode_tuple(payload, 0)
    return [v.decode() if isinstance(v, bytes) else v for v in values]


def snapshot_record(
    table: TableName, part: SegmentSlice, schema: TableSchema, line: bytes, at: int = 0
) -> LogRecord:
    """One line (newline removed) of a snapshot segment slice as the 'r' record read_part gives;
    `at`: the byte offset the line starts at in its segment file, which makes a keyless table's row
    position (its seq, cdc.keys.snapshot_seq, and its key)."""
    fields = line.split(b"\t")
    seq = 0
    if schema.key:
        key = key_from_copy_fields(fields, schema.key_indexes)
    else:
        seq = snapshot_seq(part.off, at)
        key = position_key(part.lsn, seq)
    values = copy_fields_to_values(fields)
    commit_ts = part.ts_ms * 1000 if part.ts_ms else None  # snapshot rows: the snapshot's time
    return LogRecord(
        table,
        part.off,
        part.lsn,
        seq,
        "r",
        key,
        values,
        None,
        None,
        schema,
        None,
        commit_ts,
        part.lsn,
        part.version,
    )


def event_record(table: TableName, row: tuple[Any, ...], schema: TableSchema) -> LogRecord:
    """One stored event row (columns store.EV_COLUMNS) as the record read_part gives."""
    off, lsn, seq, op, key, payload, before, before_kind, sv, xid, ts, elsn = row
    values, before_values = decode_text_tuple(payload), decode_text_tuple(before)
    return LogRecord(
        table, off, lsn, seq, op, key, values, before_values, before_kind, schema, xid, ts, elsn, sv
    )


@dataclass(frozen=True)
class EventRun:
    """Event rows after < off <= upto (snapshot markers excluded: their rows are SegmentSlices)."""

    after: int
    upto: int


@dataclass(frozen=True)
class SegmentSlice:
    """The lines of a snapshot segment file (path relative to the log) starting in [start, end),
    read as the rows of the marker at offset `off`."""

    off: int
    lsn: int
    version: int
    path: str
    start: int
    end: int
    ts_ms: int = 0  # when the snapshot started (its rows' commit time; 0: not known)


ReadPart = EventRun | SegmentSlice


def copy_fields_to_values(fields: list[bytes]) -> list[str | None]:
    from cdc.keys import unescape

    # Most fields hold no backslash: decoded without a function call each.
    return [f.decode() if b"\\" not in f else None if f == b"\\N" else unescape(f).decode() for f in fields]
