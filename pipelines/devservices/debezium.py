"""A real Debezium PostgreSQL connector, run by Kafka Connect in standalone mode, from jars.

Used by the Debezium interop tests, the side-by-side benchmark and `cdc dev up debezium`. No
Connect distribution and no container: `scripts/setup.sh` resolves `jars/debezium/pom.xml`
(Kafka `connect-runtime` + `connect-json` 4.3.1, `io.debezium:debezium-connector-postgres`
3.7.0.Final, a log4j2 backend) into `.jars/debezium`, and this module runs

    java -cp '.jars/debezium/*' org.apache.kafka.connect.cli.ConnectStandalone worker.properties connector.properties

in its own directory. The worker keeps its source offsets in `<base_dir>/offsets.dat` (so a
stopped connector resumes where it was), converts keys and values with Kafka's JsonConverter
(`schemas.enable` as asked), and serves its REST API on a free port on 127.0.0.1 only. The
connector reads the source over pgoutput with the settings our envelope mirrors
(docs/reference/types.md): decimal.handling.mode=string, time.precision.mode=adaptive_time_microseconds,
binary.handling.mode=base64, interval.handling.mode=string; plus transaction metadata
(`<prefix>.transaction`), tombstones after deletes and an initial snapshot.

The pid goes to `<base_dir>/connect.pid`; only that pid (checked against its command line) is
ever signalled. `wait_streaming()` returns once the connector's task runs and Debezium has
finished its snapshot and started streaming (it reads the worker's log for Debezium's own
"Starting streaming" line: neither the REST API nor the topics tell it, e.g. for empty tables).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cdc.ground.errors import ServiceError
from pipelines.devservices.base import LOOPBACK, OwnedServerProcess, free_port, port_open
from pipelines.devservices.jvm import java_bin, log4j2_properties, log_tail

START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0
MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"
CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
DEBEZIUM_VERSION = "3.7.0.Final"  # jars/debezium/pom.xml; docker-compose.yml uses the same tag

LOG_LEVELS = {"org.apache.kafka": "WARN", "org.apache.kafka.connect": "INFO", "org.reflections": "ERROR"}

# Debezium's own log lines (io.debezium.pipeline.ChangeEventSourceCoordinator).
STREAMING_STARTED = "Starting streaming"
SNAPSHOT_DONE = re.compile(r"Snapshot ended with SnapshotResult \[status=(\w+)")


def debezium_jars_dir() -> Path:
    from pipelines.spark import jars_dir

    folder = jars_dir() / "debezium"
    if not any(folder.glob("debezium-connector-postgres-*.jar")) or not any(
        folder.glob("connect-runtime-*.jar")
    ):
        raise ServiceError(
            f"no Debezium / Kafka Connect jars in {folder}",
            "run scripts/setup.sh (it resolves jars/debezium/pom.xml from Maven Central once)",
        )
    return folder


def _escape(value: str) -> str:
    """A value for a .properties file (backslashes, and leading spaces, are special there)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def table_regex(table: str) -> str:
    """`schema.table` (or `schema.*`) as a Debezium include-list regex (dots literal)."""
    schema, _, name = table.partition(".")
    return re.escape(schema) + r"\." + (".*" if name == "*" else re.escape(name))


def dsn_parts(dsn: str) -> dict[str, str]:
    """host, port, user, password, dbname of a libpq DSN (key=value or URI)."""
    from psycopg2.extensions import parse_dsn

    parts = parse_dsn(dsn)
    return {
        "host": parts.get("host") or LOOPBACK,
        "port": parts.get("port") or "5432",
        "user": parts.get("user") or "postgres",
        "password": parts.get("password") or "",
        "dbname": parts.get("dbname") or parts.get("user") or "postgres",
    }


