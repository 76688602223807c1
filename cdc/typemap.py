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

timestamptz fractions have the column's precision, as Debezium 3 prints them. timetz fractions follow Java's ISO formatting:
no fraction when it is zero, else 3 digits when the value fits in milliseconds, else 6.
Years after 9999 print as `+10000-01-01T...`, years BC astronomically (1 BC = `0000`,
44 BC = `-0043`). Date and time arithmetic is done here on integers (proleptic Gregorian
calendar), so PostgreSQL's whole range is supported, from 4714-11-24 BC to 5874897 AD.
Timestamps after about 294247 AD exceed a signed 64-bit microsecond count since 1970; they
are still written exactly.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

JsonValue = None | bool | int | float | str | list
Converter = Callable[[str], JsonValue]

INT64_MAX = 9223372036854775807
INT64_MIN = -9223372036854775808

_US_PER_SECOND = 1_000_000
_US_PER_DAY = 86_400_000_000


# ---------------------------------------------------------------------------------------------
# Type descriptors
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# Calendar arithmetic (proleptic Gregorian, astronomical years: 1 BC = 0, 44 BC = -43)
# ---------------------------------------------------------------------------------------------
def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (any year, astronomical numbering)."""
    if month <= 2:
        year -= 1
        shifted_month = month + 9  # March-based months: Mar=0 ... Feb=11
    else:
        shifted_month = month - 3
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * shifted_month + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """The inverse of `days_from_civil`: (year, month, day) of a day count since 1970-01-01."""
    days += 719468
    era = days // 146097
    day_of_era = days - era * 146097
    year_of_era = (day_of_era - day_of_era // 1460 + day_of_era // 36524 - day_of_era // 146096) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + 3 if shifted_month < 10 else shifted_month - 9
    year = year_of_era + era * 400 + (1 if month <= 2 else 0)
    return year, month, day


def _parse_date_part(text: str, bc: bool) -> int:
    """'2024-01-31' (year of 4+ digits) -> days since the epoch; `bc` flips the year."""
    year_s, month_s, day_s = text.rsplit("-", 2)
    year = int(year_s)
    if bc:
        year = 1 - year
    return days_from_civil(year, int(month_s), int(day_s))


def _parse_time_part(text: str) -> int:
    """'HH:MM:SS[.ffffff]' -> microseconds since midnight."""
    hours = int(text[0:2])
    minutes = int(text[3:5])
    seconds = int(text[6:8])
    micros = (hours * 3600 + minutes * 60 + seconds) * _US_PER_SECOND
    if len(text) > 8:
        if text[8] != ".":
            raise ValueError(f"not a time of day: {text!r}")
        frac = text[9:]
        if not frac.isdigit() or len(frac) > 6:
            raise ValueError(f"not a time of day: {text!r}")
        micros += int(frac.ljust(6, "0"))
    return micros


def _parse_offset(text: str) -> int:
    """'+05:30', '-03', '+05:53:28' -> seconds east of UTC."""
    sign = -1 if text[0] == "-" else 1
    parts = text[1:].split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a UTC offset: {text!r}")
    seconds = int(parts[0]) * 3600
    if len(parts) > 1:
        seconds += int(parts[1]) * 60
    if len(parts) > 2:
        seconds += int(parts[2])
    return sign * seconds


def _split_offset(text: str) -> tuple[str, int]:
    """'10:15:30.5+02' -> ('10:15:30.5', 7200). The offset starts after HH:MM:SS."""
    for i in range(8, len(text)):
        if text[i] in "+-":
            return text[:i], _parse_offset(text[i:])
    raise ValueError(f"no UTC offset in {text!r}")


def _fraction(micros: int) -> str:
    """Java ISO style: '' when zero, '.mmm' when whole milliseconds, else '.uuuuuu'."""
    if micros == 0:
        return ""
    if micros % 1000 == 0:
        return f".{micros // 1000:03d}"
    return f".{micros:06d}"


def _format_year(year: int) -> str:
    if 0 <= year <= 9999:
        return f"{year:04d}"
    if year > 9999:
        return f"+{year}"
    return f"-{-year:04d}"


def _format_time_of_day(micros: int) -> str:
    seconds, frac = divmod(micros, _US_PER_SECOND)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}{_fraction(frac)}"


def _format_instant(epoch_micros: int) -> str:
    days, of_day = divmod(epoch_micros, _US_PER_DAY)
    year, month, day = civil_from_days(days)
    return f"{_format_year(year)}-{month:02d}-{day:02d}T{_format_time_of_day(of_day)}Z"


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
# decoration. Real data repeats dates a lot; the cache is simply emptied when it gets big.
_DAYS_CACHE: dict[str, int] = {}
_DAYS_CACHE_MAX = 8192


def _days_of_iso_date(text: str) -> int:
    days = _DAYS_CACHE.get(text)
    if days is None:
        if text[7] != "-" or not (text[0:4] + text[5:7] + text[8:10]).isdigit():
            raise ValueError(f"not a date: {text!r}")
        days = days_from_civil(int(text[0:4]), int(text[5:7]), int(text[8:10]))
        if len(_DAYS_CACHE) >= _DAYS_CACHE_MAX:
            _DAYS_CACHE.clear()
        _DAYS_CACHE[text] = days
    return days


def _date(text: str) -> int:
    if len(text) == 10 and text[4] == "-":  # the common case: a 4-digit year AD
        return _days_of_iso_date(text)
    if text == "infinity":
        return INT64_MAX
    if text == "-infinity":
        return INT64_MIN
    bc = text.endswith(" BC")
    return _parse_date_part(text[:-3] if bc else text, bc)


def _time(text: str) -> int:
    return _parse_time_part(text)


def _timetz(text: str) -> str:
    time_text, offset = _split_offset(text)
    utc = (_parse_time_part(time_text) - offset * _US_PER_SECOND) % _US_PER_DAY
    return _format_time_of_day(utc) + "Z"


def _timestamp_micros(text: str, bc: bool) -> int:
    date_text, _, time_text = text.partition(" ")
    if not time_text:
        raise ValueError(f"not a timestamp: {text!r}")
    return _parse_date_part(date_text, bc) * _US_PER_DAY + _parse_time_part(time_text)


def _timestamp(text: str) -> int:
    n = len(text)
    # Fast path: 'YYYY-MM-DD HH:MM:SS[.ffffff]' (4-digit year AD).
    if 19 <= n <= 26 and text[4] == "-" and text[10] == " " and text[16] == ":" and text[n - 1] != "C":
        micros = (
            _days_of_iso_date(text[0:10]) * 86400
            + int(text[11:13]) * 3600
            + int(text[14:16]) * 60
            + int(text[17:19])
        ) * 1_000_000
        if n == 19:
            return micros
        if text[19] == "." and text[20:].isdigit():
            return micros + int(text[20:].ljust(6, "0"))
    if text[-1:] == "y":
        if text == "infinity":
            return INT64_MAX
        if text == "-infinity":
            return INT64_MIN
    bc = text.endswith(" BC")
    return _timestamp_micros(text[:-3] if bc else text, bc)


def _timestamptz_converter(precision: int) -> Converter:
    """timestamptz -> ISO-8601 UTC instant with exactly `precision` fraction digits (none for 0):
    Debezium's ZonedTimestamp prints the column's precision (6 when it has none declared)."""

    def fraction(micros: int) -> str:
        if precision == 0:
            return ""
        return "." + f"{micros:06d}"[:precision]

    def convert(text: str) -> str:
        n = len(text)
        # Fast path (in C too: cdc/_render.c): what TimeZone=UTC prints for years 1000..9999: 'YYYY-MM-DD HH:MM:SS[.ffffff]+00'.
        if (
            n >= 22
            and text[n - 3 :] == "+00"
            and text[4] == "-"
            and text[10] == " "
            and (n == 22 or text[19] == ".")
        ):
            micros = int(text[20 : n - 3].ljust(6, "0")) if n > 22 else 0
            return f"{text[0:10]}T{text[11:19]}{fraction(micros)}Z"
        if text == "infinity" or text == "-infinity":
            return text
        bc = text.endswith(" BC")
        if bc:
            text = text[:-3]
        date_text, _, time_text = text.partition(" ")
        time_text, offset = _split_offset(time_text)
        epoch = (
            _parse_date_part(date_text, bc) * _US_PER_DAY
            + _parse_time_part(time_text)
            - offset * _US_PER_SECOND
        )
        days, of_day = divmod(epoch, _US_PER_DAY)
        year, month, day = civil_from_days(days)
        seconds, micros = divmod(of_day, _US_PER_SECOND)
        hh, rest = divmod(seconds, 3600)
        return f"{_format_year(year)}-{month:02d}-{day:02d}T{hh:02d}:{rest // 60:02d}:{rest % 60:02d}{fraction(micros)}Z"

    convert.precision = precision  # type: ignore[attr-defined]  # read by c_kind
    return convert


_timestamptz = _timestamptz_converter(6)


_INTERVAL_RE = re.compile(
    r"(?P<neg>-)?P"
    r"(?:(?P<years>[-+]?\d+)Y)?(?:(?P<months>[-+]?\d+)M)?(?:(?P<weeks>[-+]?\d+)W)?(?:(?P<days>[-+]?\d+)D)?"
    r"(?:T(?:(?P<hours>[-+]?\d+)H)?(?:(?P<minutes>[-+]?\d+)M)?(?:(?P<seconds>[-+]?(?:\d+(?:\.\d*)?|\.\d+))S)?)?"
)


def _seconds_text(text: str | None, negate: bool) -> str:
    """'-01.50' -> '-1.5', '6.0' -> '6', '-0' -> '0' (no trailing zeros, no -0)."""
    if not text:
        return "0"
    negative = text[0] == "-"
    digits = text.lstrip("+-")
    whole, _, frac = digits.partition(".")
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    body = f"{whole}.{frac}" if frac else whole
    if body == "0":
        return "0"
    return f"-{body}" if negative != negate else body


def _interval(text: str) -> str:
    m = _INTERVAL_RE.fullmatch(text)
    if m is None or text.endswith(("P", "T")):
        raise ValueError(f"not an ISO-8601 interval (IntervalStyle=iso_8601): {text!r}")
    negate = m["neg"] is not None
    sign = -1 if negate else 1

    def part(name: str) -> int:
        value = m[name]
        return sign * int(value) if value else 0

    days = part("days") + 7 * part("weeks")
    return (
        f"P{part('years')}Y{part('months')}M{days}DT{part('hours')}H{part('minutes')}M"
        f"{_seconds_text(m['seconds'], negate)}S"
    )


# ---------------------------------------------------------------------------------------------
# Arrays
# ---------------------------------------------------------------------------------------------
def _array_converter(element_conv: Converter, delimiter: str) -> Callable[[str], list]:
    def convert(text: str) -> list:
        if text[:1] == "[":  # dimension decoration '[0:1]={1,2}': bounds are dropped
            text = text[text.index("=") + 1 :]
        if text == "{}":
            return []
        # Fast path: one dimension, no quoting, escaping or spacing.
        if text[:1] == "{" and text[-1] == "}":
            inner = text[1:-1]
            if (
                "{" not in inner
                and "}" not in inner
                and '"' not in inner
                and "\\" not in inner
                and " " not in inner
            ):
                return [None if item == "NULL" else element_conv(item) for item in inner.split(delimiter)]
        return parse_array(text, delimiter, element_conv)

    return convert


def parse_array(text: str, delimiter: str, element_conv: Converter) -> list:
    """The general array literal parser (quotes, backslash escapes, nesting, whitespace)."""
    n = len(text)
    i = 0
    while i < n and text[i].isspace():
        i += 1
    if i >= n or text[i] != "{":
        raise ValueError(f"not an array literal: {text!r}")
    root: list = []
    stack: list[list] = []
    while i < n:
        c = text[i]
        if c == "{":
            new: list = []
            if stack:
                stack[-1].append(new)
            else:
                root = new
            stack.append(new)
            i += 1
        elif c == "}":
            if not stack:
                raise ValueError(f"unbalanced braces in array literal: {text!r}")
            stack.pop()
            i += 1
            if not stack:
                if text[i:].strip():
                    raise ValueError(f"junk after array literal: {text!r}")
                return root
        elif c == delimiter or c.isspace():
            i += 1
        elif not stack:
            raise ValueError(f"not an array literal: {text!r}")
        elif c == '"':
            i += 1
            chunks: list[str] = []
            while True:
                quote = text.find('"', i)
                backslash = text.find("\\", i, quote if quote >= 0 else n)
                if quote < 0:
                    raise ValueError(f"unterminated quoted element in array literal: {text!r}")
                if backslash < 0:
                    chunks.append(text[i:quote])
                    i = quote + 1
                    break
                chunks.append(text[i:backslash])
                if backslash + 1 >= n:
                    raise ValueError(f"dangling backslash in array literal: {text!r}")
                chunks.append(text[backslash + 1])
                i = backslash + 2
            stack[-1].append(element_conv("".join(chunks)))
        else:
            chunks = []
            protected = 0  # chunks up to here came from escapes (or precede one): never stripped
            while i < n:
                c = text[i]
                if c == delimiter or c == "}":
                    break
                if c == "\\":
                    if i + 1 >= n:
                        raise ValueError(f"dangling backslash in array literal: {text!r}")
                    chunks.append(text[i + 1])
                    protected = len(chunks)
                    i += 2
                elif c in '{"':
                    raise ValueError(f"unexpected {c!r} in array literal: {text!r}")
                else:
                    chunks.append(c)
                    i += 1
            # Trailing unescaped whitespace of an unquoted element is not part of it.
            item = "".join(chunks[:protected]) + "".join(chunks[protected:]).rstrip()
            if not protected and item.upper() == "NULL":
                stack[-1].append(None)
            else:
                stack[-1].append(element_conv(item))
    raise ValueError(f"unbalanced braces in array literal: {text!r}")


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
    "date": _date,
    "time": _time,
    "timetz": _timetz,
    "timestamp": _timestamp,
    "timestamptz": _timestamptz,
    "interval": _interval,
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
        return _array_converter(converter(element, element_typmod), t.delimiter)
    if t.kind == "base":
        if t.name == "timestamptz":
            own = typmod if typmod != -1 else t.base_typmod
            return _timestamptz_converter(own if 0 <= own <= 6 else 6)
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
    if conv is _date:
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
