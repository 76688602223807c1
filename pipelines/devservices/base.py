"""Shared plumbing for local dev services: free ports, waiting, running as a service user, and the
lifecycle of a server process we start and own (`OwnedServerProcess`)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

from cdc.ground.errors import ServiceError

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_for_port(
    port: int, timeout: float, what: str, host: str = LOOPBACK, log_file: Path | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(port, host):
            return
        time.sleep(0.2)
    hint = f"; see {log_file}" if log_file else ""
    raise ServiceError(f"{what} did not accept connections on {host}:{port} within {timeout:.0f}s{hint}")


def service_user(name: str) -> str | None:
    """Servers such as PostgreSQL refuse to run as root: run them as `name` when we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(name)
    except KeyError as exc:
        raise ServiceError(
            f"running as root but the system user {name!r} does not exist",
            "install the server package (scripts/setup.sh) or run as a normal user",
        ) from exc
    return name


def as_user(user: str | None, argv: Sequence[str]) -> list[str]:
    return ["runuser", "-u", user, "--", *argv] if user else list(argv)


def give_to(user: str | None, *paths: Path) -> None:
    if user:
        for path in paths:
            shutil.chown(path, user, user)


def run(argv: Sequence[str], what: str, timeout: float = 120) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise ServiceError(f"{what}: {argv[0]} not found", "run scripts/setup.sh to install it") from exc
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"{what}: timed out after {timeout:.0f}s") from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise ServiceError(f"{what} failed (exit {done.returncode}): " + " | ".join(detail))
    return done.stdout


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remembered_port(port_file: Path) -> int:
    """The port a service used last time (so restarts keep their address); 0 if none is remembered."""
    try:
        return int(port_file.read_text())
    except (OSError, ValueError):
        return 0


def read_pid(pid_file: Path) -> int | None:
    """The pid on the first line of `pid_file` (None if it is missing or holds no number)."""
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def proc_cmdline(pid: int) -> str:
    """The command line of `pid`, arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_zombie(pid: int) -> bool:
    """Exited but not yet reaped by its parent (pid_alive() still says yes for it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # the state follows the command name in parentheses, which may itself hold spaces and ')'
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def send_signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
        os.kill(pid, sig)


class OwnedServerProcess(ABC):
    """The lifecycle of a server that runs in the foreground of a process we start and own.

    `_spawn()` runs it in its own session (it outlives the process that started it, e.g. `cdc dev
    up`) and writes its pid to `pid_file`, so another handle on the same directory (`cdc dev down`)
    finds it. Only that pid is ever signalled, and only while `_owns()` recognises its command line:
    a recycled pid is never ours. A subclass sets `base_dir` and `pid_file`, implements `start()`
    and `_owns()`, and sets the timeouts below.
    """

    base_dir: Path
    pid_file: Path
    _proc: subprocess.Popen | None = None  # the server, when this handle started it

    stop_timeout: float = 30.0  # stop(): how long the server may take to exit after SIGTERM
    kill_timeout: float = 10.0  # how long to wait for it to vanish after SIGKILL
    poll_interval: float = 0.1  # how often to look while waiting

    @abstractmethod
    def start(self) -> dict[str, str]: ...

    @abstractmethod
    def _owns(self, cmdline: str) -> bool:
        """Whether a live process with this command line is this handle's server."""

    def stop(self) -> None:
        """SIGTERM (a graceful shutdown); SIGKILL if the server has not exited within `stop_timeout`."""
        pid = self.pid()
        if pid is not None:
            send_signal(pid, signal.SIGTERM)
            if not self._wait_gone(pid, self.stop_timeout):
                send_signal(pid, signal.SIGKILL)
                self._wait_gone(pid, self.kill_timeout)
        self._forget()

    def kill(self) -> None:
        """SIGKILL the server: a crash, no shutdown of any kind (for crash tests)."""
        pid = self.pid()
        if pid is not None:
            send_signal(pid, signal.SIGKILL)
            self._wait_gone(pid, self.kill_timeout)
        self._forget()

    def restart(self) -> dict[str, str]:
        """Stop if running, then start again: same directory, so the same data and ports."""
        self.stop()
        return self.start()

    def pid(self) -> int | None:
        """The server's pid if the process we started still runs (a recycled pid is not ours)."""
        pid = read_pid(self.pid_file)
        if pid is None:
            return None
        if self._proc is not None and self._proc.pid == pid:
            return pid if self._proc.poll() is None else None  # our child: Popen knows, and reaps it
        if not pid_alive(pid) or is_zombie(pid):
            return None
        return pid if self._owns(proc_cmdline(pid)) else None

    def running(self) -> bool:
        return self.pid() is not None

    def _spawn(
        self, argv: Sequence[str], output: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """Run `argv` in `base_dir` with stdout and stderr appended to `output` (and these
        variables added to our environment); write the pid file."""
        with open(output, "ab") as out:
            try:
                self._proc = subprocess.Popen(
                    list(argv),
                    cwd=self.base_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **env} if env else None,
                    # own session: outlives `cdc dev up`, and a Ctrl-C in that shell does not reach it
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServiceError(
                    f"could not run {Path(argv[0]).name}: {exc}", "run scripts/setup.sh"
                ) from exc
        self.pid_file.write_text(f"{self._proc.pid}\n")
        return self._proc

    def _wait_gone(self, pid: int, timeout: float) -> bool:
        """Until `pid` has exited (a zombie has); False if it still runs after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                try:
                    self._proc.wait(timeout=self.poll_interval)
                    return True
                except subprocess.TimeoutExpired:
                    continue
            if not pid_alive(pid) or is_zombie(pid):
                return True
            time.sleep(self.poll_interval)
        return False

    def _forget(self) -> None:
        """Forget the server: reap our child (no zombie left behind) and remove the pid file."""
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None
        self.pid_file.unlink(missing_ok=True)
