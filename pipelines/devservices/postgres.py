"""A throwaway PostgreSQL cluster with wal_level=logical, from the Debian packages.

Used by `cdc dev up postgres`, `cdc demo` and the test fixtures. The cluster lives in
its own directory (data, socket, log), listens on 127.0.0.1 on a free port, and
requires a password over TCP so the password-redaction paths are exercised for real.
"""

from __future__ import annotations

import glob
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from cdc.ground.errors import ServiceError
from cdc.ground.private import private_dir, private_open
from pipelines.devservices.base import (
    LOOPBACK,
    as_user,
    free_port,
    give_to,
    pid_alive,
    read_pid,
    run,
    service_user,
    wait_for_port,
)

SUPERUSER = "postgres"


def pg_bin_dir() -> Path:
    """The newest installed server's bin dir (Debian keeps them in /usr/lib/postgresql/<major>/bin)."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not candidates:
        raise ServiceError("no PostgreSQL server is installed (initdb not found)", "run scripts/setup.sh")
    return Path(candidates[-1]).parent


@dataclass
class LocalPostgres:
    base_dir: Path
    port: int = 0
    durable: bool = True  # fsync etc.; tests turn it off for speed (they never crash the server)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir)
        self.data_dir = self.base_dir / "data"
        self.socket_dir = self.base_dir / "sock"
        self.log_file = self.base_dir / "postgres.log"
        self.password_file = self.base_dir / "password"
        self.port_file = self.base_dir / "port"
        self.user = service_user("postgres")
        if not self.port and self.port_file.exists():
            self.port = int(self.port_file.read_text())

    # -- public ---------------------------------------------------------------------------------
    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER, password: str | None = None) -> str:
        pw = self.password if password is None else password
        return f"postgresql://{user}:{pw}@{LOOPBACK}:{self.port}/{dbname}"

    def env(self) -> dict[str, str]:
        return {"PG_DSN": self.dsn()}

    def start(self) -> dict[str, str]:
        if self.running():
            return self.env()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        else:
            self._owner_only()  # a cluster made before these were owner-only
        if not self.port:
            self.port = free_port()
        self.port_file.write_text(str(self.port))
        self._write_conf()
        run(
            as_user(self.user, [str(pg_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60", "start"]),
            f"starting PostgreSQL on port {self.port}",
        )
        wait_for_port(self.port, 30, "PostgreSQL", log_file=self.log_file)
        return self.env()

    def stop(self) -> None:
        pid = self.pid()
        if pid is None:
            return
        try:
            run(as_user(self.user, [str(pg_bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "30", "stop"]), "stopping PostgreSQL")
        except ServiceError:
            if pid_alive(pid):
                os.kill(pid, signal.SIGQUIT)  # immediate shutdown of the postmaster we started
                for _ in range(50):
                    if not pid_alive(pid):
                        break
                    time.sleep(0.1)

    def pid(self) -> int | None:
        pid = read_pid(self.data_dir / "postmaster.pid")
        return pid if pid is not None and pid_alive(pid) else None

    def running(self) -> bool:
        return self.pid() is not None

    # -- internals ------------------------------------------------------------------------------
    def _initdb(self) -> None:
        private_dir(self.socket_dir)
        with private_open(self.password_file, "w") as f:  # the superuser's password: 0600
            f.write(secrets.token_urlsafe(12) + "\n")
        self._owner_only()
        run(
            as_user(
                self.user,
                [
                    str(pg_bin_dir() / "initdb"),
                    "-D", str(self.data_dir),
                    "-U", SUPERUSER,
                    f"--pwfile={self.password_file}",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E", "UTF8",
                    "--locale=C.UTF-8",
                ],
            ),
            "initdb",
        )

    def _owner_only(self) -> None:
        """The cluster's directory, socket directory and password file belong to the server's user
        (root, that runs `cdc dev`, still reads the password) and no one else: 0700/0600."""
        os.chmod(self.base_dir, 0o700)
        os.chmod(self.socket_dir, 0o700)
        os.chmod(self.password_file, 0o600)
        give_to(self.user, self.base_dir, self.socket_dir, self.password_file)

    def _write_conf(self) -> None:
        settings = {
            "port": str(self.port),
            "listen_addresses": f"'{LOOPBACK}'",
            "unix_socket_directories": f"'{self.socket_dir}'",
            # local connections are `trust`: only the server's own OS user may reach the socket
            "unix_socket_permissions": "0700",
            "wal_level": "logical",
            "max_replication_slots": "20",
            "max_wal_senders": "20",
            "max_connections": "100",
            "shared_buffers": "256MB",
            "max_wal_size": "2GB",
            "logging_collector": "off",
        }
        if not self.durable:
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        conf = self.data_dir / "postgresql.auto.conf"
        lines = ["# written by pipelines.devservices.postgres"] + [f"{k} = {v}" for k, v in settings.items()]
        conf.write_text("\n".join(lines) + "\n")
        give_to(self.user, conf)
