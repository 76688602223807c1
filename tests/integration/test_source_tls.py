"""PostgreSQL over TLS on a non-loopback address (issue 24 item 5; README Security): a cluster
with a server certificate from a CA made at test time, reachable on this machine's own network
address by `hostssl` lines only (so whatever connects there is encrypted).

* `cdc validate` warns (exit unchanged, no password printed) when the DSN reaches a non-loopback
  host with sslmode below source.postgres.min_sslmode (verify-full, or require when set so);
* with sslmode=verify-full and sslrootcert, validate, snapshot and stream (the replication
  connection) work over TLS, and a certificate from another CA is refused (exit 3)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from pipelines.devservices.base import give_to
from pipelines.devservices.postgres import LocalPostgres
from tests.fixtures.capture import validate_warnings
from tests.fixtures.services import postgres
from tests.harness import cdc, sql, write_pipeline

pytestmark = pytest.mark.integration


def this_host_address() -> str:
    """An IPv4 address of this machine that is not loopback (skip when there is none)."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout.split()
    addresses = [a for a in out if "." in a and not a.startswith("127.")]
    if not addresses:
        pytest.skip("no non-loopback IPv4 address on this machine")
    return addresses[0]


def make_ca(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
         "-keyout", str(directory / "ca.key"), "-out", str(directory / "ca.crt")],
        check=True, capture_output=True,
    )  # fmt: skip
    return directory / "ca.crt"


def make_server_cert(ca_dir: Path, address: str) -> tuple[Path, Path]:
    key, csr, crt, ext = (ca_dir / n for n in ("server.key", "server.csr", "server.crt", "san.ext"))
    ext.write_text(f"subjectAltName=IP:{address},IP:127.0.0.1,DNS:localhost\n")
    subprocess.run(
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=cdc-test-pg", "-keyout", str(key), "-out", str(csr)],
        check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_dir / "ca.crt"), "-CAkey", str(ca_dir / "ca.key"),
         "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(crt)],
        check=True, capture_output=True,
    )  # fmt: skip
    return crt, key


@pytest.fixture(scope="module")
def tls_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalPostgres, str, Path, Path]]:
    """(cluster, its non-loopback address, CA file, another CA's file)."""
    address = this_host_address()
    certs = tmp_path_factory.mktemp("pg-certs")
    ca = make_ca(certs / "ca", "cdc-test-ca")
    other_ca = make_ca(certs / "other", "someone-else")
    crt, key = make_server_cert(certs / "ca", address)

    class TlsPostgres(LocalPostgres):
        def _write_conf(self) -> None:
            super()._write_conf()
            for src in (crt, key):
                shutil.copy(src, self.data_dir / src.name)
                (self.data_dir / src.name).chmod(0o600)
                give_to(self.user, self.data_dir / src.name)
            with open(self.data_dir / "postgresql.auto.conf", "a") as f:
                f.write(
                    f"ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nlisten_addresses = '127.0.0.1,{address}'\n"
                )
            hba = self.data_dir / "pg_hba.conf"
            if address not in hba.read_text():  # only TLS from the network address
                with open(hba, "a") as f:
                    f.write(
                        f"hostssl all all {address}/32 scram-sha-256\nhostssl replication all {address}/32 scram-sha-256\n"
                    )

    with postgres("cdc-test-pgtls-", cls=TlsPostgres) as server:
        yield server, address, ca, other_ca


def pipeline(tmp_path: Path, pg: LocalPostgres, address: str, query: str, **postgres_extra: str) -> Path:
    dsn = f"postgresql://postgres:{quote(pg.password)}@{address}:{pg.port}/postgres?{query}"
    return write_pipeline(
        tmp_path, dsn, ["public.t"], name="tls", postgres=postgres_extra, state_dir=str(tmp_path / "state")
    )


def test_source_over_tls_and_the_validate_warning(tls_pg, tmp_path: Path) -> None:
    pg, address, ca, other_ca = tls_pg
    sql(
        pg.dsn(),
        "CREATE TABLE IF NOT EXISTS t (id int PRIMARY KEY, v text)",
        "INSERT INTO t VALUES (1, 'a') ON CONFLICT DO NOTHING",
    )
    warning = f"warn source.postgres.dsn: host {address} is not loopback and sslmode is require: encrypted, but nothing checks"

    # require: encrypted (hostssl only), but the server is not checked: a warning, exit 0
    run = cdc("validate", pipeline(tmp_path, pg, address, "sslmode=require"))
    assert run.code == 0, run
    assert warning in run.out and "fix: add sslmode=verify-full and sslrootcert=" in run.out, run.out
    assert pg.password not in run.out + run.err
    # ... unless require is declared enough
    run = cdc("validate", pipeline(tmp_path, pg, address, "sslmode=require", min_sslmode="require"))
    assert run.code == 0 and validate_warnings(run.out) == [], run
    # libpq's default (prefer) is named as such
    run = cdc("validate", pipeline(tmp_path, pg, address, "application_name=x"))
    assert (
        f"host {address} is not loopback and sslmode is prefer (libpq's default): the connection may be plain text"
        in run.out
    ), run

    # verify-full with the CA: no warning, and snapshot and stream (replication) run over TLS
    file = pipeline(tmp_path, pg, address, f"sslmode=verify-full&sslrootcert={quote(str(ca))}")
    run = cdc("validate", file)
    assert run.code == 0 and validate_warnings(run.out) == [], run
    assert cdc("snapshot", file).code == 0
    sql(pg.dsn(), "INSERT INTO t VALUES (2, 'b') ON CONFLICT DO NOTHING")
    streamed = cdc("stream", file, "--until", "current")
    assert streamed.code == 0, streamed
    rows = cdc("log", "read", file, "--table", "public.t")
    assert rows.code == 0 and '"b"' in rows.out, rows

    # a server certificate the configured CA did not sign: refused (exit 3), no password printed
    run = cdc(
        "validate", pipeline(tmp_path, pg, address, f"sslmode=verify-full&sslrootcert={quote(str(other_ca))}")
    )
    assert run.code == 3, run
    assert "certificate verify failed" in run.err, run.err
    assert pg.password not in run.out + run.err
    assert "Traceback" not in run.err
