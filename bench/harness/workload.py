"""The benchmarks' table and workloads: one 10-column shape, its rows and updates."""

from __future__ import annotations

import time

import psycopg2

from cdc.session import libpq_options

TXN_SIZE = 1000
INSERT_SHARE = 0.7

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

# The note column of the search bench starts with a word, so the index has terms to find.
PLAIN_NOTE = "left(md5(g::text), 20)"
WORD_NOTE = "'note ' || left(md5(g::text), 15)"


def row_expr(note: str = PLAIN_NOTE) -> str:
    """One row per g: every column filled, text ~20 chars, values spread out. No '%' (psycopg2 params)."""
    return f"""
    g, mod(g, 100000)::int, (mod(g, 10000000) / 100.0)::numeric(12,2), g * 0.731::float8,
    {note}, 'code-' || mod(g, 9973)::text, mod(g, 3) = 0,
    timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', date '2024-01-01' + mod(g, 3650)::int,
    md5(g::text)::uuid
"""


ROW_EXPR = row_expr()


def update_set(note: str = "left(md5((id + 7)::text), 20)") -> str:
    return f"""
    qty = qty + 1, price = price + 0.01, score = score * 1.5, note = {note},
    flag = NOT flag, updated_at = updated_at + interval '1 minute'
"""


UPDATE_SET = update_set()


def connect(dsn: str):
    return psycopg2.connect(dsn, options=libpq_options())


def insert_update(dsn: str, table: str, changes: int) -> tuple[int, int, int, float]:
    """`changes` changes in TXN_SIZE-change transactions: 70% inserts of new rows, 30% updates of rows
    inserted before (each row updated at most once). (inserts, updates, transactions, seconds)."""
    conn = connect(dsn)
    insert = f"INSERT INTO {table} SELECT {ROW_EXPR} FROM generate_series(%s, %s) AS g"
    update = f"UPDATE {table} SET {UPDATE_SET} WHERE id BETWEEN %s AND %s"
    next_id, next_upd, remaining = 1, 1, changes
    inserts = updates = txns = 0
    t0 = time.perf_counter()
    try:
        with conn.cursor() as cur:
            while remaining > 0:
                size = min(TXN_SIZE, remaining)
                n_ins = max(1, round(size * INSERT_SHARE))
                n_upd = size - n_ins
                cur.execute(insert, (next_id, next_id + n_ins - 1))
                next_id += n_ins
                if n_upd:
                    cur.execute(update, (next_upd, next_upd + n_upd - 1))  # always ids below next_id
                    assert cur.rowcount == n_upd, cur.rowcount
                    next_upd += n_upd
                conn.commit()
                inserts, updates, txns = inserts + n_ins, updates + n_upd, txns + 1
                remaining -= size
    finally:
        conn.close()
    return inserts, updates, txns, time.perf_counter() - t0


def load_table(run_sql_on, table: str, rows: int, *, publication: str | None = None) -> None:
    """CREATE the table with `rows` rows, vacuumed and analysed (and its publication)."""
    run_sql_on(
        f"CREATE TABLE {table} ({COLUMNS})",
        f"INSERT INTO {table} SELECT {ROW_EXPR} FROM generate_series(1, {rows}) AS g",
        f"VACUUM (ANALYZE) {table}",
        *([f"CREATE PUBLICATION {publication} FOR TABLE {table}"] if publication else []),
        "CHECKPOINT",
    )
