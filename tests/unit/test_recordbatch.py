"""Record batches from cdc/log/kafka/recordbatch.py decode with kafka-python's own reader:
keys, values, nulls, headers, offsets, timestamps, producer id/epoch/sequence and the CRC."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.util import decode_varint as kafka_decode_varint
from kafka.record.util import encode_varint as kafka_encode_varint

from cdc.log.kafka.recordbatch import (
    NO_HEADERS,
    RecordBatchWriter,
    encode_headers,
    position_headers,
    varint,
)

pytestmark = pytest.mark.unit


def decode(data: bytes) -> DefaultRecordBatch:
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc()
    return batch


def test_varints_match_zigzag_encoding() -> None:
    assert [varint(n) for n in (0, -1, 1, 63, 64, 8191, 8192)] == [
        b"\x00", b"\x01", b"\x02", b"\x7e", b"\x80\x01", b"\xfe\x7f", b"\x80\x80\x01"
    ]  # fmt: skip
    # beyond the literals, kafka-python's own encoder and decoder are the reference (the table of
    # small values and the computed path alike, incl. both sides of the 16384 boundary)
    for n in (
        *range(0, 300),
        8191,
        8192,
        16382,
        16383,
        16384,
        16385,
        10**6,
        2**31 - 1,
        -1,
        -64,
        -(2**20),
        -(2**31),
    ):
        expected = bytearray()
        kafka_encode_varint(n, expected.append)
        assert varint(n) == bytes(expected), n
        assert kafka_decode_varint(varint(n), 0) == (n, len(expected)), n


def test_batch_decodes_with_kafka_python() -> None:
    writer = RecordBatchWriter(timestamp_ms=1_700_000_000_123)
    records = [
        (b'{"id":1}', b'{"op":"c"}', encode_headers([("cdc.lsn", b"42"), ("cdc.seq", b"0")])),
        (b'{"id":1}', None, NO_HEADERS),  # a tombstone
        (None, b"no key", encode_headers([("h", None)])),
        (b"", b"", NO_HEADERS),  # empty is not null
        (b"k" * 20000, b"v" * 100000, NO_HEADERS),  # lengths past the varint table
    ]
    for key, value, headers in records:
        assert writer.append(key, value, headers)
    batch = decode(writer.build(producer_id=77, producer_epoch=3, base_sequence=1000))
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (77, 3, 1000)
    assert batch.magic == 2 and batch.compression_type == 0 and not batch.is_transactional
    got = list(batch)
    assert [r.offset for r in got] == [0, 1, 2, 3, 4]
    assert {r.timestamp for r in got} == {1_700_000_000_123}
    assert [(r.key, r.value) for r in got] == [(k, v) for k, v, _ in records]
    assert got[0].headers == [("cdc.lsn", b"42"), ("cdc.seq", b"0")]
    assert got[2].headers == [("h", None)]
    assert got[1].headers == []


def test_position_headers_are_the_publishers_four() -> None:
    writer = RecordBatchWriter(timestamp_ms=1)
    writer.append(b"k", b"v", position_headers(123456789, 7, 1_700_000_000_000_000, 2))
    (record,) = decode(writer.build(1, 0, 0))
    assert record.headers == [
        ("cdc.lsn", b"123456789"), ("cdc.seq", b"7"), ("cdc.ts", b"1700000000000000"), ("cdc.sv", b"2")
    ]  # fmt: skip


def test_limit_splits_batches_but_never_refuses_a_first_record() -> None:
    writer = RecordBatchWriter(timestamp_ms=1, limit=1000)
    assert writer.append(b"k", b"x" * 5000)  # alone in its batch, even though larger than the limit
    assert not writer.append(b"k", b"y")
    assert len(writer) == 1
    small = RecordBatchWriter(timestamp_ms=1, limit=1000)
    added = 0
    while small.append(b"k", b"z" * 90):
        added += 1
    data = small.build(1, 0, 0)
    assert len(data) <= 1000 and added == len(small) == len(list(decode(data)))
