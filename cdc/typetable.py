"""The type mapping of the change event envelope, kept once: what cdc/typemap.py does to each
PostgreSQL type, as a table. docs/reference/types.md is generated from it (scripts/gen_docs.py)
with every example's output computed by cdc.typemap itself, so the page cannot drift from the code.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc.pgtypes import PgType


def base(name: str, **kw) -> PgType:
    return PgType(0, name, "base", **kw)


def array(element: PgType) -> PgType:
    return PgType(0, "_" + element.name, "array", element=element)


@dataclass(frozen=True)
class Example:
    type: PgType
    text: str  # PostgreSQL's text output of the value
    typmod: int = -1  # the column's type modifier (timestamptz(p): p)
    note: str = ""  # said before the example, e.g. the column's declared type


@dataclass(frozen=True)
class Row:
    types: str
    json: str
    examples: tuple[Example, ...]


TSTZ_3 = 3  # timestamptz(3): atttypmod is the precision itself

MAPPING: tuple[Row, ...] = (
    Row("int2, int4, int8, oid, xid, xid8", "number (integer)", (Example(base("int4"), "42"),)),
    Row(
        "float4, float8",
        "number (the float the text denotes, shortest form); `NaN`, `Infinity`, `-Infinity` as strings",
        (Example(base("float8"), "1.5"), Example(base("float8"), "NaN")),
    ),
    Row(
        "numeric (any precision and scale)",
        "string, PostgreSQL's text exactly (keeps the scale); `NaN`, `Infinity`, `-Infinity` as such",
        (Example(base("numeric"), "1.50"),),
    ),
    Row("money", "string, as printed (locale dependent)", (Example(base("money"), "$1,000.50"),)),
    Row("bool", "`true` / `false`", (Example(base("bool"), "t"),)),
    Row(
        'text, varchar, bpchar (padding kept), name, citext, `"char"`, xml, inet, cidr, macaddr, macaddr8, uuid, '
        "bit, varbit, tsvector, tsquery",
        "string, as printed",
        (Example(base("bpchar"), "ab   "),),
    ),
    Row(
        "json, jsonb",
        "string holding the JSON text (not parsed; jsonb as PostgreSQL normalised it)",
        (Example(base("jsonb"), '{"a": 1}'),),
    ),
    Row("enums", "string, the label", (Example(PgType(0, "mood", "enum"), "happy"),)),
    Row("bytea", "string, base64 of the bytes", (Example(base("bytea"), "\\x0a0b"),)),
    Row(
        "date",
        "number, days since 1970-01-01 (`io.debezium.time.Date`); `infinity` → 9223372036854775807, "
        "`-infinity` → -9223372036854775808",
        (Example(base("date"), "2024-01-01"), Example(base("date"), "0044-03-15 BC")),
    ),
    Row(
        "time",
        "number, microseconds since midnight (`io.debezium.time.MicroTime`)",
        (Example(base("time"), "10:15:30.5"), Example(base("time"), "24:00:00")),
    ),
    Row(
        "timetz",
        "string, the time of day in UTC with `Z` (`io.debezium.time.ZonedTime`)",
        (Example(base("timetz"), "10:15:30.123+02"),),
    ),
    Row(
        "timestamp",
        "number, microseconds since 1970-01-01 00:00 (`io.debezium.time.MicroTimestamp`); infinities as for date",
        (Example(base("timestamp"), "2024-01-01 00:00:01.5"),),
    ),
    Row(
        "timestamptz(p)",
        "string, ISO-8601 instant in UTC with `Z` and exactly p fraction digits (p = 6 when the column declares "
        "none; none for p = 0), as Debezium 3 prints it (`io.debezium.time.ZonedTimestamp`); "
        '`"infinity"`, `"-infinity"`',
        (
            Example(base("timestamptz"), "2024-01-01 12:00:00.5+00"),
            Example(base("timestamptz"), "2024-01-01 12:00:00.5+00", TSTZ_3, "timestamptz(3)"),
        ),
    ),
    Row(
        "interval",
        "string `P{y}Y{m}M{d}DT{h}H{m}M{s}S` with every component, each with its own sign, seconds without "
        "trailing zeros",
        (Example(base("interval"), "P1DT-1.5S"), Example(base("interval"), "PT0S")),
    ),
    Row(
        "arrays of any of these",
        "(nested) JSON list, elements converted by their type's rule, NULL elements → `null`; lower bounds "
        "(`[0:1]=`) are dropped",
        (Example(array(base("int4")), "{{1,2},{3,NULL}}"),),
    ),
    Row(
        "domains",
        "as their base type",
        (
            Example(
                base("numeric", base_typmod=655366, domain_name="price"),
                "1.50",
                note="domain over numeric(10,2)",
            ),
        ),
    ),
    Row(
        "composite, range, multirange, geometric and any other type",
        "string, as printed",
        (
            Example(PgType(0, "int4range", "range"), "[1,5)"),
            Example(PgType(0, "pair", "composite"), '(1,"a b")'),
        ),
    ),
)

INTRO = """\
The log stores every column value as PostgreSQL's **text output**: from `COPY ... TO STDOUT`
in snapshots and from pgoutput's text columns in the stream. Every connection cdc opens uses
the session settings of `cdc/session.py` (`DateStyle=ISO,YMD`, `IntervalStyle=iso_8601`,
`TimeZone=UTC`, `extra_float_digits=3`, `bytea_output=hex`, `client_encoding=UTF8`), so the
same value always prints the same way.

