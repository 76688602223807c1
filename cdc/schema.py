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


def build_schema(conn, columns: Iterable[tuple[str, int, int]], key: Iterable[str], types: TypeCache) -> TableSchema:
    cols = tuple(Column(n, o, m) for n, o, m in columns)
    resolved = types.resolve(conn, {c.type_oid for c in cols})
    return TableSchema(cols, tuple(key), {oid: pgtype_to_dict(t) for oid, t in resolved.items()})


def schema_types(schema: TableSchema) -> dict[int, PgType]:
    return {oid: pgtype_from_dict(d) for oid, d in schema.types.items()}