@dataclass
class LocalDebezium(OwnedServerProcess):
    """stop() sends SIGTERM: Connect stops the task and flushes its offsets (a restart resumes there)."""

    base_dir: Path
    bootstrap: str
    dsn: str
    topic_prefix: str
    tables: Sequence[str]
    slot: str
    publication: str
    schemas: bool = False  # JsonConverter schemas.enable for keys and values
    extra: Mapping[str, str] | None = None  # connector property overrides (worker.* keys go to the worker)
    name: str = "dbz"
    heap: str = "512m"
    start_timeout: float = START_TIMEOUT
    rest_port: int = field(default=0, init=False)
    start_seconds: float | None = field(default=None, init=False)

    stop_timeout = STOP_TIMEOUT
    kill_timeout = 10.0

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).resolve()
        self.worker_file = self.base_dir / "worker.properties"
        self.connector_file = self.base_dir / "connector.properties"
        self.log4j_file = self.base_dir / "log4j2.properties"
        self.log_file = self.base_dir / "connect.log"
        self.out_file = self.base_dir / "connect.out"
        self.pid_file = self.base_dir / "connect.pid"
        self.offsets_file = self.base_dir / "offsets.dat"
        self.port_file = self.base_dir / "rest_port"
        with contextlib.suppress(OSError, ValueError):
            self.rest_port = int(self.port_file.read_text())

    # -- public ---------------------------------------------------------------------------------
    @property
    def rest_url(self) -> str:
        return f"http://{LOOPBACK}:{self.rest_port}"

    @property
    def transaction_topic(self) -> str:
        return f"{self.topic_prefix}.transaction"

    def topic(self, table: str) -> str:
        return f"{self.topic_prefix}.{table}"

    def env(self) -> dict[str, str]:
        return {"DEBEZIUM_REST": self.rest_url, "DEBEZIUM_TOPIC_PREFIX": self.topic_prefix}

    def start(self, wait: bool = True) -> dict[str, str]:
        """Start the worker with the connector; with `wait`, return once it streams (snapshot done)."""
        if self.running():
            return self.env()
        began = time.monotonic()
        jars = debezium_jars_dir()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.rest_port = free_port()
        self.port_file.write_text(f"{self.rest_port}\n")
        self._write_config()
        self._log_mark = self.log_file.stat().st_size if self.log_file.exists() else 0
        argv = [*self._java(jars), MAIN_CLASS, str(self.worker_file), str(self.connector_file)]
        self._spawn(argv, self.out_file)
        if wait:
            try:
                self.wait_streaming()
            except BaseException:
                self.stop()
                raise
        self.start_seconds = time.monotonic() - began
        return self.env()

    def status(self) -> dict | None:
        """The connector's status from the worker's REST API (None while it does not answer)."""
        if not self.rest_port or not port_open(self.rest_port):
            return None
        try:
            with urllib.request.urlopen(f"{self.rest_url}/connectors/{self.name}/status", timeout=5) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def wait_streaming(self, timeout: float | None = None) -> None:
        """Until the task runs and Debezium streams (its snapshot, if any, is complete)."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        state = "not started"
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise ServiceError(
                    f"Kafka Connect exited with code {self._proc.returncode} while starting (see {self.log_file})\n{self.log_tail()}",
                    "read the log above",
                )
            st = self.status()
            if st is not None:
                tasks = st.get("tasks") or []
                failed = [t for t in tasks if t.get("state") == "FAILED"]
                if st.get("connector", {}).get("state") == "FAILED" or failed:
                    trace = (failed[0] if failed else st["connector"]).get("trace", "")
                    raise ServiceError(
                        f"the Debezium connector failed: {trace.splitlines()[0] if trace else st}\n{self.log_tail()}"
                    )
                state = ",".join(t.get("state", "?") for t in tasks) or st.get("connector", {}).get(
                    "state", "?"
                )
                log = self._new_log()
                done = SNAPSHOT_DONE.search(log)
                if done and done.group(1) not in ("COMPLETED", "SKIPPED"):
                    raise ServiceError(
                        f"Debezium's snapshot ended with status {done.group(1)}\n{self.log_tail()}"
                    )
                if tasks and all(t.get("state") == "RUNNING" for t in tasks) and STREAMING_STARTED in log:
                    return
            time.sleep(0.3)
        raise ServiceError(
            f"the Debezium connector did not start streaming within {timeout or self.start_timeout:.0f}s (task: {state}); see {self.log_file}\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        return log_tail((self.out_file, self.log_file), lines)

    # -- internals ------------------------------------------------------------------------------
    def _owns(self, cmdline: str) -> bool:
        return MAIN_CLASS in cmdline and str(self.worker_file) in cmdline

    def _new_log(self) -> str:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(getattr(self, "_log_mark", 0))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def worker_properties(self) -> dict[str, str]:
        schemas = "true" if self.schemas else "false"
        props = {
            "bootstrap.servers": self.bootstrap,
            "listeners": f"http://{LOOPBACK}:{self.rest_port}",
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": schemas,
            "value.converter.schemas.enable": schemas,
            "offset.storage.file.filename": str(self.offsets_file),
            "offset.flush.interval.ms": "1000",
            # every plugin on the class path has ServiceLoader manifests: skip the 10 s reflection scan
            "plugin.discovery": "service_load",
            "task.shutdown.graceful.timeout.ms": "10000",
        }
        for key, value in (self.extra or {}).items():
            if key.startswith("worker."):
                props[key[len("worker.") :]] = str(value)
        return props

    def connector_properties(self) -> dict[str, str]:
        db = dsn_parts(self.dsn)
        props = {
            "name": self.name,
            "connector.class": CONNECTOR_CLASS,
            "tasks.max": "1",
            "database.hostname": db["host"],
            "database.port": db["port"],
            "database.user": db["user"],
            "database.password": db["password"],
            "database.dbname": db["dbname"],
            "topic.prefix": self.topic_prefix,
            "plugin.name": "pgoutput",
            "slot.name": self.slot,
            "publication.name": self.publication,
            "publication.autocreate.mode": "filtered",
            "table.include.list": ",".join(table_regex(t) for t in self.tables),
            "decimal.handling.mode": "string",
            "time.precision.mode": "adaptive_time_microseconds",
            "binary.handling.mode": "base64",
            "interval.handling.mode": "string",
            "provide.transaction.metadata": "true",
            "tombstones.on.delete": "true",
            "snapshot.mode": "initial",
            # Debezium skips truncates by default; followers must see them or they keep rows the source dropped
            "skipped.operations": "none",
            # topics Connect creates for the connector: one partition, one replica (a one-node broker)
            "topic.creation.default.replication.factor": "1",
            "topic.creation.default.partitions": "1",
        }
        for key, value in (self.extra or {}).items():
            if not key.startswith("worker."):
                props[key] = str(value)
        return props

    def _write_config(self) -> None:
        for path, props in (
            (self.worker_file, self.worker_properties()),
            (self.connector_file, self.connector_properties()),
        ):
            lines = ["# written by pipelines.devservices.debezium (rewritten at every start)"]
            lines += [f"{k}={_escape(v)}" for k, v in props.items()]
            path.write_text("\n".join(lines) + "\n")
            path.chmod(0o600)  # holds the database password
        self.log4j_file.write_text(log4j2_properties("cdc-dev-connect", self.log_file, LOG_LEVELS))

    def _java(self, jars: Path) -> list[str]:
        return [
            java_bin("Kafka Connect"),
            "-Xms128m",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j_file}",
            "-cp",
            f"{jars}/*",
        ]
