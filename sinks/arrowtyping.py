"""A small cut's events typed in the driver with pyarrow, where Spark's casts would give the same
values (sinks/sparktypes.py `from_text`): no Spark job to check the values and none to bring the
typed rows back for delta-rs (docs/performance.md, "What is left of an insert cut").

Only for PostgreSQL text (the embedded log) and types PostgreSQL prints one way under cdc's session
settings (cdc/session.py: DateStyle ISO, TimeZone UTC, extra_float_digits 3, bytea_output hex):
integers, floats, bool, numeric(p,s) stored as decimal, date, timestamp, timestamptz, bytea, time,
every type Spark keeps as text, and arrays of those. Anything else (timetz, interval), or a value pyarrow will not parse
(NaN in a decimal, BC or infinite dates, years past 9999, a number too big), gives None: Spark then
types the cut as before and names the value it cannot store. tests/integration/test_arrow_typing.py
compares both on values PostgreSQL printed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from cdc.log.base import Column, TableSchema
from cdc.pgarrays import parse_array
from cdc.schema import schema_types
from cdc.typemap import PgType
from sinks.sparktypes import spark_type

if TYPE_CHECKING:
    from collections.abc import Callable

# Spark type -> the Arrow type Spark's toArrow gives it (and pyarrow's cast parses the text into)
_PARSED: dict[type[T.DataType], Callable[[T.DataType], pa.DataType]] = {
    T.ShortType: lambda _: pa.int16(),
    T.IntegerType: lambda _: pa.int32(),
    T.LongType: lambda _: pa.int64(),
    T.FloatType: lambda _: pa.float32(),
    T.DoubleType: lambda _: pa.float64(),
    T.DecimalType: lambda t: pa.decimal128(t.precision, t.scale),  # type: ignore[attr-defined]
    T.DateType: lambda _: pa.date32(),
    T.TimestampNTZType: lambda _: pa.timestamp("us"),
    T.TimestampType: lambda _: pa.timestamp("us", tz="UTC"),  # PostgreSQL prints the offset (+00)
}
# Spark keeps these as text, but not PostgreSQL's own (cdc/typemap.py converts them)
_NOT_AS_PRINTED = {"timetz", "interval"}
_HEX = r"^\\x([0-9a-fA-F]{2})*$"  # bytea as bytea_output=hex prints it
_TIME = r"^[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?$"  # time: HH:MM:SS[.ffffff]


def typed_text(texts: pa.Array, t: PgType, column: Column) -> pa.Array | None:
    """PostgreSQL's text of one column as Spark would type it; None when this module does not
    type it so (the type) or a value does not parse (Spark then decides)."""
    if t.kind == "array" and t.element is not None:
        return _array(texts, t, column)
    target = spark_type(t, column)
    name = t.name if t.kind == "base" else ""
    if isinstance(target, T.StringType):
        return None if name in _NOT_AS_PRINTED else texts.cast(pa.string())
    if isinstance(target, T.BooleanType):
        return _bool(texts)
    if name == "bytea":
        return _bytea(texts)
    if name == "time":
        return _micros_of_day(texts)
    parsed = _PARSED.get(type(target))
    if parsed is None:
        return None
    try:
        return pc.cast(texts, parsed(target), safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _depth(value: object) -> int:
    """Levels of nesting, down the first non-NULL element of each level (as Spark's UDF counts)."""
    depth = 0
    while isinstance(value, list):
        depth += 1
        value = next((v for v in value if v is not None), None)
    return depth


def _array(texts: pa.Array, t: PgType, column: Column) -> pa.Array | None:
    """Array literals split by the parser Spark's UDF uses (cdc.pgarrays, bounds like `[0:1]=`
    dropped), their elements typed as a column of the element type is, nested again per declared
    dimension. None when a value's dimensions differ from the declared ones (Spark names it), a
    literal does not parse, or an element is not typed here."""
    element = t.element
    assert element is not None
    if element.kind == "base" and element.name in _NOT_AS_PRINTED:
        return None  # Spark converts these arrays whole (cdc/typemap.py)
    depth = max(column.ndims, 1)
    values: list[list | None] = []
    for text in texts.to_pylist():
        if text is None:
            values.append(None)
            continue
        try:
            items = parse_array(text[text.index("=") + 1 :] if text[:1] == "[" else text, t.delimiter, str)
        except ValueError:
            return None
        if items and _depth(items) != depth:
            return None
        values.append(items)
    nested_type: pa.DataType = pa.string()
    for _ in range(depth):
        nested_type = pa.list_(nested_type)
    levels = [pa.array(values, type=nested_type)]
    for _ in range(depth - 1):
        levels.append(levels[-1].values)
    elements = typed_text(levels[-1].values, element, Column(column.name, column.type_oid, column.typmod))
    if elements is None:
        return None
    out = elements
    for level in reversed(levels):  # Spark's Arrow names a list's field `element`
        kind = pa.list_(pa.field("element", out.type))
        out = pa.ListArray.from_arrays(level.offsets, out, type=kind, mask=level.is_null())
    return out


def _bool(texts: pa.Array) -> pa.Array | None:
    true = pc.equal(texts, "t")
    if pc.any(pc.and_(pc.invert(true), pc.not_equal(texts, "f"))).as_py():
        return None  # PostgreSQL prints only t and f
    return true


def _all_match(texts: pa.Array, pattern: str) -> bool:
    return not pc.any(pc.invert(pc.match_substring_regex(texts, pattern))).as_py()


def _bytea(texts: pa.Array) -> pa.Array | None:
    """`\\x00ff` -> its bytes (Spark: unhex of the digits)."""
    if not _all_match(texts, _HEX):
        return None
    return pa.array([None if t is None else bytes.fromhex(t[2:]) for t in texts.to_pylist()], pa.binary())


def _micros_of_day(texts: pa.Array) -> pa.Array | None:
    """`HH:MM:SS[.ffffff]` -> microseconds since midnight, as Spark computes it (24:00:00 included)."""
    if not _all_match(texts, _TIME):
        return None
    out: list[int | None] = []
    for t in texts.to_pylist():
        if t is None:
            out.append(None)
            continue
        whole, _, fraction = t[6:].partition(".")
        micros = int(fraction.ljust(6, "0")) if fraction else 0
        out.append((int(t[0:2]) * 3600 + int(t[3:5]) * 60 + int(whole)) * 1_000_000 + micros)
    return pa.array(out, pa.int64())


def typed_events(events: pa.Table, schema: TableSchema) -> pa.Table | None:
    """The events other than truncates as the follower's typed columns plus the change's position,
    operation and commit time (`_cdc_lsn`, `_cdc_seq`, `_cdc_op`, `_cdc_commit_ts`, as
    sinks/changes.py types them); None when a column or value is not typed here."""
    rows = events.filter(pc.not_equal(events["op"], "t"))
    vals = rows["vals"].combine_chunks()
    if pc.any(pc.less(pc.list_value_length(vals), len(schema.columns))).as_py():
        return None  # every event holds a value (or NULL) per column; anything else is not ours to type
    types = schema_types(schema)
    columns: dict[str, pa.Array] = {}
    for i, col in enumerate(schema.columns):
        typed = typed_text(pc.list_element(vals, i), types[col.type_oid], col)
        if typed is None:
            return None
        columns[col.name] = typed
    columns |= {
        "_cdc_lsn": rows["lsn"],
        "_cdc_seq": rows["seq"],
        "_cdc_op": rows["op"],
        "_cdc_commit_ts": rows["ts"].cast(pa.timestamp("us", tz="UTC")),
    }
    return pa.table(columns)
