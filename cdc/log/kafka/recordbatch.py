"""Kafka record batches (message format v2), encoded without I/O: records in, bytes out.

The publisher's hot path. kafka-python's DefaultRecordBatchBuilder does the same job but
checks types and calls a varint encoder per field for every record, which made it the largest
single cost per record in the publisher; here a record is a handful of table lookups and one
join. tests/unit/test_recordbatch.py decodes every batch shape with kafka-python's own reader.

Layout (https://kafka.apache.org/documentation/#recordbatch):

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (2)
    | crc uint32 (CRC-32C of what follows) | attributes int16 | lastOffsetDelta int32
    | baseTimestamp int64 | maxTimestamp int64 | producerId int64 | producerEpoch int16
    | baseSequence int32 | recordCount int32 | records

    record: length varint | attributes int8 | timestampDelta varint | offsetDelta varint
            | keyLength varint | key | valueLength varint | value | headerCount varint
            | headers (keyLength varint | key | valueLength varint | value)...

Varints are zigzag-encoded; a null key or value has length -1.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from crc32c import crc32c

from cdc.ground.clock import now_ms

HEADER = struct.Struct(">qiibIhiqqqhii")
CRC_FROM = 21  # attributes onwards are covered by the CRC
CRC_AT = 17
NULL = b"\x01"  # zigzag(-1)


def zigzag_varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [zigzag_varint(i) for i in range(1 << 14)]


def varint(n: int) -> bytes:
    return _SMALL[n] if 0 <= n < 16384 else zigzag_varint(n)


def encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """A record's header section (count and pairs) for RecordBatchWriter.append."""
    parts = [varint(len(headers))]
    for key, value in headers:
        k = key.encode()
        parts += [varint(len(k)), k]
        parts += [NULL] if value is None else [varint(len(value)), value]
    return b"".join(parts)


NO_HEADERS = encode_headers(())
_LSN, _SEQ, _TS, _SV = (varint(len(k)) + k for k in (b"cdc.lsn", b"cdc.seq", b"cdc.ts", b"cdc.sv"))
_FOUR = varint(4)


def position_headers(lsn: int, seq: int, commit_ts: int, schema_version: int) -> bytes:
    """encode_headers of the publisher's headers cdc.lsn, cdc.seq, cdc.ts, cdc.sv (decimal text)."""
    a, b, c, d = b"%d" % lsn, b"%d" % seq, b"%d" % commit_ts, b"%d" % schema_version
    small = _SMALL
    return b"".join(
        (_FOUR, _LSN, small[len(a)], a, _SEQ, small[len(b)], b, _TS, small[len(c)], c, _SV, small[len(d)], d)
    )


class RecordBatchWriter:
    """Collects records for one batch; build() returns the batch's bytes.

    Every record gets the batch's timestamp (delta 0): the publisher stamps a batch when it
    starts it, as CreateTime."""

    __slots__ = ("_records", "_size", "limit", "timestamp")

    def __init__(self, timestamp_ms: int, limit: int = 1 << 20):
        self.limit = limit
        self.timestamp = timestamp_ms
        self._records: list[bytes] = []
        self._size = HEADER.size

    def __len__(self) -> int:
        return len(self._records)

    def append(self, key: bytes | None, value: bytes | None, headers: bytes = NO_HEADERS) -> bool:
        """Add a record; False (and nothing added) when it would exceed the limit and the batch
        is not empty (a record larger than the limit goes into a batch of its own)."""
        small = _SMALL
        n = len(self._records)
        body = b"".join(
            (
                b"\x00\x00",  # attributes, timestamp delta
                small[n] if n < 16384 else zigzag_varint(n),
                NULL if key is None else varint(len(key)),
                key or b"",
                NULL if value is None else varint(len(value)),
                value or b"",
                headers,
            )
        )
        size = len(body)
        record = (small[size] if size < 16384 else zigzag_varint(size)) + body
        if n and self._size + len(record) > self.limit:
            return False
        self._records.append(record)
        self._size += len(record)
        return True

    def body(self) -> RecordsBody:
        """The records without the batch header: what render workers hand to the producer,
        which frames them with its producer id and sequence (frame_batch)."""
        return RecordsBody(b"".join(self._records), len(self._records), self.timestamp)

    def build(self, producer_id: int, producer_epoch: int, base_sequence: int) -> bytes:
        return frame_batch(self.body(), producer_id, producer_epoch, base_sequence)


def batched(records: Iterable[tuple[bytes | None, bytes | None, bytes]], limit: int) -> Iterator[RecordsBody]:
    """(key, value, encoded headers) records as batch bodies of at most `limit` bytes (a larger
    record alone), each stamped with the time it was started."""
    batch = RecordBatchWriter(now_ms(), limit)
    for key, value, headers in records:
        if not batch.append(key, value, headers):
            yield batch.body()
            batch = RecordBatchWriter(now_ms(), limit)
            batch.append(key, value, headers)
    if len(batch):
        yield batch.body()


class RecordsBody(NamedTuple):
    records: bytes
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, which nothing here calls
    timestamp: int


def frame_batch(body: RecordsBody, producer_id: int, producer_epoch: int, base_sequence: int) -> bytes:
    """The batch header in front of `body`, with its CRC."""
    buf = bytearray(HEADER.size)
    buf += body.records
    HEADER.pack_into(
        buf, 0,
        0,  # base offset: the broker assigns it
        len(buf) - 12,  # length after this field
        0,  # partition leader epoch: the broker sets it
        2,  # magic
        0,  # crc, below
        0,  # attributes: no compression, CreateTime, not transactional
        body.count - 1,
        body.timestamp,
        body.timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        body.count,
    )  # fmt: skip
    struct.pack_into(">I", buf, CRC_AT, crc32c(memoryview(buf)[CRC_FROM:]))
    return bytes(buf)
