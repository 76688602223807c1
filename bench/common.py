"""What the benchmarks share: the 10-column table shape, progress lines, one-shot SQL.

Imported as `common` by the scripts in this folder (run as `.venv/bin/python bench/<name>.py`,
which puts bench/ on sys.path)."""

from __future__ import annotations

import psycopg2

from cdc.session import libpq_options

# bigint key + the common PostgreSQL types: about 126 bytes of heap per row.
COLUMNS = """
    id         bigint PRIMARY KEY,
    qty        integer NOT NULL,
    price      numeric(12,2),
    score      float8,
    note       text,
    code       varchar(32),
    flag       boolean,
    updated_at timestamptz,
    day        date,
    ref        uuid
"""


def say(message: str) -> None:
    print(message, flush=True)


def run_sql(dsn: str, *statements: str, params: tuple | None = None) -> list[tuple]:
    """Run statements in autocommit with cdc's session settings; `params` go to the last one,
    whose rows are returned."""
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
