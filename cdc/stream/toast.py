"""Unchanged TOAST values in a row whose key changed.

An update that leaves a TOASTed column alone sends it as "unchanged" (pgoutput's 'u'), and followers
keep the value they have. A row whose key changed is a new row to followers, so it cannot say "keep
the TOAST value you have": its values are taken from the full old row (REPLICA IDENTITY FULL), else
read back from the source by the new key. A value read back may be newer than the event; any later
change of it arrives as its own, newer event, so followers still end identical.
"""

from __future__ import annotations

from typing import cast

from psycopg2 import sql

from cdc.ground.errors import SourceError
from cdc.ground.tables import TableName
from cdc.log.base import TableSchema
from cdc.pgoutput import UNCHANGED, decode_tuple
from cdc.pgoutput_encode import encode_tuple


def has_unchanged(tuple_bytes: bytes) -> bool:
    """Does the TupleData hold an unchanged TOAST value?"""
    return any(v is UNCHANGED for v in decode_tuple(tuple_bytes, 0)[0])


def fill_unchanged(
    conn,
    table: TableName,
    schema: TableSchema,
    key_idx: tuple[int, ...],
    new: bytes,
    old_full: bytes | None,
    read_back: bool = True,
) -> bytes:
    """The TupleData `new` with its unchanged values filled from `old_full` (the whole old row, or
    None) and the rest read back from the source over `conn` (kept unchanged if the row is gone).
    Without `read_back` (a keyless row: nothing to look it up by), a value still missing stops."""
    values = list(decode_tuple(new, 0)[0])
    missing = [i for i, v in enumerate(values) if v is UNCHANGED]
    if old_full is not None:
        old_values = decode_tuple(old_full, 0)[0]
        for i in list(missing):
            if old_values[i] is not UNCHANGED:
                values[i] = old_values[i]
                missing.remove(i)
    if missing and not read_back:
        raise SourceError(
            f"an update of keyless table {table} arrived with unchanged TOAST values its old row does not hold "
            f"({', '.join(schema.columns[i].name for i in missing)})",
            f"check that {table} has REPLICA IDENTITY FULL, then copy it again with `cdc snapshot --tables {table}`",
        )
    if missing:
        names = [schema.columns[i].name for i in missing]
        keys = [schema.columns[i].name for i in key_idx]
        query = sql.SQL("SELECT {} FROM {} WHERE {}").format(
            sql.SQL(", ").join(
                sql.SQL("CASE WHEN {c} IS NULL THEN NULL ELSE format('%%s', {c}) END").format(
                    c=sql.Identifier(n)
                )
                for n in names
            ),
            sql.Identifier(table.schema, table.name),
            sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(k)) for k in keys),
        )
        with conn.cursor() as cur:
            cur.execute(
                query, [cast(bytes, values[i]).decode() for i in key_idx]
            )  # keys: always sent, as text
            row = cur.fetchone()
        if row is not None:  # gone already: a later event in the stream deletes it anyway
            for i, v in zip(missing, row, strict=True):
                values[i] = None if v is None else v.encode()
    return encode_tuple(values)
