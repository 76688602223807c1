"""The SQL of a chunked snapshot (snapshot/chunked.py) on the source: whether a table's key can
order chunks, the key's types, the query that bounds the next key range (snapshot/keyranges.py)
and the COPY of one chunk."""

from __future__ import annotations

import psycopg2
from psycopg2 import sql

from cdc.filters import select_query
from cdc.ground.errors import SourceError
from cdc.ground.tables import TableName
from snapshot.keyranges import Key, KeyRange


def key_types(conn, table: TableName, key: tuple[str, ...]) -> list[str]:
    """SQL type names of the key columns (the chunk query casts the last key's text back with them)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = %s::regclass"
            " AND attnum > 0 AND NOT attisdropped",
            (str(table),),
        )
        types = dict(cur.fetchall())
    return [types[k] for k in key]


def orderable_key(conn, table: TableName, key: tuple[str, ...]) -> bool:
    """Whether the key is exactly the columns of a valid unique btree index (a primary key is one):
    then `ORDER BY key` and `key > last` walk the table in one well-defined order."""
    if not key:
        return False
    with conn.cursor() as cur:
        cur.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam"
            " WHERE i.indrelid = %s::regclass AND i.indisunique AND i.indisvalid AND a.amname = 'btree'"
            " AND i.indnkeyatts = %s AND i.indexprs IS NULL AND i.indpred IS NULL"
            " AND (SELECT array_agg(attname::text ORDER BY attname) FROM pg_attribute WHERE attrelid = i.indrelid"
            "      AND attnum = ANY(i.indkey::int2[])) = (SELECT array_agg(k ORDER BY k) FROM unnest(%s::text[]) k))",
            (str(table), len(key), list(key)),
        )
        return bool(cur.fetchone()[0])


def _key_list(key: tuple[str, ...]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(k) for k in key)


def _key_bound(key: tuple[str, ...], types: list[str], op: str, bound: Key) -> sql.Composed:
    """`(k1, k2) > (CAST('v1' AS t1), ...)`: a row comparison the key's btree index answers."""
    values = sql.SQL(", ").join(
        sql.SQL("CAST({} AS {})").format(sql.Literal(v), sql.SQL(t))
        for v, t in zip(bound, types, strict=True)
    )
    return sql.SQL("({}) {} ({})").format(_key_list(key), sql.SQL(op), values)


def boundary_statement(
    table: TableName, key: tuple[str, ...], types: list[str], lo: Key | None, chunk_rows: int
) -> sql.Composed:
    """The keys at positions chunk_rows and chunk_rows + 1 above `lo`, in key order, as text
    (snapshot/keyranges.range_from reads them): a walk over the key's index, no rows read. It
    ignores the row filter, so every chunk spans the same share of the index."""
    keys = _key_list(key)
    walk = sql.SQL("SELECT {} FROM {}").format(keys, sql.Identifier(table.schema, table.name))
    if lo is not None:
        walk += sql.SQL(" WHERE {}").format(_key_bound(key, types, ">", lo))
    walk += sql.SQL(" ORDER BY {} OFFSET {} LIMIT 2").format(keys, sql.Literal(chunk_rows - 1))
    # the two keys found as text (cast outside: not for every key walked over); qualified names:
    # a bare ORDER BY "id" would sort by the output column "id", the text
    texts = sql.SQL(", ").join(sql.SQL("b.{}::text").format(sql.Identifier(k)) for k in key)
    ordered = sql.SQL(", ").join(sql.SQL("b.{}").format(sql.Identifier(k)) for k in key)
    return sql.SQL("SELECT {} FROM ({}) b ORDER BY {}").format(texts, walk, ordered)


def chunk_statement(
    table: TableName,
    columns: tuple[str, ...],
    key: tuple[str, ...],
    types: list[str],
    where: str | None,
    chunk: KeyRange,
) -> sql.Composed:
    """COPY of one chunk: the captured columns and rows (cdc.filters.select_query, as the
    publication sends them) with a key in (lo, hi]. No ORDER BY: a bounded range needs none, and
    the planner may pick any scan (the last, open-ended chunk of a small table: a plain seq scan)."""
    bounds: list[sql.Composable] = []
    if chunk.lo is not None:
        bounds.append(_key_bound(key, types, ">", chunk.lo))
    if chunk.hi is not None:
        bounds.append(_key_bound(key, types, "<=", chunk.hi))
    return sql.SQL("COPY ({}) TO STDOUT").format(select_query(table, columns, where, bounds))


def read_error(table: TableName, exc: psycopg2.Error) -> SourceError:
    message = (exc.pgerror or str(exc)).strip()
    fix = "GRANT SELECT on the table to the pipeline's role" if "permission denied" in message else None
    return SourceError(f"chunked snapshot of {table}: {message}", fix)
