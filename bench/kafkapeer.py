"""The Kafka side of bench/capture_kafka.py: the broker, our `log: kafka` pipeline files, topic end
offsets, and the Debezium connector as the peer, timed until its topic holds every record."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from harness.bench import Bench
from harness.proc import cluster_cpu_s, proc_cpu_s
from harness.services import started

from pipelines.devservices.debezium import DEBEZIUM_VERSION, LocalDebezium
from pipelines.devservices.kafka import LocalKafka

__all__ = ["DEBEZIUM_TUNING", "DEBEZIUM_VERSION", "Peer"]

# Debezium tuned like our publisher's producer (acks=all, 1 MB batches, 20 ms linger) and with
# room to batch: the fair peer, not the out-of-the-box one.
DEBEZIUM_TUNING = {
    "max.batch.size": "20480",
    "max.queue.size": "81920",
    "producer.override.batch.size": str(1 << 20),
    "producer.override.linger.ms": "20",
    "producer.override.acks": "all",
    "producer.override.compression.type": "none",
    "worker.connector.client.config.override.policy": "All",
    "worker.offset.flush.interval.ms": "10000",
}


class Peer:
    def __init__(self, b: Bench, publisher_workers: int | None):
        self.b = b
        self.publisher_workers = publisher_workers
        self.kafka = started(b.stack, LocalKafka(b.work / "kafka", heap="1g"), "Kafka")
        self._consumer: Any = None
        b.stack.callback(self._close)

    def _close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()

    def sync_load(self, where: str) -> None:
        # Dirty pages of the previous step (Kafka segments, WAL) written back now, not while the
        # next one is timed: its fsyncs (PostgreSQL, the staging log) would wait behind them.
        os.sync()
        self.b.load(where)

    def pipeline(self, name: str, table: str, slot: str, publication: str, prefix: str) -> Path:
        kafka: dict[str, Any] = {"bootstrap_servers": self.kafka.bootstrap, "topic_prefix": prefix}
        if self.publisher_workers is not None:
            kafka["publisher_workers"] = self.publisher_workers
        return self.b.pipeline(name, [table], slot=slot, publication=publication, log={"kafka": kafka})

    def end_offset(self, topic: str) -> int:
        from kafka import KafkaConsumer, TopicPartition

        if self._consumer is None:
            self._consumer = KafkaConsumer(bootstrap_servers=[self.kafka.bootstrap], client_id="bench-watch")
        tp = TopicPartition(topic, 0)
        if topic not in self._consumer.topics():
            return 0
        return self._consumer.end_offsets([tp]).get(tp, 0)

    def debezium(self, name: str, table: str, slot: str, publication: str, prefix: str) -> LocalDebezium:
        dbz = LocalDebezium(
            self.b.work / name,
            self.kafka.bootstrap,
            self.b.dsn,
            prefix,
            [table],
            slot,
            publication,
            extra=DEBEZIUM_TUNING,
            name=name,
            heap="1g",
            start_timeout=180,
        )
        self.b.stack.callback(dbz.stop)
        return dbz

    def watch(self, dbz: LocalDebezium, topic: str, target: int, timeout: float = 900) -> dict[str, float]:
        """Start the connector and time until `topic` holds `target` records."""
        postmaster = self.b.pg.pid()
        cpu0 = cluster_cpu_s(postmaster) if postmaster else 0.0
        initial = self.end_offset(topic)  # records from before this start (the stream part's seed row)
        t0 = time.perf_counter()
        dbz.start(wait=False)
        first = None
        while (n := self.end_offset(topic)) < target:
            now = time.perf_counter()
            if n > initial and first is None:
                first = now
            if now > t0 + timeout:
                raise RuntimeError(
                    f"Debezium wrote {n:,} of {target:,} records to {topic} in {timeout:.0f}s\n{dbz.log_tail()}"
                )
            if not dbz.running():
                raise RuntimeError(f"Kafka Connect exited\n{dbz.log_tail()}")
            time.sleep(0.05)
        done = time.perf_counter()
        jvm_cpu = proc_cpu_s(dbz.pid())
        server_cpu = (cluster_cpu_s(postmaster) - cpu0) if postmaster else None
        dbz.stop()
        return {
            "wall_s": done - t0,
            "first_record_s": (first or done) - t0,
            "after_first_s": done - (first or t0),
            "jvm_cpu_s": jvm_cpu,
            "cpu_s": jvm_cpu,  # the client's CPU, as for the other sides
            "server_cpu_s": server_cpu,
            "records": target,
        }
