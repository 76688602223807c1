"""A throwaway single-node Apache Kafka 4.x broker (KRaft) from the jars set-up resolved.

Used by `cdc dev up kafka`, the integration tests and anyone trying the `kafka` log without a
container. No Kafka distribution and no shell scripts: `scripts/setup.sh` resolves
`jars/kafka/pom.xml` into `.jars/kafka`, and this module runs

    java -cp '.jars/kafka/*' kafka.tools.StorageTool format --standalone -t <id> -c server.properties
    java -cp '.jars/kafka/*' kafka.Kafka server.properties

in its own directory. One JVM is both broker and controller (`process.roles=broker,controller`,
a one-voter dynamic quorum), both listeners are on 127.0.0.1 only, every replication factor and
min ISR is 1, and the data stays under `<base_dir>/data`, so a stopped broker restarts with its
topics and offsets. The two ports are remembered in `<base_dir>/ports` (a restart keeps its
address); the pid goes to `<base_dir>/kafka.pid`, so `cdc dev down` from another process can stop
it, and only that pid (checked against its command line) is ever signalled.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.ground.errors import ServiceError
from pipelines.devservices.base import LOOPBACK, OwnedServerProcess, free_port, port_open, run
from pipelines.devservices.jvm import java_bin, log4j2_properties, log_tail

START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"

# Kafka 4 logs through slf4j -> log4j2 only; the chatty request loggers are muted.
LOG_LEVELS = {
    "kafka.request.logger": "WARN",
    "kafka.network.RequestChannel$": "WARN",
    "state.change.logger": "WARN",
}


def kafka_jars_dir() -> Path:
    from pipelines.spark import jars_dir

    folder = jars_dir() / "kafka"
    if not any(folder.glob("kafka_2.13-*.jar")):
        raise ServiceError(
            f"no Kafka broker jars in {folder}",
            "run scripts/setup.sh (it resolves jars/kafka/pom.xml from Maven Central once)",
        )
    return folder


def new_cluster_id() -> str:
    """16 random bytes, URL-safe base64 without padding and without '-' (StorageTool reads a leading '-' as an option)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=").replace("-", "_")


@contextlib.contextmanager
def _quiet_kafka_python() -> Iterator[None]:
    """kafka-python logs every refused connection while the broker boots: not news here."""
    logger = logging.getLogger("kafka")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


