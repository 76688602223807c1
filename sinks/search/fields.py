"""A search follower's field per source column: what of a document is searchable, derived from the
column's type or configured (sinks/search/documents.py says what a document is).

**Field types** (`fields:` in the sink's settings overrides them per column):

| source type | field type |
|---|---|
| key columns holding text (any string type) | keyword |
| text, varchar, char, citext, name, json, jsonb, xml, tsvector | text (tokenized) |
| uuid, enums, inet, interval, timetz, money, other string-typed values | keyword (exact) |
| int2 / int4 / int8 (oid, xid, time as µs) | short / integer / long |
| float4 / float8, numeric(p,s), numeric | float / double / double / double |
| bool | boolean |
| date, timestamp, timestamptz | date |
| bytea | binary (kept, not searchable) |
| arrays | the element's field type, one value per element |

A derived numeric or date field is lenient: a value it cannot index (NaN, a date after 9999)
is kept in the document and only left out of the index. A field type given in `fields:` is
strict: a value it cannot take rejects the row, and the apply stops naming table and key.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import types as T

from cdc.ground.errors import SinkError
from cdc.log.base import TableSchema
from cdc.schema import schema_types
from cdc.typemap import PgType
from sinks.sparktypes import spark_type

FIELD_TYPES = (
    "text",
    "keyword",
    "long",
    "integer",
    "short",
    "double",
    "float",
    "boolean",
    "date",
    "binary",
    "stored",
)
TEXT_TYPES = {"text", "varchar", "bpchar", "citext", "name", "json", "jsonb", "xml", "tsvector"}


# ---- field types ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class FieldSpec:
    column: str
    type: str  # one of FIELD_TYPES
    derived: bool  # True: from the source type (lenient); False: configured (strict)


def _scalar_field(t: PgType, dtype: T.DataType, is_key: bool) -> str:
    if isinstance(dtype, T.ByteType | T.ShortType):
        return "short"
    if isinstance(dtype, T.IntegerType):
        return "integer"
    if isinstance(dtype, T.LongType):
        return "long"
    if isinstance(dtype, T.FloatType):
        return "float"
    if isinstance(dtype, T.DoubleType | T.DecimalType):
        return "double"
    if isinstance(dtype, T.BooleanType):
        return "boolean"
    if isinstance(dtype, T.BinaryType):
        return "binary"
    if isinstance(dtype, T.DateType | T.TimestampType | T.TimestampNTZType):
        return "date"
    if t.kind == "base" and t.name == "numeric":  # numeric without precision: exact text, indexed as a number
        return "double"
    if is_key:
        return "keyword"
    return "text" if t.kind == "base" and t.name in TEXT_TYPES else "keyword"


def derive_field(t: PgType, dtype: T.DataType, is_key: bool) -> str:
    while isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    if t.kind == "array" and t.element is not None:
        t = t.element
    return _scalar_field(t, dtype, is_key)


def field_specs(schema: TableSchema, configured: dict[str, str], table: str) -> list[FieldSpec]:
    names = set(schema.column_names)
    unknown = sorted(set(configured) - names)
    if unknown:
        raise SinkError(
            f"{table}: `fields` names column(s) the table does not have: {', '.join(unknown)}",
            f"the columns are: {', '.join(schema.column_names)}",
        )
    types = schema_types(schema)
    specs = []
    for col in schema.columns:
        if col.name in configured:
            specs.append(FieldSpec(col.name, configured[col.name], False))
        else:
            t = types[col.type_oid]
            specs.append(
                FieldSpec(col.name, derive_field(t, spark_type(t, col), col.name in schema.key), True)
            )
    return specs
