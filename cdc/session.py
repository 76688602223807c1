"""The session settings every connection of ours uses, so PostgreSQL's text output is canonical.

Values in the log are PostgreSQL text output (from COPY in snapshots, from pgoutput in the
stream). Both must print a value the same way, whatever the server's defaults are, or the
same key would look different in a snapshot row and in a later change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
}


def libpq_options() -> str:
    """The value for libpq's `options` connection parameter (applies to walsenders too)."""
    return " ".join(f"-c {name}={value.replace(' ', '')}" for name, value in SESSION_SETTINGS.items())


def run_sql(dsn: str, *statements: str, params: Sequence[Any] | None = None) -> list[tuple]:
    """Run statements on a short autocommit connection with these settings; `params` go to the
    last statement, whose rows (if any) are returned. For set-up work (demo, tests, benchmarks),
    not for capture."""
    import psycopg2

    conn = psycopg2.connect(dsn, options=libpq_options())
    conn.autocommit = True
    rows: list[tuple] = []
    try:
        with conn.cursor() as cur:
            for i, stmt in enumerate(statements):
                cur.execute(stmt, params if i == len(statements) - 1 else None)
                rows = cur.fetchall() if cur.description else []
    finally:
        conn.close()
    return rows
