"""A throwaway Spark standalone cluster: one master and two workers on 127.0.0.1, run by the pyspark
wheel's own launcher (no Spark distribution):

    <pyspark>/bin/spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 --port P --webui-port W
    <pyspark>/bin/spark-class org.apache.spark.deploy.worker.Worker ... --cores 1 --memory 1g spark://127.0.0.1:P

Used by `cdc dev up spark` and the integration tests (tests/fixtures/spark_cluster.py). Each daemon
runs in its own session with its pid in `<base_dir>/<name>.pid` (spark-class execs java, so that pid
is the JVM), and only a pid whose command line names this cluster's conf dir is ever signalled.
Ports are free ones, remembered in `<base_dir>/ports`; `start()` returns once both workers are
ALIVE in the master's JSON (`http://127.0.0.1:<webui>/json/`).

`secret` (docs/cluster.md): the daemons run with `spark.authenticate` and RPC
encryption, the secret written to `<base_dir>/conf/spark-defaults.conf` (0600), which Spark's
daemons read by themselves, never on a command line.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from cdc.ground.errors import ServiceError
from cdc.ground.private import private_dir, private_open
from pipelines.devservices.base import LOOPBACK, OwnedServerProcess, free_port
from pipelines.devservices.jvm import java_bin, log4j2_properties, log_tail

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT = 90.0
WORKERS = 2
# Spark's own chatter at INFO is a page per executor: warnings and up only.
LOG_LEVELS = {"org.apache.spark": "WARN", "org.sparkproject": "WARN", "io.netty": "WARN"}


def spark_class() -> Path:
    """The launcher script shipped inside the pyspark wheel."""
    import pyspark

    script = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not script.exists():
        raise ServiceError(f"pyspark has no {script}", "reinstall pyspark (scripts/setup.sh)")
    return script


def security_conf(secret: str) -> dict[str, str]:
    """What a cluster and its drivers share to authenticate and encrypt their RPC (and the data
    executors spill or shuffle to local disk)."""
    return {
        "spark.authenticate": "true",
        "spark.authenticate.secret": secret,
        "spark.network.crypto.enabled": "true",
        "spark.io.encryption.enabled": "true",
    }


@dataclass
class SparkDaemon(OwnedServerProcess):
    """One master or worker JVM."""

    base_dir: Path
    name: str  # master, worker-1, ...
    main_class: str
    conf_dir: Path

    stop_timeout = 20.0

    def __post_init__(self) -> None:
        self.pid_file = self.base_dir / f"{self.name}.pid"
        self.out_file = self.base_dir / f"{self.name}.out"

    def start(self) -> dict[str, str]:  # the cluster starts its daemons with launch()
        raise NotImplementedError

    def launch(self, args: list[str], env: dict[str, str]) -> None:
        if not self.running():
            self._spawn([str(spark_class()), self.main_class, *args], self.out_file, env)

    def exited(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def _owns(self, cmdline: str) -> bool:
        return self.main_class in cmdline and str(self.conf_dir) in cmdline


def alive_workers(state: object) -> list[dict]:
    """The ALIVE workers in the master's JSON; ValueError when the answer is not that JSON's shape
    (a master whose web UI is half-started)."""
    workers = state.get("workers") if isinstance(state, dict) else None
    if not isinstance(workers, list) or not all(isinstance(w, dict) for w in workers):
        raise ValueError(f"the master's /json/ answer has no list of workers yet: {str(state)[:80]!r}")
    return [w for w in workers if w.get("state") == "ALIVE"]


@dataclass
class LocalSparkCluster:
    """A master and WORKERS workers of `cores` cores and `memory` each; `secret`: authenticated,
    encrypted RPC (see the module docstring)."""

    base_dir: Path
    cores: int = 1
    memory: str = "1g"
    secret: str | None = None
    daemon_heap: str = "256m"  # master and worker JVMs (executors get spark.executor.memory)
    start_timeout: float = START_TIMEOUT
    ports: dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir).resolve()
        self.conf_dir = self.base_dir / "conf"
        self.ports_file = self.base_dir / "ports"
        self.log_file = self.base_dir / "spark.log"
        with contextlib.suppress(OSError, ValueError):
            self.ports = {k: int(v) for k, v in json.loads(self.ports_file.read_text()).items()}
        self.master = SparkDaemon(self.base_dir, "master", MASTER_CLASS, self.conf_dir)
        self.workers = [
            SparkDaemon(self.base_dir, f"worker-{i}", WORKER_CLASS, self.conf_dir)
            for i in range(1, WORKERS + 1)
        ]

    # -- public ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"spark://{LOOPBACK}:{self.ports.get('master', 0)}"

    @property
    def secure(self) -> bool:
        return (self.conf_dir / "spark-defaults.conf").exists()

    def env(self) -> dict[str, str]:
        return {"SPARK_MASTER": self.url}

    def running(self) -> bool:
        return self.master.running()

    def start(self) -> dict[str, str]:
        if self.running() and all(w.running() for w in self.workers):
            return self.env()
        java_bin("Spark")  # a clear message before spark-class fails less clearly
        private_dir(self.base_dir)
        private_dir(self.conf_dir)
        self._write_conf()
        for name in ("master", "master_ui", *(f"{w.name}{s}" for w in self.workers for s in ("", "_ui"))):
            if not self.ports.get(name):
                self.ports[name] = free_port()
        self.ports_file.write_text(json.dumps(self.ports) + "\n")
        env = {
            "SPARK_CONF_DIR": str(self.conf_dir),
            "SPARK_DAEMON_MEMORY": self.daemon_heap,
            "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_LOG_DIR": str(self.base_dir),
            "SPARK_WORKER_DIR": str(self.base_dir / "work"),
        }
        try:
            self.master.launch(
                [
                    "--host",
                    LOOPBACK,
                    "--port",
                    str(self.ports["master"]),
                    "--webui-port",
                    str(self.ports["master_ui"]),
                ],
                env,
            )
            for worker in self.workers:
                worker.launch(
                    [
                        "--host", LOOPBACK,
                        "--port", str(self.ports[worker.name]),
                        "--webui-port", str(self.ports[f"{worker.name}_ui"]),
                        "--cores", str(self.cores),
                        "--memory", self.memory,
                        "--work-dir", str(self.base_dir / "work"),
                        self.url,
                    ],
                    env,
                )  # fmt: skip
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self.env()

    def stop(self) -> None:
        for daemon in (*self.workers, self.master):  # workers first: they kill their executors
            daemon.stop()

    def state(self) -> dict:
        """The master's JSON (workers, their state, cores, running applications)."""
        with urllib.request.urlopen(
            f"http://{LOOPBACK}:{self.ports['master_ui']}/json/", timeout=5
        ) as answer:
            return json.loads(answer.read())

    def log_tail(self, lines: int = 25) -> str:
        outs = [self.master.out_file, *(w.out_file for w in self.workers), self.log_file]
        return log_tail(outs, lines)

    # -- internals ------------------------------------------------------------------------------
    def _write_conf(self) -> None:
        (self.conf_dir / "log4j2.properties").write_text(
            log4j2_properties("cdc-dev-spark", self.log_file, LOG_LEVELS)
        )
        defaults = self.conf_dir / "spark-defaults.conf"
        defaults.unlink(missing_ok=True)  # a plain start after a secure one is plain
        if self.secret:
            with private_open(defaults, "w") as out:  # 0600: it holds the secret
                out.write("".join(f"{k} {v}\n" for k, v in security_conf(self.secret).items()))

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            for daemon in (self.master, *self.workers):
                code = daemon.exited()
                if code is not None:
                    raise ServiceError(
                        f"Spark {daemon.name} exited with code {code} while starting\n{self.log_tail()}",
                        "read the log above; a port in use or too little memory are the usual causes",
                    )
            try:
                alive = alive_workers(self.state())
                if len(alive) >= len(self.workers):
                    return
                last = f"{len(alive)} of {len(self.workers)} workers registered"
            except (OSError, ValueError) as exc:
                # not listening yet (OSError), or a web UI still starting: an empty, HTML or cut-off
                # answer (JSONDecodeError is a ValueError) or JSON of another shape; all mean "not yet"
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.5)
        raise ServiceError(
            f"the Spark cluster was not ready within {self.start_timeout:.0f}s ({last}); see {self.base_dir}\n{self.log_tail()}",
            "check the logs above; on a loaded machine try again",
        )