@dataclass
class LocalKafka(OwnedServerProcess):
    """stop() is a controlled shutdown (SIGTERM: flushes logs, writes clean-shutdown markers);
    kill() is a crash (SIGKILL: no controlled shutdown), whose logs the next start() recovers;
    restart() stops and starts again on the same ports with the same data (a broker outage, for tests)."""

    base_dir: Path
    port: int = 0  # the broker (PLAINTEXT) listener; 0 = a free port, remembered for restarts
    settings: Mapping[str, str] | None = None  # server.properties overrides (e.g. log.segment.bytes)
    heap: str = "512m"
    start_timeout: float = START_TIMEOUT
    controller_port: int = field(default=0, init=False)
    start_seconds: float | None = field(default=None, init=False)  # how long the last start() took

    stop_timeout = STOP_TIMEOUT
    kill_timeout = 10.0

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).resolve()
        self.data_dir = self.base_dir / "data"
        self.config_file = self.base_dir / "server.properties"
        self.log4j_file = self.base_dir / "log4j2.properties"
        self.log_file = self.base_dir / "kafka.log"
        # the JVM's own stdout/stderr (a crash before log4j2 is up lands here)
        self.out_file = self.base_dir / "kafka.out"
        self.pid_file = self.base_dir / "kafka.pid"
        self.ports_file = self.base_dir / "ports"
        if self.ports_file.exists():
            with contextlib.suppress(OSError, ValueError, KeyError):
                saved = json.loads(self.ports_file.read_text())
                self.port = self.port or int(saved["broker"])
                self.controller_port = int(saved["controller"])

    # -- public ---------------------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def env(self) -> dict[str, str]:
        return {"KAFKA_BOOTSTRAP": self.bootstrap}

    @property
    def admin_bootstrap(self) -> str:
        """Where this tool's own admin client (readiness check) connects."""
        return self.bootstrap

    def admin_security(self) -> dict[str, Any]:
        """kafka-python security settings of that admin client (none: a PLAINTEXT listener)."""
        return {}

    def start(self) -> dict[str, str]:
        if self.running():
            return self.env()
        began = time.monotonic()
        jars = kafka_jars_dir()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self._choose_ports()
        self._write_config()
        if not (self.data_dir / "meta.properties").exists():
            self._format(jars)
        for what, port in (("broker", self.port), ("controller", self.controller_port)):
            if port_open(port):
                raise ServiceError(
                    f"cannot start Kafka in {self.base_dir}: its {what} port {LOOPBACK}:{port} is taken by another process",
                    f"stop what listens there, or use a fresh --dir (ports are kept in {self.ports_file})",
                )
        self._spawn([*self._java(jars), MAIN_CLASS, str(self.config_file)], self.out_file)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self.env()

    def log_tail(self, lines: int = 25) -> str:
        return log_tail((self.out_file, self.log_file), lines)

    # -- internals ------------------------------------------------------------------------------
    def _owns(self, cmdline: str) -> bool:
        return MAIN_CLASS in cmdline and str(self.config_file) in cmdline

    def _choose_ports(self) -> None:
        if not self.port:
            self.port = free_port()
        while not self.controller_port or self.controller_port == self.port:
            self.controller_port = free_port()
        self.ports_file.write_text(
            json.dumps({"broker": self.port, "controller": self.controller_port}) + "\n"
        )

    def _properties(self) -> dict[str, str]:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.controller_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "controller.quorum.bootstrap.servers": f"{LOOPBACK}:{self.controller_port}",
            "log.dirs": str(self.data_dir),
            # one node: every internal topic and every default has one replica
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "1",
            # a small machine shared with Spark and PostgreSQL
            "num.network.threads": "2",
            "num.io.threads": "4",
            "num.recovery.threads.per.data.dir": "1",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(32 << 20),
            "group.initial.rebalance.delay.ms": "0",
            # after a crash (SIGKILL) the new incarnation waits until the old registration expires:
            # 4 s instead of 9 s (heartbeats are in-process, over loopback, every 0.5 s)
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "4000",
        }
        for key, value in (self.settings or {}).items():
            props[str(key)] = str(value)
        return props

    def _write_config(self) -> None:
        lines = ["# written by pipelines.devservices.kafka (rewritten at every start)"]
        lines += [f"{k}={v}" for k, v in self._properties().items()]
        self.config_file.write_text("\n".join(lines) + "\n")
        self.log4j_file.write_text(log4j2_properties("cdc-dev-kafka", self.log_file, LOG_LEVELS))

    def _java(self, jars: Path) -> list[str]:
        return [
            java_bin("Kafka"),
            "-Xms128m",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExplicitGCInvokesConcurrent",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j_file}",
            f"-Dkafka.logs.dir={self.base_dir}",
            "-cp",
            f"{jars}/*",
        ]

    def _format(self, jars: Path) -> None:
        run(
            [
                *self._java(jars),
                STORAGE_TOOL,
                "format",
                "--standalone",
                "-t",
                new_cluster_id(),
                "-c",
                str(self.config_file),
            ],
            f"formatting Kafka storage in {self.data_dir}",
        )

    def _wait_ready(self) -> None:
        """Until the broker answers a metadata request (an open port is not enough: it accepts
        connections before the controller has elected itself and the broker is unfenced)."""
        from kafka import KafkaAdminClient

        deadline = time.monotonic() + self.start_timeout
        last_error = "no answer"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise ServiceError(
                    f"Kafka exited with code {self._proc.returncode} while starting (see {self.log_file})\n{self.log_tail()}",
                    "read the log above; a port in use or a data dir from another cluster are the usual causes",
                )
            if not port_open(int(self.admin_bootstrap.rpartition(":")[2])):
                time.sleep(0.2)
                continue
            left_ms = max(1000, int((deadline - time.monotonic()) * 1000))
            try:
                with _quiet_kafka_python():
                    client = KafkaAdminClient(
                        bootstrap_servers=[self.admin_bootstrap],
                        client_id="cdc-dev-ready",
                        request_timeout_ms=min(5000, left_ms),
                        bootstrap_timeout_ms=min(5000, left_ms),
                        **self.admin_security(),
                    )
                    try:
                        client.list_topics()
                        brokers = client.describe_cluster().get("brokers") or []
                    finally:
                        client.close()
                if brokers:
                    return
                last_error = "no broker registered yet"
            except Exception as exc:  # any failure here means "not ready yet"
                last_error = f"{type(exc).__name__}: {exc}"
            time.sleep(0.3)
        raise ServiceError(
            f"Kafka did not serve requests on {self.bootstrap} within {self.start_timeout:.0f}s ({last_error}); see {self.log_file}\n{self.log_tail()}",
            "check the log above; on a loaded machine raise the start timeout",
        )
