"""Shared plumbing for local dev services: free ports, waiting, running as a service user."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from pipelines.errors import ServiceError

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


def wait_for_port(port: int, timeout: float, what: str, host: str = LOOPBACK, log_file: Path | None = None) -> None:
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
