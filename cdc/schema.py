"""Building a table's log schema (columns, key, resolved types) from the source catalog."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from cdc.log.base import Column, TableSchema
from cdc.typemap import PgType, resolve_types


def pgtype_to_dict(t: PgType) -> dict[str, Any]:
    return dataclasses.asdict(t)


def pgtype_from_dict(d: Mapping[str, Any]) -> PgType:
    element = d.get("element")
    return PgType(**{**d, "element": pgtype_from_dict(element) if element else None})


class TypeCache:
    """Resolved PgType descriptors by oid, queried from the source once per new oid."""

    def __init__(self) -> None:
        self._types: dict[int, PgType] = {}

    def resolve(self, conn, oids: Iterable[int]) -> dict[int, PgType]:
        missing = {o for o in oids if o not in self._types}
        if missing:
            self._types.update(resolve_types(conn, missing))
        return {o: self._types[o] for o in oids}


def build_schema(
    conn, columns: Iterable[tuple[str, int, int]], key: Iterable[str], types: TypeCache, ndims: Mapping[str, int] | None = None
) -> TableSchema:
    """Schema from (name, type oid, typmod) columns; `ndims` gives declared array dimensions."""
    dims = ndims or {}
    cols = tuple(Column(n, o, m, dims.get(n, 0)) for n, o, m in columns)
    resolved = types.resolve(conn, {c.type_oid for c in cols})
    return TableSchema(cols, tuple(key), {oid: pgtype_to_dict(t) for oid, t in resolved.items()})


def array_dims(conn, table) -> dict[str, int]:
    """Declared dimensions of the table's array columns (int[][] -> 2)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT a.attname, a.attndims FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attndims > 0",
            (table.schema, table.name),
        )
        return dict(cur.fetchall())


def schema_types(schema: TableSchema) -> dict[int, PgType]:
    return {oid: pgtype_from_dict(d) for oid, d in schema.types.items()}
