"""Is the source connection encrypted and its server checked? `cdc validate` warns when the DSN
reaches a host that is not loopback with an sslmode weaker than source.postgres.min_sslmode:
over a network, `prefer` (libpq's default) silently falls back to plain text and neither it nor
`require` checks who answers. Decided from the DSN (and the PG* variables libpq reads when the
DSN leaves a key out), never printing it: it may hold a password."""

from __future__ import annotations

import ipaddress
import os

from psycopg2.extensions import parse_dsn

# libpq's sslmode values, weakest first
SSLMODES = ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]
RISK = {
    "require": "encrypted, but nothing checks the server's certificate (anyone in the path can answer)",
    "verify-ca": "the certificate is checked against the CA, but not that it was issued for this host",
}


def _setting(params: dict[str, str], key: str, env: str, default: str = "") -> str:
    return params.get(key) or os.environ.get(env, "") or default


def is_loopback(host: str) -> bool:
    """A Unix socket (empty, /path or @abstract), `localhost`, 127.0.0.0/8 or ::1."""
    host = host.strip()
    if not host or host.startswith(("/", "@")) or host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: what it resolves to can change, so it counts as remote


def tls_warning(dsn: str, min_sslmode: str) -> tuple[str, str] | None:
    """(problem, fix) when the DSN reaches a non-loopback host with sslmode below min_sslmode."""
    try:
        params = parse_dsn(dsn)
    except Exception:  # a malformed DSN: the connection attempt reports it
        return None
    # the address connected to: hostaddr when given (host then only names it), else host
    where = _setting(params, "hostaddr", "PGHOSTADDR") or _setting(params, "host", "PGHOST")
    remote = [h for h in where.split(",") if not is_loopback(h)]
    if not remote:
        return None
    mode = _setting(params, "sslmode", "PGSSLMODE", "prefer")
    if mode in SSLMODES and SSLMODES.index(mode) >= SSLMODES.index(min_sslmode):
        return None
    problem = (
        f"source.postgres.dsn: host {', '.join(remote)} is not loopback and sslmode is {mode}"
        + (" (libpq's default)" if "sslmode" not in params and not os.environ.get("PGSSLMODE") else "")
        + ": "
        + RISK.get(mode, "the connection may be plain text")
    )
    fix = (
        "add sslmode=verify-full and sslrootcert=/path/to/ca.crt to the DSN (`?sslmode=verify-full&sslrootcert=...` "
        "in a postgresql:// URL); if encryption without checking the certificate is enough, set "
        "source.postgres.min_sslmode: require and sslmode=require"
    )
    return problem, fix
