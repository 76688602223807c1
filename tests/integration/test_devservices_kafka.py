"""The local Kafka broker (pipelines/devservices/kafka.py) is a real Kafka 4.x: kafka-python creates
compacted topics on it, writes with the idempotent acks=all producer the log uses, reads back in
order with headers and tombstones; the cleaner really compacts; a restart (and a crash) keeps the
data on the same address; `cdc dev up|status|down kafka` manage it from separate processes."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType

from pipelines.devservices.base import pid_alive, port_open
from pipelines.devservices.kafka import LocalKafka
from tests.fixtures.topics import topic_records as read_all
from tests.harness import cdc

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000


# ---- helpers -------------------------------------------------------------------------------------------
def topic_name(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def admin(bootstrap: str) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=[bootstrap], request_timeout_ms=TIMEOUT_MS, bootstrap_timeout_ms=TIMEOUT_MS
    )


def create_compacted(bootstrap: str, topic: str, **configs: str) -> None:
    client = admin(bootstrap)
    try:
        client.create_topics(
            {
                topic: {
                    "num_partitions": 1,
                    "replication_factor": 1,
                    "configs": {"cleanup.policy": "compact", **configs},
                }
            },
            timeout_ms=TIMEOUT_MS,
            wait_for_metadata=True,
        )
    finally:
        client.close()


def topic_config(bootstrap: str, topic: str, key: str) -> str | None:
    """One topic config value from DescribeConfigs (kafka-python 3 answers
    {"topic": {name: {key: {"value": ..., "config_source": ...}}}})."""
    client = admin(bootstrap)
    try:
        result = client.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {key: None})], config_filter="all"
        )
    finally:
        client.close()
    entry = result.get("topic", {}).get(topic, {}).get(key)
    return entry["value"] if entry else None


def producer(bootstrap: str) -> KafkaProducer:
    return KafkaProducer(
        bootstrap_servers=[bootstrap],
        acks="all",
        enable_idempotence=True,
        request_timeout_ms=TIMEOUT_MS,
        bootstrap_timeout_ms=TIMEOUT_MS,
    )


def produce(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes, bytes | None]],
    headers: list[tuple[str, bytes]] | None = None,
) -> list[int]:
    """Send keyed records (value None = tombstone); returns their offsets once all are acknowledged."""
    p = producer(bootstrap)
    try:
        futures = [p.send(topic, key=k, value=v, headers=headers or []) for k, v in records]
        p.flush(timeout=30)
        return [f.get(timeout=30).offset for f in futures]
    finally:
        p.close(timeout=10)


@pytest.fixture
def tmp_base() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="cdc-test-kafka-cli-"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


# ---- the broker ----------------------------------------------------------------------------------------
def test_broker_is_up_on_loopback(kafka: LocalKafka) -> None:
    assert kafka.running()
    host, port = kafka.bootstrap.split(":")
    assert host == "127.0.0.1" and int(port) == kafka.port
    assert kafka.env() == {"KAFKA_BOOTSTRAP": kafka.bootstrap}
    assert kafka.pid() is not None and pid_alive(kafka.pid())
    assert kafka.controller_port and kafka.controller_port != kafka.port
    props = kafka.config_file.read_text()
    assert "process.roles=broker,controller" in props
    assert f"controller.quorum.bootstrap.servers=127.0.0.1:{kafka.controller_port}" in props
    # loopback only: the listeners are bound to 127.0.0.1, not to the wildcard address
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and int(local.split(":")[1], 16) in (kafka.port, kafka.controller_port):
            assert local.split(":")[0] == "0100007F", line
    assert (kafka.base_dir / "kafka.log").stat().st_size > 0  # log4j2 writes the broker log there


def test_compacted_topic_idempotent_produce_and_consume(kafka: LocalKafka) -> None:
    topic = topic_name("compacted")
    create_compacted(kafka.bootstrap, topic)
    client = admin(kafka.bootstrap)
    try:
        assert topic in client.list_topics()
    finally:
        client.close()
    assert topic_config(kafka.bootstrap, topic, "cleanup.policy") == "compact"

    records = [(b'{"id":1}', b"v1"), (b'{"id":2}', b"v1"), (b'{"id":1}', b"v2"), (b'{"id":2}', None)]
    offsets = produce(kafka.bootstrap, topic, records, headers=[("op", b"c")])
    assert offsets == [0, 1, 2, 3]

    got = read_all(kafka.bootstrap, topic)
    assert [(r.key, r.value) for r in got] == records  # order kept, tombstone is a null value
    assert [r.offset for r in got] == offsets
    assert all(list(r.headers) == [("op", b"c")] for r in got)


def test_restart_keeps_address_and_data(kafka: LocalKafka) -> None:
    topic = topic_name("restart")
    create_compacted(kafka.bootstrap, topic)
    produce(kafka.bootstrap, topic, [(b"k1", b"a"), (b"k2", b"b")])
    address, old_pid = kafka.bootstrap, kafka.pid()

    kafka.restart()

    assert kafka.bootstrap == address and kafka.running() and kafka.pid() != old_pid
    assert not pid_alive(old_pid)
    assert [(r.key, r.value) for r in read_all(kafka.bootstrap, topic)] == [(b"k1", b"a"), (b"k2", b"b")]
    # a new producer after the restart appends where the log ended
    assert produce(kafka.bootstrap, topic, [(b"k1", b"c")]) == [2]


def test_crash_and_restart_keeps_acknowledged_data(own_kafka: LocalKafka) -> None:
    broker = own_kafka
    topic = topic_name("crash")
    create_compacted(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [(f"k{i}".encode(), b"x" * 100) for i in range(50)])
    broker.kill()  # SIGKILL: no controlled shutdown
    assert not broker.running()
    broker.start()
    assert len(read_all(broker.bootstrap, topic)) == 50


def test_settings_overrides_make_compaction_run(compacting_kafka: LocalKafka) -> None:
    broker = compacting_kafka  # started with tests.fixtures.kafka.COMPACTING overrides
    assert "log.segment.bytes=1048576" in broker.config_file.read_text()
    topic = topic_name("compaction")
    create_compacted(broker.bootstrap, topic)
    keys = [f'{{"id":{i}}}'.encode() for i in range(5)]
    written = 0
    for version in range(60):  # 5 keys x 60 versions x 10 KB = 3 MB: three segments or more
        produce(broker.bootstrap, topic, [(k, f"{version}:".encode() + b"x" * 10_000) for k in keys])
        written += len(keys)
    produce(broker.bootstrap, topic, [(keys[0], None)])  # a tombstone survives (delete.retention.ms is 1 day)
    written += 1

    deadline = time.monotonic() + 90
    while True:
        got = read_all(broker.bootstrap, topic)
        if len(got) < written / 2:
            break
        assert time.monotonic() < deadline, (
            f"no compaction after 90 s: {len(got)} of {written} records still there"
        )
        time.sleep(1)
    latest: dict[bytes, bytes | None] = {}
    for r in got:
        latest[r.key] = r.value
    assert latest[keys[0]] is None
    assert all(latest[k] is not None and latest[k].startswith(b"59:") for k in keys[1:])
    assert [r.offset for r in got] == sorted(r.offset for r in got)


# ---- cdc dev up|status|down kafka ----------------------------------------------------------------------
def test_cli_dev_up_status_down(tmp_base: Path) -> None:
    up = cdc("dev", "up", "kafka", "--dir", tmp_base, timeout=180)
    try:
        assert up.code == 0, up.out + up.err
        lines = [line for line in up.out.splitlines() if line.startswith("export KAFKA_BOOTSTRAP=")]
        assert len(lines) == 1, up.out
        bootstrap = lines[0].split("=", 1)[1]
        host, port = bootstrap.split(":")
        assert host == "127.0.0.1" and port_open(int(port))

        # the broker outlives the `cdc dev up` process and serves requests
        topic = topic_name("cli")
        create_compacted(bootstrap, topic)
        assert produce(bootstrap, topic, [(b"k", b"v")]) == [0]

        status = cdc("dev", "status", "kafka", "--dir", tmp_base)
        assert status.code == 0 and f"kafka: running KAFKA_BOOTSTRAP={bootstrap}" in status.out, (
            status.out + status.err
        )

        # already running: same address, no second broker
        again = cdc("dev", "up", "kafka", "--dir", tmp_base)
        assert again.code == 0 and f"KAFKA_BOOTSTRAP={bootstrap}" in again.out
        pid = LocalKafka(tmp_base / "kafka").pid()
        assert pid is not None
    finally:
        down = cdc("dev", "down", "kafka", "--dir", tmp_base, timeout=120)
    assert down.code == 0 and "kafka: stopped" in down.out, down.out + down.err
    assert not LocalKafka(tmp_base / "kafka").running()
    assert not port_open(int(port))

    after = cdc("dev", "status", "kafka", "--dir", tmp_base)
    assert "kafka: stopped" in after.out
    again = cdc("dev", "down", "kafka", "--dir", tmp_base)
    assert again.code == 0 and "kafka: not running" in again.out
