"""Bearer tokens of `cdc serve`: kept only as SHA-256 hashes, compared in constant time.

Sources (both may be used; at least one token is required, so no token means no data):
  * a file (--tokens FILE or CDC_SERVE_TOKENS_FILE): one `sha256:<64 hex> TABLES` per line, `#` comments;
  * the environment, CDC_SERVE_TOKENS: `TOKEN=TABLES;TOKEN=TABLES` (hashed when read, then forgotten).
TABLES: comma-separated schema.table names or patterns (`public.*`), or `*` for every table.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName, TableSelector

_HASHED = re.compile(r"^sha256:([0-9a-f]{64})$")
ENV_TOKENS = "CDC_SERVE_TOKENS"
ENV_FILE = "CDC_SERVE_TOKENS_FILE"


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class Grant:
    name: str  # where it came from (file:line or env #n): for messages, never the token
    digest: bytes
    selectors: tuple[TableSelector, ...] | None  # None: every table

    def allows(self, table: TableName) -> bool:
        return self.selectors is None or any(s.matches(table) for s in self.selectors)


def _selectors(text: str, where: str) -> tuple[TableSelector, ...] | None:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(
            f"{where}: no tables after the token",
            "write the tables it may read, e.g. public.orders,public.items or *",
        )
    if items == ["*"]:
        return None
    try:
        return tuple(TableSelector.parse(t) for t in items)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}", "name tables as schema.table, schema.* or *") from None


def parse_file(text: str, where: str) -> list[Grant]:
    grants = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split(None, 1)
        m = _HASHED.match(parts[0])
        if m is None or len(parts) != 2:
            raise UsageError(
                f"{where}:{n}: expected `sha256:<64 hex digits> TABLES`",
                'store tokens hashed: printf %s "$TOKEN" | sha256sum, then write sha256:<digest> public.orders',
            )
        grants.append(Grant(f"{where}:{n}", bytes.fromhex(m.group(1)), _selectors(parts[1], f"{where}:{n}")))
    return grants


def parse_env(text: str) -> list[Grant]:
    grants = []
    for n, item in enumerate((i for i in text.split(";") if i.strip()), 1):
        token, sep, tables = item.partition("=")
        where = f"{ENV_TOKENS} entry {n}"
        if not sep or len(token.strip()) < 16:
            raise UsageError(
                f"{where}: expected TOKEN=TABLES with a token of at least 16 characters",
                f"export {ENV_TOKENS}='<token>=public.orders;<token2>=*'",
            )
        grants.append(Grant(where, token_hash(token.strip()), _selectors(tables, where)))
    return grants


def load_grants(file: Path | None) -> list[Grant]:
    grants: list[Grant] = []
    path = file or (Path(os.environ[ENV_FILE]) if os.environ.get(ENV_FILE) else None)
    if path is not None:
        try:
            grants += parse_file(path.read_text(), str(path))
        except OSError as exc:
            raise UsageError(
                f"cannot read the tokens file {path}: {exc.strerror or exc}",
                "pass a readable file with --tokens",
            ) from None
    grants += parse_env(os.environ.get(ENV_TOKENS, ""))
    if not grants:
        raise UsageError(
            "cdc serve has no token: it serves no data without one",
            f"export {ENV_TOKENS}='<token>=public.orders' or pass --tokens FILE (lines `sha256:<digest> TABLES`)",
        )
    return grants


def authorize(grants: list[Grant], token: str | None) -> Grant | None:
    """The grant of this token, or None. Every grant is compared (no early exit on a match)."""
    if not token:
        return None
    digest = token_hash(token)
    found = None
    for grant in grants:
        if hmac.compare_digest(grant.digest, digest):
            found = grant
    return found
