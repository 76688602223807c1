"""The publisher's batch producer (cdc/log/kafka/batch_producer.py) against a real broker:
records split over several batches arrive once, in order, with keys, values, tombstones and
headers; the offsets it reports are the broker's; a batch sent twice (a retry after a lost
answer) is written once; a restarted broker is waited for, not skipped."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from cdc.log.kafka import client as kc
from cdc.log.kafka.batch_producer import BatchProducer
from cdc.log.kafka.recordbatch import NO_HEADERS, RecordBatchWriter, encode_headers
from pipelines.devservices.kafka import LocalKafka
from tests.fixtures.topics import end_offset, topic_records

pytestmark = pytest.mark.integration


def new_topic(kafka: LocalKafka) -> str:
    topic = f"bp_{uuid.uuid4().hex[:10]}"
    admin = kc.admin(kafka.bootstrap)
    try:
        kc.ensure_topics(admin, {topic: {"cleanup.policy": "compact"}}, fix_policy=False, replication=1)
    finally:
        admin.close()
    return topic


def test_records_over_many_batches_arrive_once_in_order(kafka: LocalKafka) -> None:
    topic = new_topic(kafka)
    producer = BatchProducer([kafka.bootstrap], batch_bytes=16 << 10)  # ~14 records per batch
    records = [
        (
            f'{{"id":{i}}}'.encode(),
            None if i % 7 == 0 else (b"v%d-" % i) * 100,
            [("cdc.lsn", str(i).encode())],
        )
        for i in range(1000)
    ]
    encoded = [(k, v, encode_headers(h)) for k, v, h in records]
    try:
        first, last, n = producer.send(topic, iter(encoded))
        again = producer.send(topic, iter(encoded[:3]))  # the sequence continues across sends
    finally:
        producer.close()
    assert (first, last, n) == (0, 999, 1000)
    assert again == (1000, 1002, 3)
    got = topic_records(kafka.bootstrap, topic)
    assert [r.offset for r in got] == list(range(1003))
    assert [(r.key, r.value, r.headers) for r in got[:1000]] == records
    assert got[0].value is None  # a tombstone stays a tombstone


def test_a_batch_sent_twice_is_written_once(kafka: LocalKafka) -> None:
    """What makes retries safe: the same bytes (same producer id and sequence) sent again after
    the first answer was lost are deduplicated by the broker, which answers with the same offset."""
    topic = new_topic(kafka)
    producer = BatchProducer([kafka.bootstrap])
    try:
        producer.send(topic, [(b"k0", b"v0", NO_HEADERS)])
        batch = RecordBatchWriter(int(time.time() * 1000))
        batch.append(b"k1", b"v1")
        data = batch.build(producer._producer_id, producer._epoch, 1)
        answers = []
        for _ in range(2):
            future = producer._produce(topic, data)
            producer._client.poll(timeout_ms=15_000, future=future)
            part = future.value.responses[0].partition_responses[0]
            answers.append((part.error_code, part.base_offset))
    finally:
        producer.close()
    assert answers == [(0, 1), (0, 1)]
    assert end_offset(kafka.bootstrap, topic) == 2
    assert [(r.key, r.value) for r in topic_records(kafka.bootstrap, topic)] == [
        (b"k0", b"v0"),
        (b"k1", b"v1"),
    ]


def test_waits_for_a_restarting_broker(kafka: LocalKafka) -> None:
    topic = new_topic(kafka)
    producer = BatchProducer([kafka.bootstrap], request_timeout_ms=5000, retry_s=120)
    # set just before the broker is started again: a send answered while `kafka.start()` still waits
    # for the broker to report ready has waited through the outage too
    sending, restarting = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def send() -> None:
        sending.set()
        try:
            outcome["result"] = producer.send(topic, [(b"b", b"2", NO_HEADERS), (b"c", b"3", NO_HEADERS)])
        except Exception as exc:  # reported below
            outcome["error"] = exc
        outcome["returned_after_restart"] = restarting.is_set()

    try:
        producer.send(topic, [(b"a", b"1", NO_HEADERS)])
        kafka.stop()  # down before the send starts, so the send overlaps the outage by construction
        sender = threading.Thread(target=send, daemon=True)
        try:
            sender.start()
            sending.wait()
            time.sleep(6)  # the outage outlasts a request timeout (5 s): the send must retry, not give up
            restarting.set()
            kafka.start()
        finally:
            if not kafka.running():
                kafka.start()  # the session broker stays up for the next tests
        sender.join()
    finally:
        producer.close()
    assert "error" not in outcome, outcome
    # the send was neither answered nor given up while the broker was down: it waited for it
    assert outcome["returned_after_restart"] is True, outcome
    result = outcome["result"]
    assert result == (1, 2, 2)
    assert [(r.key, r.value) for r in topic_records(kafka.bootstrap, topic)] == [
        (b"a", b"1"),
        (b"b", b"2"),
        (b"c", b"3"),
    ]
