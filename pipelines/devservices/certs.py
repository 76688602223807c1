"""Certificates for the secured dev services, made with Debian's openssl: a CA, and certificates it
issues (a server certificate naming 127.0.0.1 and localhost, client certificates for mTLS). Short
lived and for one machine: `cdc dev up kafka --secure` and the tests' secured brokers and nodes.

Keys are unencrypted PKCS#8 PEM (what Kafka's PEM keystores and Python's ssl module read), written
owner-only: the CA's key signs anything this machine's dev services would trust.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from cdc.ground.errors import ServiceError
from cdc.ground.private import private_dir

DAYS = "30"
BROKER_CN = "cdc-dev-kafka"  # the server certificate make_certs issues


def openssl(*args: str) -> None:
    try:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise ServiceError(
            "openssl is not installed (it makes the dev services' certificates)", "apt-get install openssl"
        ) from None
    if done.returncode != 0:
        raise ServiceError(
            f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}", "check openssl's message above"
        )


def make_ca(directory: Path, name: str = "ca", subject: str = "/CN=cdc-dev-ca") -> Path:
    """directory/name.crt and its key directory/name.key (0600); returns the certificate."""
    private_dir(directory)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", DAYS, "-subj", subject,
            "-keyout", str(directory / f"{name}.key"), "-out", str(directory / f"{name}.crt"))  # fmt: skip
    (directory / f"{name}.key").chmod(0o600)
    return directory / f"{name}.crt"


def issue(directory: Path, name: str, subject: str, san: str | None = None) -> tuple[Path, Path]:
    """(certificate, unencrypted PKCS#8 key) `name`.crt/.key signed by directory/ca.crt."""
    d = directory
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
            "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
    (d / f"{name}.key").chmod(0o600)
    ext = []
    if san:
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        ext = ["-extfile", str(d / f"{name}.ext")]
    openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
            "-CAcreateserial", "-days", DAYS, *ext, "-out", str(d / f"{name}.crt"))  # fmt: skip
    return d / f"{name}.crt", d / f"{name}.key"


def pem_keystore(directory: Path, name: str) -> Path:
    """Kafka's PEM keystore of `name`: its unencrypted PKCS#8 key, then its certificate (0600)."""
    pem = directory / f"{name}.pem"
    pem.write_text((directory / f"{name}.key").read_text() + (directory / f"{name}.crt").read_text())
    pem.chmod(0o600)
    return pem


def make_certs(directory: Path) -> tuple[Path, Path, Path]:
    """(CA file, a server's PEM key + certificate file for 127.0.0.1/localhost, another CA's file
    that signed nothing the servers present: for "untrusted CA" checks)."""
    ca = make_ca(directory)
    other = make_ca(directory, "other", "/CN=cdc-dev-other-ca")
    issue(directory, "broker", f"/CN={BROKER_CN}", "IP:127.0.0.1,DNS:localhost")
    return ca, pem_keystore(directory, "broker"), other
