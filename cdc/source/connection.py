"""Connecting to the source PostgreSQL with the canonical session settings; a failed connection
becomes an error naming the problem and the fix, the password never shown."""

from __future__ import annotations

from typing import Any

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from cdc.ground.errors import PipelineFileError, SourceError
from cdc.ground.secrets import redact_with
from cdc.session import libpq_options


def _password_of(dsn: str) -> list[str]:
    try:
        return [psycopg2.extensions.parse_dsn(dsn).get("password", "")]
    except psycopg2.ProgrammingError:
        return []


def connect(dsn: str, *, replication: bool = False, application_name: str = "cdc", autocommit: bool = True):
    """Open a connection with our canonical session settings; turn failures into readable errors."""
    try:
        psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError as exc:
        raise PipelineFileError(
            f"source.postgres.dsn is not a valid connection string: {redact_with(str(exc).strip(), _password_of(dsn))}",
            "use a URI like postgresql://user:password@host:5432/dbname or key=value pairs",
        ) from None
    kwargs: dict[str, Any] = {
        "options": libpq_options(),
        "connect_timeout": 10,
        "application_name": application_name,
    }
    if replication:
        kwargs["connection_factory"] = psycopg2.extras.LogicalReplicationConnection
    try:
        conn = psycopg2.connect(dsn, **kwargs)
    except psycopg2.OperationalError as exc:
        message = redact_with(" ".join(str(exc).split()), _password_of(dsn))
        if "invalid" in message and (
            "connection option" in message or "value for parameter" in message or "integer value" in message
        ):
            raise PipelineFileError(
                f"source.postgres.dsn has an invalid value: {message}",
                "fix that parameter of the connection string",
            ) from None
        fix = "check host, port, user and password in source.postgres.dsn and that the server accepts connections"
        if "replication" in message and "pg_hba" in message:
            fix = "allow replication connections for this user in pg_hba.conf (host replication ... or host all ...)"
        raise SourceError(f"cannot connect to the source database: {message}", fix) from None
    if not replication:
        conn.autocommit = autocommit
    return conn
