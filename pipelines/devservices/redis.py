"""A throwaway Redis server from the Debian package (redis-server), for the cache follower.

Used by `cdc dev up redis` and the test fixtures. Everything lives in one directory: the
generated config, the append-only file (so a killed and restarted server keeps its data, as a
real cache deployment with AOF does), the log and our pid file. The server listens on
127.0.0.1 only, on a free port that is remembered for restarts. We own the process: it runs in
the foreground (daemonize no) in its own session, and we only ever signal the pid we started.
"""

from __future__ import annotations

import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from cdc.ground.errors import ServiceError
from pipelines.devservices.base import LOOPBACK, OwnedServerProcess, free_port, remembered_port

START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0


def redis_server_bin() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if not found:
        raise ServiceError(
            "redis-server is not installed",
            "run scripts/setup.sh (it installs the Debian package redis-server)",
        )
    return found


def ping(port: int, host: str = LOOPBACK, timeout: float = 1.0) -> str | None:
    """Send an inline PING; return the first reply line ('+PONG', '-LOADING ...') or None if unreachable."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = s.recv(256)
                if not chunk:
                    break
                reply += chunk
            return reply.decode(errors="replace").strip() or None
    except OSError:
        return None


@dataclass
class LocalRedis(OwnedServerProcess):
    """stop() is a graceful shutdown (SIGTERM: Redis flushes the AOF and exits), SIGKILL if it hangs;
    kill() is a crash (SIGKILL, for crash tests): data written before it is in the AOF; restart()
    stops if running and starts again on the same port with the same data."""

    base_dir: Path
    port: int = 0
    appendonly: bool = True  # AOF persistence: data survives kill -9 + restart
    # always | everysec | no. With everysec a SIGKILL can lose the last second of acknowledged
    # writes: Redis postpones the AOF write while a slow background fsync runs.
    appendfsync: str = "everysec"
    maxmemory: str | None = None  # e.g. "256mb"; None = unlimited
    start_seconds: float | None = field(default=None, init=False)  # how long the last start() took

    stop_timeout = STOP_TIMEOUT
    kill_timeout = 5.0
    poll_interval = 0.05

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir)
        self.conf_file = self.base_dir / "redis.conf"
        self.log_file = self.base_dir / "redis.log"
        self.pid_file = self.base_dir / "redis.pid"
        self.port_file = self.base_dir / "port"
        if not self.port:
            self.port = remembered_port(self.port_file)

    # -- public ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def env(self) -> dict[str, str]:
        return {"REDIS_URL": self.url}

    def start(self) -> dict[str, str]:
        if self.running():
            return self.env()
        began = time.monotonic()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        if ping(self.port) is not None:
            raise ServiceError(
                f"port {self.port} on {LOOPBACK} is already taken by another server",
                f"stop it, or remove {self.port_file} so a free port is chosen",
            )
        self.port_file.write_text(str(self.port))
        self._write_conf()
        self._spawn([redis_server_bin(), str(self.conf_file)], self.log_file)
        self._wait_ready(began)
        self.start_seconds = time.monotonic() - began
        return self.env()

    # -- internals ------------------------------------------------------------------------------
    def _owns(self, cmdline: str) -> bool:
        return "redis-server" in cmdline

    def _wait_ready(self, began: float) -> None:
        deadline = began + START_TIMEOUT
        reply = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                self._forget()
                raise ServiceError(
                    f"redis-server exited with code {code} while starting: {self._log_tail()}",
                    f"see {self.log_file}",
                )
            reply = ping(self.port)
            if reply == "+PONG":
                return
            time.sleep(0.02)
        self.stop()
        raise ServiceError(
            f"redis-server did not answer PING on port {self.port} within {START_TIMEOUT:.0f}s (last reply: {reply})",
            f"see {self.log_file}",
        )

    def _log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log_file.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _write_conf(self) -> None:
        settings: list[tuple[str, str]] = [
            ("bind", LOOPBACK),
            ("port", str(self.port)),
            ("protected-mode", "no"),  # loopback only, no password: nothing to protect against
            ("daemonize", "no"),  # we own the process
            ("supervised", "no"),
            ("dir", str(self.base_dir.resolve())),
            ("logfile", str(self.log_file.resolve())),
            ("loglevel", "notice"),
            ("databases", "16"),
            ("save", '""'),  # no RDB snapshots: the AOF (if on) is the persistence
            ("appendonly", "yes" if self.appendonly else "no"),
            ("appendfsync", self.appendfsync),
            ("appendfilename", '"appendonly.aof"'),
        ]
        if self.maxmemory:
            settings += [("maxmemory", self.maxmemory), ("maxmemory-policy", "noeviction")]
        lines = ["# written by pipelines.devservices.redis"] + [f"{k} {v}" for k, v in settings]
        self.conf_file.write_text("\n".join(lines) + "\n")
