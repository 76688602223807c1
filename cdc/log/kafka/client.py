"""kafka-python clients configured for the log: bounded timeouts, an idempotent batch producer
with acks=all (no loss, no reordering), topic creation and cleanup-policy checks, clear errors."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError, TopicAlreadyExistsError

from cdc.ground.errors import LogError, UsageError
from cdc.log.kafka.batch_producer import BatchProducer

TIMEOUT_MS = 15_000


def servers(bootstrap: str | list[str]) -> list[str]:
    return [s.strip() for s in bootstrap.split(",")] if isinstance(bootstrap, str) else list(bootstrap)


def _unreachable(bootstrap: str | list[str], exc: Exception) -> LogError:
    return LogError(
        f"cannot reach the Kafka broker at {','.join(servers(bootstrap))}: {type(exc).__name__}: {exc}",
        "check log.kafka.bootstrap_servers and that the broker runs (`cdc dev up kafka` starts a local one)",
    )


def admin(bootstrap: str | list[str]) -> KafkaAdminClient:
    try:
        return KafkaAdminClient(
            bootstrap_servers=servers(bootstrap), request_timeout_ms=TIMEOUT_MS, client_id="cdc-admin", bootstrap_timeout_ms=TIMEOUT_MS
        )
    except (KafkaError, OSError) as exc:
        raise _unreachable(bootstrap, exc) from None


def producer(bootstrap: str | list[str]) -> BatchProducer:
    """Idempotent, acks=all, one request in flight (cdc.log.kafka.batch_producer). Needs the
    `crc32c` package (requirements): without it kafka-python computes every record batch's CRC
    in pure Python, which costs more than everything else per record."""
    try:
        return BatchProducer(servers(bootstrap), client_id="cdc-publisher", request_timeout_ms=TIMEOUT_MS)
    except (KafkaError, OSError) as exc:
        raise _unreachable(bootstrap, exc) from None


def consumer(bootstrap: str | list[str]) -> KafkaConsumer:
    try:
        return KafkaConsumer(
            bootstrap_servers=servers(bootstrap),
            client_id="cdc-reader",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=TIMEOUT_MS + 5000,
            consumer_timeout_ms=2000,
            bootstrap_timeout_ms=TIMEOUT_MS,
        )
    except (KafkaError, OSError) as exc:
        raise _unreachable(bootstrap, exc) from None


def ensure_topics(client: KafkaAdminClient, wanted: Mapping[str, Mapping[str, str]], fix_policy: bool, replication: int) -> None:
    """Create missing topics (1 partition each: one table's events keep their order) and refuse
    existing ones that would delete data by time (cleanup.policy=delete), unless asked to fix them."""
    existing = set(client.list_topics())
    missing = {t: c for t, c in wanted.items() if t not in existing}
    if missing:
        with contextlib.suppress(TopicAlreadyExistsError):  # created concurrently by another process
            client.create_topics(
                {t: {"num_partitions": 1, "replication_factor": replication, "configs": dict(c)} for t, c in missing.items()},
                timeout_ms=TIMEOUT_MS,
            )
        client.wait_for_topics(list(missing), timeout_ms=TIMEOUT_MS)
    present = [t for t in wanted if t in existing]
    if not present:
        return
    resources = [ConfigResource(ConfigResourceType.TOPIC, t, {"cleanup.policy": None}) for t in present]
    for topic, policy in _cleanup_policies(client, resources).items():
        if "compact" in policy:
            continue
        if not fix_policy:
            raise UsageError(
                f"Kafka topic {topic} exists with cleanup.policy={policy}: old events would be deleted by age, "
                "and followers bootstrapping from the log would miss rows",
                "let us change it to compact with `log: {kafka: {fix_cleanup_policy: true}}`, or delete the topic",
            )
        client.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": "compact"})])


def _cleanup_policies(client: KafkaAdminClient, resources: list[ConfigResource]) -> dict[str, str]:
    """topic -> cleanup.policy; kafka-python 3 answers {"topic": {name: {key: {"value": ...}}}}."""
    result: Any = client.describe_configs(resources, config_filter="all")
    found: dict[str, str] = {}
    for name, configs in (result or {}).get("topic", {}).items():
        entry = configs.get("cleanup.policy")
        if entry is not None:
            found[name] = entry.get("value") if isinstance(entry, dict) else str(entry)
    return found


def end_offsets(client: KafkaConsumer, topics: list[str]) -> dict[str, int]:
    """Next offset to be written per topic (partition 0)."""
    parts = [TopicPartition(t, 0) for t in topics]
    return {tp.topic: off for tp, off in client.end_offsets(parts).items()}
