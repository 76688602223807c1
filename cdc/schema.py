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
    conn,
    columns: Iterable[tuple[str, int, int]],
    key: Iterable[str],
    types: TypeCache,
    extras: Mapping[str, tuple[int, str | None]] | None = None,
) -> TableSchema:
    """Schema from (name, type oid, typmod) columns; `extras` gives (array dims, missing value) by name."""
    more = extras or {}
    cols = tuple(Column(n, o, m, *more.get(n, (0, None))) for n, o, m in columns)
    resolved = types.resolve(conn, {c.type_oid for c in cols})
    return TableSchema(cols, tuple(key), {oid: pgtype_to_dict(t) for oid, t in resolved.items()})


COLUMN_EXTRAS_SQL = (
    "SELECT a.attname, a.attndims,"
    " CASE WHEN a.atthasmissing THEN (SELECT m FROM unnest(a.attmissingval::text::text[]) m LIMIT 1) END"
    " FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped"
    " AND (a.attndims > 0 OR a.atthasmissing)"
)


def column_extras(conn, table) -> dict[str, tuple[int, str | None]]:
    """Declared array dimensions (int[][] -> 2) and fast-default values, by column name."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (table.schema, table.name),
        )
        row = cur.fetchone()
        if row is None:
            return {}
        cur.execute(COLUMN_EXTRAS_SQL, (row[0],))
        return {name: (dims, missing) for name, dims, missing in cur.fetchall()}


def schema_types(schema: TableSchema) -> dict[int, PgType]:
    return {oid: pgtype_from_dict(d) for oid, d in schema.types.items()}
