"""A column's PostgreSQL type as value conversion needs it (PgType), read from the catalog in one
query with domains resolved to their base type and arrays to their element type; numeric's
precision and scale from its type modifier; and the shape of a converter (cdc/typemap.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

JsonValue = None | bool | int | float | str | list
Converter = Callable[[str], JsonValue]


@dataclass(frozen=True, slots=True)
class PgType:
    """A column type as far as value conversion needs it (domains already resolved)."""

    oid: int  # the resolved type's oid (for a domain: its base type's; the dict key is the oid asked for)
    name: str  # pg_type.typname of the resolved type: 'int4', '_int4', 'mood', ...
    kind: str  # 'base' | 'enum' | 'array' | 'composite' | 'range' | 'multirange' | 'pseudo' | 'other'
    element: PgType | None = None  # arrays: the element type, resolved through domains
    delimiter: str = ","  # arrays: the element type's typdelim (';' for box)
    base_typmod: int = -1  # domains: the domain's typtypmod (e.g. numeric(10,2))
    domain_name: str | None = None  # the declared domain's name when the column's type was a domain


_KINDS = {"b": "base", "c": "composite", "e": "enum", "p": "pseudo", "r": "range", "m": "multirange"}

# One query: the requested types plus, transitively, the base types of domains and the element
# types of arrays (a domain over an array of a domain over ... all come back in one round trip).
_RESOLVE_SQL = """
WITH RECURSIVE wanted(oid) AS (
    SELECT unnest(%s::oid[])
  UNION
    SELECT ref.oid
      FROM wanted
      JOIN pg_catalog.pg_type t ON t.oid = wanted.oid
      CROSS JOIN LATERAL (VALUES
          (NULLIF(t.typbasetype, 0)),
          (CASE WHEN t.typoutput = 'pg_catalog.array_out'::regproc THEN t.typelem END)
      ) AS ref(oid)
     WHERE ref.oid IS NOT NULL
)
SELECT t.oid::int8, t.typname::text, t.typtype::text, t.typbasetype::int8, t.typtypmod,
       t.typelem::int8, t.typdelim::text, t.typoutput = 'pg_catalog.array_out'::regproc
  FROM pg_catalog.pg_type t
 WHERE t.oid IN (SELECT oid FROM wanted)
"""


def resolve_types(conn: Any, oids: Iterable[int]) -> dict[int, PgType]:
    """Describe the types with these oids (e.g. pg_attribute.atttypid of a table's columns).

    `conn` is a psycopg2 connection; a single catalog query is made. Domains are resolved
    recursively to their base type (`domain_name` keeps the declared domain's name and
    `base_typmod` its type modifier); arrays get their element type, itself resolved. An oid
    that is not in pg_type comes back as kind 'other' (its values are kept as text).
    """
    wanted = sorted({int(o) for o in oids})
    if not wanted:
        return {}
    with conn.cursor() as cur:
        cur.execute(_RESOLVE_SQL, (wanted,))
        rows = {row[0]: row for row in cur.fetchall()}
    memo: dict[int, PgType] = {}

    def build(oid: int, depth: int = 0) -> PgType:
        done = memo.get(oid)
        if done is not None:
            return done
        row = rows.get(oid)
        if row is None or depth > 64:
            result = PgType(oid, "?" if row is None else row[1], "other")
        else:
            _, name, typtype, basetype, typtypmod, elem, _delim, is_array = row
            if typtype == "d":
                base = build(basetype, depth + 1)
                result = replace(
                    base,
                    base_typmod=typtypmod if typtypmod != -1 else base.base_typmod,
                    domain_name=name,
                )
            elif is_array and elem:
                elem_row = rows.get(elem)
                delimiter = elem_row[6] if elem_row is not None else ","
                result = PgType(oid, name, "array", element=build(elem, depth + 1), delimiter=delimiter)
            else:
                result = PgType(oid, name, _KINDS.get(typtype, "other"))
        memo[oid] = result
        return result

    return {oid: build(oid) for oid in wanted}


def numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    """numeric's (precision, scale) from its type modifier; None when unconstrained (-1).

    The scale may be negative or larger than the precision (PostgreSQL 15+).
    """
    if typmod < 4:  # VARHDRSZ; -1 means no modifier
        return None
    value = typmod - 4
    precision = (value >> 16) & 0xFFFF
    scale = ((value & 0x7FF) ^ 1024) - 1024  # 11-bit two's complement
    return precision, scale
