"""A throwaway Redis server from the Debian package (redis-server), for the cache follower.

Used by `cdc dev up redis` and the test fixtures. Everything lives in one directory: the
generated config, the append-only file (so a killed and restarted server keeps its data, as a
real cache deployment with AOF does), the log and our pid file. The server listens on
127.0.0.1 only, on a free port that is remembered for restarts. We own the process: it runs in
the foreground (daemonize no) in its own session, and we only ever signal the pid we started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.devservices.base import LOOPBACK, free_port, pid_alive
from pipelines.errors import ServiceError

START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0


def redis_server_bin() -> str:
    found = shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if not found:
        raise ServiceError("redis-server is not installed", "run scripts/setup.sh (it installs the Debian package redis-server)")
    return found


def _proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
        os.kill(pid, sig)


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
class LocalRedis:
    base_dir: Path
    port: int = 0
    appendonly: bool = True  # AOF persistence: data survives kill -9 + restart
    appendfsync: str = "everysec"  # always | everysec | no (a SIGKILL loses nothing either way; a power cut may)
    maxmemory: str | None = None  # e.g. "256mb"; None = unlimited
    start_seconds: float | None = field(default=None, init=False)  # how long the last start() took

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir)
        self.conf_file = self.base_dir / "redis.conf"
        self.log_file = self.base_dir / "redis.log"
        self.pid_file = self.base_dir / "redis.pid"
        self.port_file = self.base_dir / "port"
        self._proc: subprocess.Popen[bytes] | None = None
        if not self.port and self.port_file.exists():
            try:
                self.port = int(self.port_file.read_text())
            except ValueError:
                self.port = 0

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
        with open(self.log_file, "ab") as log:
            try:
                self._proc = subprocess.Popen(
                    [redis_server_bin(), str(self.conf_file)],
                    cwd=self.base_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: a Ctrl-C in the shell that ran `cdc dev up` does not reach it
                )
            except OSError as exc:
                raise ServiceError(f"could not run redis-server: {exc}", "run scripts/setup.sh") from exc
        self.pid_file.write_text(f"{self._proc.pid}\n")
        self._wait_ready(began)
        self.start_seconds = time.monotonic() - began
        return self.env()

    def stop(self) -> None:
        """Graceful shutdown (SIGTERM: Redis flushes the AOF and exits), SIGKILL if it hangs."""
        pid = self.pid()
        if pid is None:
            self._forget()
            return
        _signal(pid, signal.SIGTERM)
        if not self._wait_gone(pid, STOP_TIMEOUT):
            _signal(pid, signal.SIGKILL)
            self._wait_gone(pid, 5)
        self._forget()

    def kill(self) -> None:
        """SIGKILL the server (crash tests). Data written before the kill is in the AOF."""
        pid = self.pid()
        if pid is None:
            return
        _signal(pid, signal.SIGKILL)
        self._wait_gone(pid, 5)
        self._forget()

    def restart(self) -> dict[str, str]:
        """Stop if running, then start again on the same port with the same data."""
        self.stop()
        return self.start()

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if self._alive(pid) else None

    def running(self) -> bool:
        return self.pid() is not None

    # -- internals ------------------------------------------------------------------------------
    def _alive(self, pid: int) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            return self._proc.poll() is None
        # Started by another process (`cdc dev up`): check that the pid is still our redis-server,
        # so a recycled pid is never signalled.
        if not pid_alive(pid) or _is_zombie(pid):
            return False
        return "redis-server" in _proc_cmdline(pid)

    def _wait_gone(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                try:
                    self._proc.wait(timeout=0.05)
                    return True
                except subprocess.TimeoutExpired:
                    continue
            if not pid_alive(pid) or _is_zombie(pid):
                return True
            time.sleep(0.05)
        return False

    def _forget(self) -> None:
        self._proc = None
        self.pid_file.unlink(missing_ok=True)

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
        raise ServiceError(f"redis-server did not answer PING on port {self.port} within {START_TIMEOUT:.0f}s (last reply: {reply})", f"see {self.log_file}")

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
