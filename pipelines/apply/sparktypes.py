"""PostgreSQL types -> Spark/Delta types, and the casts from PostgreSQL text (README "Type mapping").

| PostgreSQL | Spark / Delta |
|---|---|
| int2 / int4 / int8, oid, xid | short / int / bigint |
| float4 / float8 (NaN, ±Infinity kept) | float / double |
| numeric(p,s) with p <= 38 and 0 <= s <= p | decimal(p,s) (NaN/Infinity cannot be stored: the batch stops with an error) |
| numeric without precision, or p > 38 | string (exact text) |
| bool | boolean |
| bytea | binary |
| date | date |
| timestamp | timestamp_ntz |
| timestamptz | timestamp (an instant, shown in UTC) |
| arrays of the above (declared dimensions) | array (nested per declared dimension) |
| everything else (text, varchar, uuid, json, jsonb, enums, interval, time, timetz, inet, ...) | string, PostgreSQL's text |

A value Spark cannot hold (BC or infinite dates, NaN in a decimal, an array with more
dimensions than declared) is never turned into a silent NULL: `cast_failures` finds it and
the apply stops naming the table, column and key.
"""

from __future__ import annotations

from pyspark.sql import Column as SparkColumn
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.log.base import Column
from cdc.typemap import PgType, numeric_precision_scale

_SIMPLE: dict[str, T.DataType] = {
    "int2": T.ShortType(),
    "int4": T.IntegerType(),
    "int8": T.LongType(),
    "oid": T.LongType(),
    "xid": T.LongType(),
    "float4": T.FloatType(),
    "float8": T.DoubleType(),
    "bool": T.BooleanType(),
    "bytea": T.BinaryType(),
    "date": T.DateType(),
    "timestamp": T.TimestampNTZType(),
    "timestamptz": T.TimestampType(),
}


def scalar_type(t: PgType, typmod: int) -> T.DataType:
    if t.kind == "base" and t.name in _SIMPLE:
        return _SIMPLE[t.name]
    if t.kind == "base" and t.name == "numeric":
        ps = numeric_precision_scale(typmod if typmod != -1 else t.base_typmod)
        if ps is not None and ps[0] <= 38 and 0 <= ps[1] <= ps[0]:
            return T.DecimalType(*ps)
    return T.StringType()


def spark_type(t: PgType, column: Column) -> T.DataType:
    if t.kind == "array" and t.element is not None:
        inner = scalar_type(t.element, column.typmod)
        for _ in range(max(column.ndims, 1)):
            inner = T.ArrayType(inner, containsNull=True)
        return inner
    return scalar_type(t, column.typmod)


def _guard_special(text: SparkColumn) -> SparkColumn:
    """BC and infinite dates/timestamps have no Spark value: make them fail visibly."""
    return text.endswith(" BC") | text.isin("infinity", "-infinity")


def scalar_from_text(text: SparkColumn, target: T.DataType) -> SparkColumn:
    if isinstance(target, T.StringType):
        return text
    if isinstance(target, T.BinaryType):
        return F.when(text.startswith("\\x"), F.unhex(F.substring(text, 3, 1 << 30)))
    if isinstance(target, T.DateType | T.TimestampType | T.TimestampNTZType):
        return F.when(~_guard_special(text), text.try_cast(target))
    return text.try_cast(target)


def _parse_pg_array(delimiter: str, depth: int):
    """A Python UDF splitting a PostgreSQL array literal into (nested) lists of element texts;
    None when the value's dimensions differ from the declared ones (reported by cast_failures)."""
    from cdc.typemap import parse_array

    result_type: T.DataType = T.StringType()
    for _ in range(depth):
        result_type = T.ArrayType(result_type)

    def depth_of(value):
        d = 0
        while isinstance(value, list):
            d += 1
            value = next((v for v in value if v is not None), None)
        return d

    def parse(text):  # no annotations: Spark would try to infer a pandas UDF from them
        if text is None:
            return None
        items = parse_array(text, delimiter, str)
        if items and depth_of(items) != depth:
            return None
        return items

    return F.udf(parse, result_type)


def from_text(text: SparkColumn, t: PgType, column: Column) -> SparkColumn:
    """PostgreSQL text -> the Spark type of `spark_type(t, column)`."""
    if t.kind == "array" and t.element is not None:
        depth = max(column.ndims, 1)
        elem_type = scalar_type(t.element, column.typmod)
        parsed = _parse_pg_array(t.delimiter, depth)(text)
        if isinstance(elem_type, T.StringType):
            return parsed

        def cast_level(arr: SparkColumn, level: int) -> SparkColumn:
            if level == 1:
                return F.transform(arr, lambda x: scalar_from_text(x, elem_type))
            return F.transform(arr, lambda x: cast_level(x, level - 1))

        return cast_level(parsed, depth)
    return scalar_from_text(text, scalar_type(t, column.typmod))


def _non_null_count(arr: SparkColumn, depth: int) -> SparkColumn:
    flat = arr
    for _ in range(depth - 1):
        flat = F.flatten(flat)
    return F.size(F.filter(flat, lambda x: x.isNotNull()))


def cast_failures(text: SparkColumn, typed: SparkColumn, t: PgType, column: Column) -> SparkColumn:
    """True where a non-NULL source value did not survive the cast."""
    if t.kind == "array" and t.element is not None:
        depth = max(column.ndims, 1)
        if isinstance(scalar_type(t.element, column.typmod), T.StringType):
            return text.isNotNull() & typed.isNull()
        parsed = _parse_pg_array(t.delimiter, depth)(text)
        return text.isNotNull() & (typed.isNull() | (_non_null_count(parsed, depth) != _non_null_count(typed, depth)))
    return text.isNotNull() & typed.isNull()


# Fixed-length types are never stored out of line, so never arrive as "unchanged TOAST".
_FIXED_LENGTH = {
    "int2", "int4", "int8", "oid", "xid", "float4", "float8", "bool", "date", "time", "timetz",
    "timestamp", "timestamptz", "uuid", "money", "interval", "char", "macaddr", "macaddr8",
}


def toastable(t: PgType) -> bool:
    """Whether PostgreSQL may store values of this type out of line (and then send them as unchanged)."""
    return not (t.kind in ("base", "enum") and (t.name in _FIXED_LENGTH or t.kind == "enum"))
