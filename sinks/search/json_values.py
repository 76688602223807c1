"""A search document's values as JSON, both ways: Spark rows to JSON values (apply, on executors) and
JSON values back to Spark rows (`current()`, for `cdc verify`).

**JSON values** (what the document holds; `current()` turns them back into the source's
Spark types for `cdc verify`): numbers as numbers; float NaN/±Infinity as "NaN", "Infinity",
"-Infinity"; numeric(p,s) as its exact text ("12.50"); bytea as base64; date as
"YYYY-MM-DD"; timestamp as "YYYY-MM-DDTHH:MM:SS.ffffff", timestamptz the same with "Z" (UTC);
arrays as (nested) lists; everything else as the Spark string. Timestamps without time zone go
through Spark's session time zone, which pipelines/spark.py sets to UTC; the sink refuses to
write them under another one.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.log.base import TableSchema
from cdc.pgdatetime import civil_from_days, days_from_civil
from cdc.schema import schema_types
from sinks.sparktypes import from_text, spark_type

_US_PER_DAY = 86_400_000_000


def spark_schema(schema: TableSchema) -> T.StructType:
    types = schema_types(schema)
    return T.StructType(
        [T.StructField(c.name, spark_type(types[c.type_oid], c), True) for c in schema.columns]
    )


# ---- Spark rows -> JSON values (apply) -----------------------------------------------------------
def _has_time(dtype: T.DataType) -> bool:
    while isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    return isinstance(dtype, T.DateType | T.TimestampType | T.TimestampNTZType)


def to_wire(col: SparkColumn, dtype: T.DataType) -> SparkColumn:
    """Spark side, before rows reach Python: dates as day numbers, timestamps as µs since the
    epoch (no Python datetime, whose range and time zone handling differ from Spark's)."""
    if isinstance(dtype, T.DateType):
        return F.unix_date(col)
    if isinstance(dtype, T.TimestampType):
        return F.unix_micros(col)
    if isinstance(dtype, T.TimestampNTZType):
        return F.unix_micros(col.cast(T.TimestampType()))
    if isinstance(dtype, T.ArrayType) and _has_time(dtype.elementType):
        return F.transform(col, lambda x: to_wire(x, dtype.elementType))
    return col


def _year(year: int) -> str:
    if 0 <= year <= 9999:
        return f"{year:04d}"
    return f"+{year}" if year > 9999 else f"-{-year:04d}"


def format_date(days: int) -> str:
    y, m, d = civil_from_days(days)
    return f"{_year(y)}-{m:02d}-{d:02d}"


def format_timestamp(micros: int, zone: bool) -> str:
    days, of_day = divmod(micros, _US_PER_DAY)
    seconds, frac = divmod(of_day, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{format_date(days)}T{hour:02d}:{minute:02d}:{second:02d}.{frac:06d}" + ("Z" if zone else "")


def _float_json(v: float) -> float | str:
    if math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def encoder(dtype: T.DataType) -> Callable[[Any], Any] | None:
    """Non-NULL Python value of a `to_wire` column -> its JSON value in the document; None when
    the value is its own JSON value (ints, bools, strings, arrays of them)."""
    if isinstance(dtype, T.DateType):
        return format_date
    if isinstance(dtype, T.TimestampType):
        return lambda v: format_timestamp(v, True)
    if isinstance(dtype, T.TimestampNTZType):
        return lambda v: format_timestamp(v, False)
    if isinstance(dtype, T.FloatType | T.DoubleType):
        return _float_json
    if isinstance(dtype, T.DecimalType):
        return lambda v: format(v, "f")
    if isinstance(dtype, T.BinaryType):
        return lambda v: base64.b64encode(bytes(v)).decode()
    if isinstance(dtype, T.ArrayType):
        inner = encoder(dtype.elementType)
        if inner is None:
            return list
        return lambda v: [None if x is None else inner(x) for x in v]
    return None


# ---- JSON values -> Spark rows (current(), for verify) -------------------------------------------
_DATE = re.compile(r"([+-]?\d{4,})-(\d\d)-(\d\d)")
_STAMP = re.compile(r"([+-]?\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z?")


def parse_date(text: str) -> int:
    m = _DATE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a date: {text!r}")
    return days_from_civil(int(m.group(1)), int(m.group(2)), int(m.group(3)))


def parse_timestamp(text: str) -> int:
    m = _STAMP.fullmatch(text)
    if m is None:
        raise ValueError(f"not a timestamp: {text!r}")
    days = days_from_civil(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    frac = int(((m.group(7) or "") + "000000")[:6])
    return (
        days * _US_PER_DAY
        + ((int(m.group(4)) * 60 + int(m.group(5))) * 60 + int(m.group(6))) * 1_000_000
        + frac
    )


_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def wire_type(dtype: T.DataType) -> T.DataType:
    """The Spark type `decoder` values are read in, before `from_wire` gives the source type."""
    if isinstance(dtype, T.DateType):
        return T.IntegerType()
    if isinstance(dtype, T.TimestampType | T.TimestampNTZType):
        return T.LongType()
    if isinstance(dtype, T.DecimalType):
        return T.StringType()
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(wire_type(dtype.elementType), True)
    return dtype


def decoder(dtype: T.DataType) -> Callable[[Any], Any]:
    """A document's JSON value -> a Python value of `wire_type(dtype)`."""
    if isinstance(dtype, T.DateType):
        return lambda v: None if v is None else parse_date(v)
    if isinstance(dtype, T.TimestampType | T.TimestampNTZType):
        return lambda v: None if v is None else parse_timestamp(v)
    if isinstance(dtype, T.FloatType | T.DoubleType):
        return lambda v: None if v is None else (_SPECIAL_FLOATS[v] if isinstance(v, str) else float(v))
    if isinstance(dtype, T.DecimalType):
        return lambda v: None if v is None else str(v)
    if isinstance(dtype, T.BinaryType):
        return lambda v: None if v is None else bytearray(base64.b64decode(v))
    if isinstance(dtype, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        return lambda v: None if v is None else int(v)
    if isinstance(dtype, T.StringType):
        return lambda v: None if v is None else (v if isinstance(v, str) else orjson.dumps(v).decode())
    if isinstance(dtype, T.ArrayType):
        inner = decoder(dtype.elementType)
        return lambda v: None if v is None else [inner(x) for x in v]
    return lambda v: v


def from_wire(col: SparkColumn, dtype: T.DataType) -> SparkColumn:
    if isinstance(dtype, T.DateType):
        return F.date_from_unix_date(col)
    if isinstance(dtype, T.TimestampType):
        return F.timestamp_micros(col)
    if isinstance(dtype, T.TimestampNTZType):
        return F.timestamp_micros(col).cast(T.TimestampNTZType())
    if isinstance(dtype, T.DecimalType):
        return col.cast(dtype)
    if (
        isinstance(dtype, T.ArrayType)
        and isinstance(wire_type(dtype), T.ArrayType)
        and wire_type(dtype) != dtype
    ):
        return F.transform(col, lambda x: from_wire(x, dtype.elementType))
    return col


ABSENT = "__cdc_absent"


def _decode_partition(names: list[str], dtypes: list[T.DataType], docs: Iterable[dict]) -> Iterator[tuple]:
    decoders = [decoder(t) for t in dtypes]
    for doc in docs:
        values = []
        absent = []
        for name, dec in zip(names, decoders, strict=True):
            if name in doc:
                values.append(dec(doc[name]))
            else:
                values.append(None)
                absent.append(name)
        values.append(absent)
        yield tuple(values)


def documents_frame(spark: SparkSession, docs, schema: TableSchema) -> DataFrame:
    """The follower's documents (an RDD of JSON objects, read in executors) as a DataFrame of the
    source columns, typed like the source. A column missing from a document (written before the
    column was added) holds the column's fast default, as in the source, or NULL."""
    target = spark_schema(schema)
    names = [f.name for f in target.fields]
    dtypes = [f.dataType for f in target.fields]
    wire = T.StructType(
        [T.StructField(f"c{i}", wire_type(t), True) for i, t in enumerate(dtypes)]
        + [T.StructField(ABSENT, T.ArrayType(T.StringType(), False), False)]
    )
    rows = docs.mapPartitions(lambda it: _decode_partition(names, dtypes, it))
    df = spark.createDataFrame(rows, wire, verifySchema=False)
    types = schema_types(schema)
    cols = []
    for i, (col, dtype) in enumerate(zip(schema.columns, dtypes, strict=True)):
        value = from_wire(F.col(f"c{i}"), dtype)
        if col.missing is not None:
            default = from_text(F.lit(col.missing), types[col.type_oid], col)
            value = F.when(F.array_contains(F.col(ABSENT), col.name), default).otherwise(value)
        cols.append(value.alias(col.name))
    return df.select(*cols)
