"""PostgreSQL text output -> JSON values of the Debezium-compatible change event envelope.

The log stores every value as PostgreSQL's *text output* (COPY in snapshots, pgoutput text
columns in the stream), printed under the canonical session settings of `cdc.session`
(DateStyle=ISO,YMD, IntervalStyle=iso_8601, TimeZone=UTC, extra_float_digits=3,
bytea_output=hex). When an envelope is rendered, each value is turned into a JSON value
here. The representations are those of Debezium's PostgreSQL connector configured with
`decimal.handling.mode=string`, `time.precision.mode=adaptive_time_microseconds`,
`binary.handling.mode=base64` and `interval.handling.mode=string`, so Debezium consumers
can read the envelope. Every value survives a JSON round trip unchanged (no float is used
for anything that is not a float in PostgreSQL; NaN and infinities become strings).

Use `resolve_types` once per relation to describe its columns' types (domains resolved to
their base type), then `converter(t, typmod)` once per column, and call the converter on
each non-NULL value (NULL is JSON null and is not passed to a converter).

The mapping, type by type, is the table in cdc/typetable.py; docs/reference/types.md is
generated from it with every example computed here (scripts/gen_docs.py).

Here: the scalar converters and choosing one per type. Beside it: the types (cdc/pgtypes.py:
PgType, resolve_types), dates, times and intervals (cdc/pgdatetime.py) and arrays
(cdc/pgarrays.py).
"""

from __future__ import annotations

import binascii
import re

from cdc.pgarrays import array_converter
from cdc.pgdatetime import (
    convert_date,
    convert_interval,
    convert_time,
    convert_timestamp,
    convert_timestamptz,
    convert_timetz,
    timestamptz_converter,
)
from cdc.pgtypes import Converter, JsonValue, PgType

# ---------------------------------------------------------------------------------------------
# Scalar converters
# ---------------------------------------------------------------------------------------------
_FLOAT_SPECIALS = {"nan": "NaN", "infinity": "Infinity", "-infinity": "-Infinity", "inf": "Infinity"}
_FLOAT_SPECIALS.update({"+infinity": "Infinity", "+inf": "Infinity", "-inf": "-Infinity"})


def _float(text: str) -> float | str:
    # PostgreSQL prints 'NaN', 'Infinity', '-Infinity'; numbers never end in a letter.
    if text[-1:] in "yYnNfF":  # ('' too: float('') raises ValueError below)
        special = _FLOAT_SPECIALS.get(text.lower())
        if special is not None:
            return special
    return float(text)


def _bool(text: str) -> bool:
    if text == "t":
        return True
    if text == "f":
        return False
    lowered = text.strip().lower()
    if lowered in ("true", "t", "yes", "y", "on", "1"):
        return True
    if lowered in ("false", "f", "no", "n", "off", "0"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


_OCTAL_ESCAPE = re.compile(r"\\(\\|[0-3][0-7]{2})")


def _bytea(text: str) -> str:
    if text.startswith("\\x"):
        raw = bytes.fromhex(text[2:])
    else:  # bytea_output=escape: backslash-doubled and \ooo octal escapes
        raw = _OCTAL_ESCAPE.sub(
            lambda m: "\\" if m[1] == "\\" else chr(int(m[1], 8)),
            text,
        ).encode("latin-1")
    return binascii.b2a_base64(raw, newline=False).decode("ascii")


# 'YYYY-MM-DD' -> days since the epoch, for the 4-digit years AD PostgreSQL prints without


# ---------------------------------------------------------------------------------------------
# Building converters
# ---------------------------------------------------------------------------------------------
_BASE_CONVERTERS: dict[str, Converter] = {
    "int2": int,
    "int4": int,
    "int8": int,
    "oid": int,
    "xid": int,
    "xid8": int,
    "float4": _float,
    "float8": _float,
    "numeric": str,
    "money": str,
    "bool": _bool,
    "bytea": _bytea,
    "date": convert_date,
    "time": convert_time,
    "timetz": convert_timetz,
    "timestamp": convert_timestamp,
    "timestamptz": convert_timestamptz,
    "interval": convert_interval,
}


def converter(t: PgType, typmod: int = -1) -> Converter:
    """The function turning one non-NULL text value of type `t` into its envelope JSON value.

    Build it once per column. `typmod` is the column's type modifier (pg_attribute.atttypmod;
    for a domain the domain's own modifier is used when the column has none); no mapping
    depends on it today; it is accepted so callers need not change when one does.
    """
    if t.kind == "array":
        element = t.element
        if element is None:
            return str
        element_typmod = typmod if typmod != -1 else element.base_typmod
        return array_converter(converter(element, element_typmod), t.delimiter)
    if t.kind == "base":
        if t.name == "timestamptz":
            own = typmod if typmod != -1 else t.base_typmod
            return timestamptz_converter(own if 0 <= own <= 6 else 6)
        return _BASE_CONVERTERS.get(t.name, str)
    return str  # enum, composite, range, multirange, pseudo, other: the text as is


# Kinds of cdc._render.Plan: the converters whose canonical inputs the C speedup converts itself.
C_GENERIC, C_INT, C_STRING, C_BOOL, C_TIMESTAMPTZ, C_DATE = range(6)


def c_kind(conv: Converter) -> tuple[int, int]:
    """(kind, timestamptz precision) of a converter for cdc._render (C_GENERIC: it calls `conv`)."""
    if conv is int:
        return C_INT, 0
    if conv is str:
        return C_STRING, 0
    if conv is _bool:
        return C_BOOL, 0
    if conv is convert_date:
        return C_DATE, 0
    precision = getattr(conv, "precision", None)
    if precision is not None:
        return C_TIMESTAMPTZ, precision
    return C_GENERIC, 0


def to_json_value(t: PgType, text: str | None, typmod: int = -1) -> JsonValue:
    """Convert one value (None for SQL NULL). For many values build a `converter` instead."""
    if text is None:
        return None
    return converter(t, typmod)(text)
