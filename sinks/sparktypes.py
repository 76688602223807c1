"""PostgreSQL types -> Spark/Delta types, and the casts from PostgreSQL text (docs/reference/types.md).

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
| time | bigint, microseconds since midnight (as in the envelope) |
| timetz | string, the time in UTC with `Z` (as in the envelope) |
| interval | string, `P{y}Y{m}M{d}DT{h}H{m}M{s}S` (as in the envelope) |
| arrays of the above (declared dimensions) | array (nested per declared dimension) |
| everything else (text, varchar, uuid, json, jsonb, enums, inet, money, ...) | string, PostgreSQL's text (= the envelope's) |

Values reach Spark either as PostgreSQL text (the local log: `from_text`) or as envelope JSON
values (Kafka topics, ours or Debezium's: `from_envelope`); both give the same Spark values.

A value Spark cannot hold (BC or infinite dates, NaN in a decimal, an array with more
dimensions than declared) is never turned into a silent NULL: `cast_failures` finds it and
the apply stops naming the table, column and key.
"""

from __future__ import annotations

from pyspark.sql import Column as SparkColumn
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.log.base import Column
from cdc.pgtypes import numeric_precision_scale
from cdc.typemap import PgType

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
    "time": T.LongType(),
}
# Types whose Delta value is the envelope's representation, computed from PostgreSQL text by the
# type mapping in Python (no Spark function does these conversions).
_VIA_TYPEMAP = {"timetz", "interval"}


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


def _micros_of_day(text: SparkColumn) -> SparkColumn:
    """'HH:MM:SS[.ffffff]' -> microseconds since midnight."""
    parts = F.split(text, ":")
    seconds = parts[2].try_cast(T.DecimalType(8, 6))
    return (parts[0].try_cast(T.LongType()) * 3600 + parts[1].try_cast(T.LongType()) * 60) * 1_000_000 + (
        seconds * 1_000_000
    ).cast(T.LongType())


def _typemap_udf(t: PgType, typmod: int, result: T.DataType):
    from cdc.typemap import converter

    convert = converter(t, typmod)

    def apply(text):  # no annotations: Spark would try to infer a pandas UDF from them
        return None if text is None else convert(text)

    return F.udf(apply, result)


def scalar_from_text(
    text: SparkColumn, target: T.DataType, t: PgType | None = None, typmod: int = -1
) -> SparkColumn:
    if t is not None and t.kind == "base" and t.name == "time":
        return _micros_of_day(text)
    if t is not None and t.kind == "base" and t.name in _VIA_TYPEMAP:
        return _typemap_udf(t, typmod, T.StringType())(text)
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
    from cdc.pgarrays import parse_array

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
        items = parse_array(
            text[text.index("=") + 1 :] if text[:1] == "[" else text, delimiter, str
        )  # '[0:1]={..}': bounds dropped
        if items and depth_of(items) != depth:
            return None
        return items

    return F.udf(parse, result_type)


def _cast_elements(arr: SparkColumn, depth: int, cast) -> SparkColumn:
    if depth == 1:
        return F.transform(arr, cast)
    return F.transform(arr, lambda x: _cast_elements(x, depth - 1, cast))


def from_text(text: SparkColumn, t: PgType, column: Column) -> SparkColumn:
    """PostgreSQL text -> the Spark type of `spark_type(t, column)`."""
    if t.kind == "array" and t.element is not None:
        depth = max(column.ndims, 1)
        elem = t.element
        elem_type = scalar_type(elem, column.typmod)
        if elem.kind == "base" and elem.name in _VIA_TYPEMAP:
            return _typemap_udf(t, column.typmod, spark_type(t, column))(text)
        parsed = _parse_pg_array(t.delimiter, depth)(text)
        if isinstance(elem_type, T.StringType):
            return parsed
        return _cast_elements(parsed, depth, lambda x: scalar_from_text(x, elem_type, elem, column.typmod))
    return scalar_from_text(text, scalar_type(t, column.typmod), t, column.typmod)


def scalar_from_envelope(text: SparkColumn, target: T.DataType, t: PgType) -> SparkColumn:
    """An envelope JSON value (as its JSON text, strings unquoted) -> the Spark type."""
    name = t.name if t.kind == "base" else ""
    if name == "bytea":
        return F.try_to_binary(text, F.lit("base64"))
    if name == "date":
        return F.date_add(F.lit("1970-01-01").cast(T.DateType()), text.try_cast(T.IntegerType()))
    if name == "timestamp":
        return F.timestamp_micros(text.try_cast(T.LongType())).cast(T.TimestampNTZType())
    if isinstance(target, T.StringType):
        return text
    return text.try_cast(target)


def nested_array(element: T.DataType, depth: int) -> T.ArrayType:
    """`element` in `depth` (at least 1) levels of array."""
    out = T.ArrayType(element)
    for _ in range(depth - 1):
        out = T.ArrayType(out)
    return out


def from_envelope(text: SparkColumn, t: PgType, column: Column) -> SparkColumn:
    """Envelope JSON value text -> the Spark type of `spark_type(t, column)`."""
    target = spark_type(t, column)
    if t.kind == "array" and t.element is not None:
        depth = max(column.ndims, 1)
        parsed = F.from_json(text, nested_array(T.StringType(), depth))
        elem_type = scalar_type(t.element, column.typmod)
        if isinstance(elem_type, T.StringType):
            return parsed
        return _cast_elements(parsed, depth, lambda x: scalar_from_envelope(x, elem_type, t.element))
    return scalar_from_envelope(text, target, t)


def _non_null_count(arr: SparkColumn, depth: int) -> SparkColumn:
    flat = arr
    for _ in range(depth - 1):
        flat = F.flatten(flat)
    return F.size(F.filter(flat, lambda x: x.isNotNull()))


def cast_failures(
    text: SparkColumn, typed: SparkColumn, t: PgType, column: Column, kind: str = "pgtext"
) -> SparkColumn:
    """True where a non-NULL source value did not survive the cast."""
    if t.kind == "array" and t.element is not None:
        depth = max(column.ndims, 1)
        if isinstance(scalar_type(t.element, column.typmod), T.StringType) or (
            t.element.kind == "base" and t.element.name in _VIA_TYPEMAP
        ):
            return text.isNotNull() & typed.isNull()
        if kind == "envelope":
            parsed = F.from_json(text, nested_array(T.StringType(), depth))
        else:
            parsed = _parse_pg_array(t.delimiter, depth)(text)
        return text.isNotNull() & (
            typed.isNull() | (_non_null_count(parsed, depth) != _non_null_count(typed, depth))
        )
    return text.isNotNull() & typed.isNull()


# Fixed-length types are never stored out of line, so never arrive as "unchanged TOAST".
_FIXED_LENGTH = {
    "int2",
    "int4",
    "int8",
    "oid",
    "xid",
    "float4",
    "float8",
    "bool",
    "date",
    "time",
    "timetz",
    "timestamp",
    "timestamptz",
    "uuid",
    "money",
    "interval",
    "char",
    "macaddr",
    "macaddr8",
}


def toastable(t: PgType) -> bool:
    """Whether PostgreSQL may store values of this type out of line (and then send them as unchanged)."""
    return not (t.kind in ("base", "enum") and (t.name in _FIXED_LENGTH or t.kind == "enum"))