When a reader renders the Debezium-compatible envelope, `cdc.typemap` turns each text value
into a JSON value. The representations are those of Debezium's PostgreSQL connector with
`decimal.handling.mode=string`, `time.precision.mode=adaptive_time_microseconds`,
`binary.handling.mode=base64` and `interval.handling.mode=string`. SQL NULL is JSON `null`.
Every value survives a JSON round trip unchanged: exact numbers are strings, NaN and the
infinities are strings, integers stay integers.
"""

DETAILS = """\
* **Fractions of a second**: timestamptz prints the column's precision, as Debezium 3's
  connector does (`timestamptz` → 6 digits, `timestamptz(3)` → 3, `timestamptz(0)` → none).
  timetz is printed the way Java's ISO formatter prints it: none when zero, 3 digits when the
  value is whole milliseconds, otherwise 6 digits: `.5` → `.500`, `.1234` → `.123400`.
* **Years** follow ISO-8601 with astronomical numbering: 1 BC is `0000`, 44 BC is `-0043`,
  years after 9999 carry a sign (`+10000-01-01T00:00:00Z`). The day counts of `date` and the
  microsecond counts of `timestamp` use the proleptic Gregorian calendar over PostgreSQL's
  whole range (4714-11-24 BC to 5874897-12-31 for dates, to 294276-12-31 for timestamps).
  Timestamps after about 294247-01-10 exceed a signed 64-bit count of microseconds since
  1970; they are still written exactly (JSON has no integer limit), but a consumer that reads
  them into a 64-bit integer cannot hold them.
* **Offsets**: PostgreSQL prints timestamptz in the session time zone, UTC; any other offset
  it can print (`+05:30`, `-03`, `+00:19:32`) is converted as well.
* **24:00:00** is a valid `time` (86400000000 µs); as a timetz it becomes `00:00:00Z`.
* **float4** values become the double nearest to PostgreSQL's shortest decimal text
  (`1.1` → `1.1`), not the exact binary float32 value.
* **bool, bpchar, inet** and cidr: the envelope uses the output function's text (what COPY and
  pgoutput print). An explicit SQL cast to `text` prints differently for these (`true`, the
  padding removed, `::1/128`), so never build log values with `::text` casts.
* **Precision of timestamp(p)**: Debezium's adaptive mode would use milliseconds
  (`io.debezium.time.Timestamp`) for `timestamp(0)` to `timestamp(3)` columns; our envelope
  has no per-column schema, so all timestamps are microseconds.
"""
