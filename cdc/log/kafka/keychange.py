"""Debezium's primary-key-change headers on the records of a key change.

An UPDATE that changes a row's key is logged as a delete of the old key and a create of the new
one (cdc/stream/changes.py): one WAL record, so the two events share the commit LSN and the event LSN,
and have consecutive sequence numbers. Debezium's PostgreSQL connector marks such a pair with
message headers (RelationalChangeRecordEmitter): the DELETE record (and the tombstone after it)
carries `__debezium.newkey` = the new key, the CREATE record `__debezium.oldkey` = the old key.
Here the header values are the keys' JSON as in the records' keys (`{"id":2}`).

`mark` is applied to the records of a part by both renderers (render.python_records and
fastpath.event_records), so the C speedup and the Python path give the same bytes. A part never
ends between the two events of a pair (LocalLog.read_parts).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from cdc.log.kafka.recordbatch import varint

OLDKEY = b"__debezium.oldkey"
NEWKEY = b"__debezium.newkey"

# (op, commit lsn, seq, event lsn) of the event a record belongs to
Position = tuple[str, int, int, int | None]
Record = tuple[bytes, bytes | None, bytes]  # key, value (None: tombstone), encoded headers


def is_key_change(delete: Position, create: Position) -> bool:
    """Whether two consecutive events are the halves of one key-changing UPDATE."""
    return (
        delete[0] == "d"
        and create[0] == "c"
        and delete[1] == create[1]
        and create[2] == delete[2] + 1
        and delete[3] is not None
        and delete[3] == create[3]
    )


def _read_varint(data: bytes) -> tuple[int, int]:
    """(value, length) of the zigzag varint at the start of `data`."""
    raw = shift = i = 0
    while True:
        byte = data[i]
        raw |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), i
        shift += 7


def with_header(headers: bytes, name: bytes, value: bytes) -> bytes:
    """An encoded header section with one more header at its end."""
    count, used = _read_varint(headers)
    return varint(count + 1) + headers[used:] + varint(len(name)) + name + varint(len(value)) + value


def mark(items: Iterable[tuple[Position, Record]]) -> Iterator[Record]:
    """The records, those of key changes with Debezium's headers. `items` pairs each record with
    its event's position; a delete's tombstone has the delete's position."""
    held: list[tuple[Position, Record]] = []  # a delete and its tombstone, until the next event shows
    for pos, record in items:
        if held and pos == held[0][0]:
            held.append((pos, record))  # the tombstone of the held delete
            continue
        if held and is_key_change(held[0][0], pos):
            old_key, new_key = held[0][1][0], record[0]
            for _, (key, value, headers) in held:
                yield key, value, with_header(headers, NEWKEY, new_key)
            held = []
            key, value, headers = record
            yield key, value, with_header(headers, OLDKEY, old_key)
            continue
        for _, held_record in held:
            yield held_record
        held = []
        if pos[0] == "d":
            held.append((pos, record))
        else:
            yield record
    for _, held_record in held:
        yield held_record
