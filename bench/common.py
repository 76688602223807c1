"""What the benchmarks share: the 10-column table shape and progress lines (one-shot SQL is
cdc.session.run_sql).

Imported as `common` by the scripts in this folder (run as `.venv/bin/python bench/<name>.py`,
which puts bench/ on sys.path)."""

from __future__ import annotations

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


