"""PostgreSQL text output -> envelope JSON values (cdc.typemap), without a server."""

from __future__ import annotations

import base64
import datetime as dt
import math
import random

import orjson
import pytest

from cdc.pgdatetime import INT64_MAX, INT64_MIN, civil_from_days, days_from_civil
from cdc.pgtypes import PgType, numeric_precision_scale
from cdc.typemap import converter, to_json_value

pytestmark = pytest.mark.unit

EPOCH = dt.datetime(1970, 1, 1)
EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()


def base(name: str) -> PgType:
    return PgType(0, name, "base")


def array_of(element: PgType, delimiter: str = ",") -> PgType:
    return PgType(0, "_" + element.name, "array", element=element, delimiter=delimiter)


def micros_since_epoch(value: dt.datetime) -> int:
    delta = value - EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


# (type name, PostgreSQL text, expected JSON value)
SCALAR_CASES = [
    # integers
    ("int2", "0", 0),
    ("int2", "-32768", -32768),
    ("int2", "32767", 32767),
    ("int4", "-2147483648", -2147483648),
    ("int4", "2147483647", 2147483647),
    ("int8", "9223372036854775807", INT64_MAX),
    ("int8", "-9223372036854775808", INT64_MIN),
    ("oid", "4294967295", 4294967295),
    ("xid", "742", 742),
    ("xid8", "18446744073709551615", 18446744073709551615),
    # floats
    ("float8", "1.5", 1.5),
    ("float8", "0.1", 0.1),
    ("float8", "-0", -0.0),
    ("float8", "1.7976931348623157e+308", 1.7976931348623157e308),
    ("float8", "5e-324", 5e-324),
    ("float8", "-2.2250738585072014e-308", -2.2250738585072014e-308),
    ("float8", "NaN", "NaN"),
    ("float8", "Infinity", "Infinity"),
    ("float8", "-Infinity", "-Infinity"),
    ("float4", "1.1", 1.1),
    ("float4", "3.4028235e+38", 3.4028235e38),
    ("float4", "NaN", "NaN"),
    ("float4", "-Infinity", "-Infinity"),
    # numeric and money: the text exactly
    ("numeric", "1.50", "1.50"),
    ("numeric", "0", "0"),
    ("numeric", "-0.000000000000000000001", "-0.000000000000000000001"),
    ("numeric", "123456789012345678901234567890.123456789", "123456789012345678901234567890.123456789"),
    ("numeric", "NaN", "NaN"),
    ("numeric", "Infinity", "Infinity"),
    ("numeric", "-Infinity", "-Infinity"),
    ("money", "$1,000.50", "$1,000.50"),
    ("money", "-$0.01", "-$0.01"),
    # bool
    ("bool", "t", True),
    ("bool", "f", False),
    ("bool", "true", True),
    ("bool", "false", False),
    # text-like: as printed
    ("text", "", ""),
    ("text", "héllo wörld ✓ 😀", "héllo wörld ✓ 😀"),
    ("text", 'quote " back \\ tab \t nl \n', 'quote " back \\ tab \t nl \n'),
    ("varchar", "abc", "abc"),
    ("bpchar", "ab   ", "ab   "),
    ("name", "pg_class", "pg_class"),
    ("citext", "MiXeD", "MiXeD"),
    ("char", "x", "x"),
    ("xml", "<a>1</a>", "<a>1</a>"),
    ("inet", "192.168.0.1/24", "192.168.0.1/24"),
    ("cidr", "10.0.0.0/8", "10.0.0.0/8"),
    ("macaddr", "08:00:2b:01:02:03", "08:00:2b:01:02:03"),
    ("uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("json", '{"b": 1,  "a": [1.10]}', '{"b": 1,  "a": [1.10]}'),
    ("jsonb", '{"a": 1.10, "b": null}', '{"a": 1.10, "b": null}'),
    ("bit", "101", "101"),
    ("varbit", "", ""),
    ("tsvector", "'a':1 'b':2", "'a':1 'b':2"),
    # bytea: base64
    ("bytea", "\\x", ""),
    ("bytea", "\\x0a0b", "Cgs="),
    ("bytea", "\\x00ff10", base64.b64encode(b"\x00\xff\x10").decode()),
    ("bytea", "\\xDEADBEEF", base64.b64encode(b"\xde\xad\xbe\xef").decode()),
    ("bytea", "a\\\\b\\000\\377", base64.b64encode(b"a\\b\x00\xff").decode()),  # bytea_output=escape
    # date: days since 1970-01-01
    ("date", "1970-01-01", 0),
    ("date", "1969-12-31", -1),
    ("date", "2024-01-01", 19723),
    ("date", "2000-02-29", 11016),
    ("date", "0001-01-01", -719162),
    ("date", "0001-12-31 BC", -719163),  # year 0 (astronomical)
    ("date", "0001-01-01 BC", -719528),
    ("date", "0044-03-15 BC", -735160),
    ("date", "4713-01-01 BC", -2440550),
    ("date", "4714-11-24 BC", -2440588),  # PostgreSQL's lowest date (julian day 0)
    ("date", "9999-12-31", 2932896),
    ("date", "10000-01-01", 2932897),
    ("date", "5874897-12-31", 2145042905),  # PostgreSQL's highest date
    ("date", "infinity", INT64_MAX),
    ("date", "-infinity", INT64_MIN),
    # time: microseconds since midnight
    ("time", "00:00:00", 0),
    ("time", "10:15:30", 36930000000),
    ("time", "10:15:30.5", 36930500000),
    ("time", "23:59:59.999999", 86399999999),
    ("time", "00:00:00.000001", 1),
    ("time", "24:00:00", 86400000000),
    # timetz: UTC with Z, fraction 0/3/6 digits
    ("timetz", "10:15:30.123+02", "08:15:30.123Z"),
    ("timetz", "10:15:30+00", "10:15:30Z"),
    ("timetz", "01:00:00+05:30", "19:30:00Z"),
    ("timetz", "23:00:00.5-03", "02:00:00.500Z"),
    ("timetz", "12:00:00.000001+00", "12:00:00.000001Z"),
    ("timetz", "12:00:00.12345-00:00:28", "12:00:28.123450Z"),
    ("timetz", "24:00:00+00", "00:00:00Z"),
    ("timetz", "00:00:00+15:59", "08:01:00Z"),
    # timestamp: microseconds since the epoch
    ("timestamp", "1970-01-01 00:00:00", 0),
    ("timestamp", "2024-01-01 00:00:01.5", 1704067201500000),
    ("timestamp", "1969-12-31 23:59:59.999999", -1),
    ("timestamp", "2000-01-01 00:00:00.000001", 946684800000001),
    ("timestamp", "0001-01-01 00:00:00", -62135596800000000),
    ("timestamp", "0044-03-15 12:00:00 BC", (-735160 * 86400 + 12 * 3600) * 1_000_000),
    ("timestamp", "0044-03-15 12:00:00.25 BC", (-735160 * 86400 + 12 * 3600) * 1_000_000 + 250000),
    ("timestamp", "0001-01-01 00:00:00.123456 BC", days_from_civil(0, 1, 1) * 86_400_000_000 + 123456),
    ("timestamp", "4713-01-01 00:00:00 BC", -210863520000000000),  # PostgreSQL: extract(epoch ...) * 1e6
    ("timestamp", "12345-06-07 08:09:10.11", None),  # filled in below from the calendar
    ("timestamp", "infinity", INT64_MAX),
    ("timestamp", "-infinity", INT64_MIN),
    # timestamptz: ISO-8601 UTC with Z
    ("timestamptz", "2024-01-01 12:00:00+00", "2024-01-01T12:00:00.000000Z"),
    ("timestamptz", "2024-01-01 12:00:00.5+00", "2024-01-01T12:00:00.500000Z"),
    ("timestamptz", "2024-01-01 12:00:00.123+00", "2024-01-01T12:00:00.123000Z"),
    ("timestamptz", "2024-01-01 12:00:00.1234+00", "2024-01-01T12:00:00.123400Z"),
    ("timestamptz", "2024-01-01 12:00:00.000001+00", "2024-01-01T12:00:00.000001Z"),
    ("timestamptz", "2024-01-01 12:00:00.100000+00", "2024-01-01T12:00:00.100000Z"),
    ("timestamptz", "2024-01-01 01:00:00+05:30", "2023-12-31T19:30:00.000000Z"),
    ("timestamptz", "2023-12-31 22:00:00-03", "2024-01-01T01:00:00.000000Z"),
    ("timestamptz", "1800-01-01 00:00:00+00:19:32", "1799-12-31T23:40:28.000000Z"),
    ("timestamptz", "2024-02-29 00:00:00.25+01", "2024-02-28T23:00:00.250000Z"),
    ("timestamptz", "0999-12-31 23:59:59+00", "0999-12-31T23:59:59.000000Z"),
    ("timestamptz", "0001-01-01 00:00:00+00", "0001-01-01T00:00:00.000000Z"),
    ("timestamptz", "0001-01-01 00:00:00+00 BC", "0000-01-01T00:00:00.000000Z"),
    ("timestamptz", "0044-03-15 10:00:00.5+00 BC", "-0043-03-15T10:00:00.500000Z"),
    ("timestamptz", "4713-01-01 00:00:00+00 BC", "-4712-01-01T00:00:00.000000Z"),
    ("timestamptz", "10000-01-01 00:00:00+00", "+10000-01-01T00:00:00.000000Z"),
    ("timestamptz", "294276-12-31 23:59:59.999999+00", "+294276-12-31T23:59:59.999999Z"),
    ("timestamptz", "infinity", "infinity"),
    ("timestamptz", "-infinity", "-infinity"),
    # interval: Debezium's string with every component
    ("interval", "PT0S", "P0Y0M0DT0H0M0S"),
    ("interval", "P1Y2M3DT4H5M6.78S", "P1Y2M3DT4H5M6.78S"),
    ("interval", "P1Y", "P1Y0M0DT0H0M0S"),
    ("interval", "P-1Y-2M", "P-1Y-2M0DT0H0M0S"),
    ("interval", "P-1DT-1.5S", "P0Y0M-1DT0H0M-1.5S"),
    ("interval", "PT-1.5S", "P0Y0M0DT0H0M-1.5S"),
    ("interval", "PT-0.5S", "P0Y0M0DT0H0M-0.5S"),
    ("interval", "PT0.000001S", "P0Y0M0DT0H0M0.000001S"),
    ("interval", "PT6.500S", "P0Y0M0DT0H0M6.5S"),
    ("interval", "PT6.0S", "P0Y0M0DT0H0M6S"),
    ("interval", "P10M3DT-4H-5M-6.5S", "P0Y10M3DT-4H-5M-6.5S"),
    ("interval", "PT2562047788H54.775807S", "P0Y0M0DT2562047788H0M54.775807S"),
    (
        "interval",
        "P-178956970Y-8M-2147483648DT-2562047788H-54.775808S",
        "P-178956970Y-8M-2147483648DT-2562047788H0M-54.775808S",
    ),
    ("interval", "-P1D", "P0Y0M-1DT0H0M0S"),
    ("interval", "-P1Y-2MT3H-1.5S", "P-1Y2M0DT-3H0M1.5S"),
    ("interval", "P2W1D", "P0Y0M15DT0H0M0S"),
]

# Compute the far-future timestamp case from the calendar code (cross-checked below against datetime).
SCALAR_CASES = [
    (
        name,
        text,
        (days_from_civil(12345, 6, 7) * 86400 + 8 * 3600 + 9 * 60 + 10) * 1_000_000 + 110000
        if expected is None
        else expected,
    )
    for name, text, expected in SCALAR_CASES
]


@pytest.mark.parametrize(("name", "text", "expected"), SCALAR_CASES, ids=lambda v: repr(v)[:40])
def test_scalar_conversion(name: str, text: str, expected: object) -> None:
    value = converter(base(name))(text)
    assert value == expected
    assert type(value) is type(expected)
    if isinstance(value, float):
        assert math.copysign(1, value) == math.copysign(1, expected)  # -0.0 stays -0.0
    assert to_json_value(base(name), text) == expected
    # JSON round trip is exact
    assert orjson.loads(orjson.dumps(value)) == value


def test_null_is_none() -> None:
    for name in ("int4", "text", "numeric", "timestamptz", "date", "interval", "bytea"):
        assert to_json_value(base(name), None) is None
    assert to_json_value(array_of(base("int4")), None) is None


@pytest.mark.parametrize("kind", ["enum", "composite", "range", "multirange", "pseudo", "other"])
def test_other_kinds_keep_text(kind: str) -> None:
    # even when the name collides with a base type's, only kind 'base' converts
    for text in ("happy", '(1,"a b")', "[1,5)", "{[1,3),[5,7)}", ""):
        assert to_json_value(PgType(99999, "int4", kind), text) == text


def test_unknown_base_types_keep_text() -> None:
    for name, text in [
        ("point", "(1,2)"),
        ("box", "(1,1),(0,0)"),
        ("regclass", "pg_class"),
        ("int4range", "[1,5)"),
    ]:
        assert to_json_value(base(name), text) == text


def test_domain_converts_as_base_type() -> None:
    money_domain = PgType(1, "numeric", "base", base_typmod=(10 << 16 | 2) + 4, domain_name="price")
    assert to_json_value(money_domain, "1.50") == "1.50"
    ts_domain = PgType(2, "timestamptz", "base", domain_name="created_at")
    assert to_json_value(ts_domain, "2024-01-01 00:00:00+00") == "2024-01-01T00:00:00.000000Z"


# ---------------------------------------------------------------------------------------------
# calendar arithmetic
# ---------------------------------------------------------------------------------------------
def test_days_from_civil_matches_datetime() -> None:
    rng = random.Random(42)
    for _ in range(20000):
        d = dt.date.fromordinal(rng.randint(1, dt.date.max.toordinal()))
        assert days_from_civil(d.year, d.month, d.day) == d.toordinal() - EPOCH_ORDINAL
        assert civil_from_days(d.toordinal() - EPOCH_ORDINAL) == (d.year, d.month, d.day)


def test_civil_round_trip_over_postgres_range() -> None:
    low = days_from_civil(-4712, 1, 1)
    high = days_from_civil(5874897, 12, 31)
    rng = random.Random(7)
    samples = [low, high, -1, 0, 1, days_from_civil(0, 2, 29), days_from_civil(-100, 3, 1)]
    samples += [rng.randint(low, high) for _ in range(20000)]
    for days in samples:
        year, month, day = civil_from_days(days)
        assert 1 <= month <= 12 and 1 <= day <= 31
        assert days_from_civil(year, month, day) == days
    # consecutive days are consecutive calendar dates around year 0 and leap years
    for days in range(days_from_civil(-1, 12, 1), days_from_civil(1, 3, 31)):
        y, m, d = civil_from_days(days)
        y2, m2, d2 = civil_from_days(days + 1)
        assert (y2, m2, d2) > (y, m, d)
    assert civil_from_days(days_from_civil(0, 2, 29)) == (0, 2, 29)  # year 0 (1 BC) is a leap year
    assert civil_from_days(days_from_civil(-100, 3, 1) - 1) == (-100, 2, 28)  # 101 BC is not


def test_date_and_timestamp_agree_with_datetime() -> None:
    rng = random.Random(3)
    date_conv = converter(base("date"))
    ts_conv = converter(base("timestamp"))
    tstz_conv = converter(base("timestamptz"))
    for _ in range(5000):
        value = dt.datetime(1, 1, 1) + dt.timedelta(
            days=rng.randint(0, 3652058), microseconds=rng.randint(0, 86_400_000_000 - 1)
        )
        text = value.isoformat(sep=" ")
        assert date_conv(text[:10]) == (value.date() - EPOCH.date()).days
        assert ts_conv(text) == micros_since_epoch(value)
        expected = value.strftime("%Y-%m-%dT%H:%M:%S").rjust(19, "0") + f".{value.microsecond:06d}"
        assert tstz_conv(text + "+00") == expected + "Z"


def test_timestamptz_offsets_agree_with_datetime() -> None:
    rng = random.Random(5)
    conv = converter(base("timestamptz"))
    for _ in range(3000):
        local = dt.datetime(1900, 1, 1) + dt.timedelta(seconds=rng.randint(0, 200 * 365 * 86400))
        offset = rng.randint(-15 * 3600, 15 * 3600)
        sign = "-" if offset < 0 else "+"
        h, rest = divmod(abs(offset), 3600)
        m, s = divmod(rest, 60)
        suffix = f"{sign}{h:02d}" + (f":{m:02d}" if m or s else "") + (f":{s:02d}" if s else "")
        utc = local - dt.timedelta(seconds=offset)
        assert conv(f"{local.isoformat(sep=' ')}{suffix}") == utc.strftime("%Y-%m-%dT%H:%M:%S.000000Z").rjust(
            27, "0"
        )


@pytest.mark.parametrize(
    ("typmod", "expected"),
    [
        (-1, None),
        ((10 << 16 | 2) + 4, (10, 2)),
        ((1000 << 16) + 4, (1000, 0)),
        ((5 << 16 | 0x7FE) + 4, (5, -2)),
        ((3 << 16 | 5) + 4, (3, 5)),
    ],
)
def test_numeric_precision_scale(typmod: int, expected: tuple[int, int] | None) -> None:
    assert numeric_precision_scale(typmod) == expected


# ---------------------------------------------------------------------------------------------
# arrays
# ---------------------------------------------------------------------------------------------
ARRAY_CASES = [
    ("int4", "{}", []),
    ("int4", "{1,2,3}", [1, 2, 3]),
    ("int4", "{1,NULL,3}", [1, None, 3]),
    ("int4", "{NULL}", [None]),
    ("int4", "{{1,2},{3,4}}", [[1, 2], [3, 4]]),
    ("int4", "{{{1},{2}},{{3},{NULL}}}", [[[1], [2]], [[3], [None]]]),
    ("int4", "[0:1]={1,2}", [1, 2]),
    ("int4", "[1:2][-1:0]={{1,2},{3,4}}", [[1, 2], [3, 4]]),
    ("int4", "{ 1 , 2 }", [1, 2]),
    ("int8", "{9223372036854775807,-9223372036854775808}", [INT64_MAX, INT64_MIN]),
    ("text", '{a,"b c",""}', ["a", "b c", ""]),
    ("text", '{"NULL",NULL,null,"null"}', ["NULL", None, None, "null"]),
    ("text", '{"a,b","{x}","\\"q\\"","back\\\\slash"," sp "}', ["a,b", "{x}", '"q"', "back\\slash", " sp "]),
    ("text", '{"tab\tnl\nend"}', ["tab\tnl\nend"]),
    ("text", "{héllo,😀,ünï}", ["héllo", "😀", "ünï"]),
    ("text", '{{"a}","b{"},{"\\\\","\\""}}', [["a}", "b{"], ["\\", '"']]),
    ("text", "{a\\,b,c\\ }", ["a,b", "c "]),
    ("text", '{"}"}', ["}"]),
    ("numeric", "{1.50,NaN,-0.001,Infinity}", ["1.50", "NaN", "-0.001", "Infinity"]),
    ("float8", "{1.5,NaN,-Infinity}", [1.5, "NaN", "-Infinity"]),
    ("bool", "{t,f,NULL}", [True, False, None]),
    ("date", '{1970-01-02,"0044-03-15 BC",infinity}', [1, -735160, INT64_MAX]),
    (
        "timestamptz",
        '{"2024-01-01 12:00:00.5+00","0044-03-15 10:00:00+00 BC",infinity}',
        ["2024-01-01T12:00:00.500000Z", "-0043-03-15T10:00:00.000000Z", "infinity"],
    ),
    ("bytea", '{"\\\\x0a0b","\\\\x",NULL}', ["Cgs=", "", None]),
    (
        "uuid",
        "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,00000000-0000-0000-0000-000000000000}",
        ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000000-0000-0000-0000-000000000000"],
    ),
    ("interval", '{PT0S,"P1Y2M"}', ["P0Y0M0DT0H0M0S", "P1Y2M0DT0H0M0S"]),
    ("jsonb", '{"{\\"a\\": 1}",NULL}', ['{"a": 1}', None]),
    ("int4range", '{"[1,5)",empty}', ["[1,5)", "empty"]),
]


@pytest.mark.parametrize(("element", "text", "expected"), ARRAY_CASES, ids=lambda v: repr(v)[:40])
def test_array_conversion(element: str, text: str, expected: list) -> None:
    value = converter(array_of(base(element)))(text)
    assert value == expected
    assert orjson.loads(orjson.dumps(value)) == value


def test_array_of_enum_and_composite() -> None:
    mood = PgType(50000, "mood", "enum")
    assert to_json_value(array_of(mood), "{happy,sad,NULL}") == ["happy", "sad", None]
    pair = PgType(50001, "pair", "composite")
    assert to_json_value(array_of(pair), '{"(1,a)","(2,\\"b c\\")"}') == ["(1,a)", '(2,"b c")']


def test_box_array_uses_semicolon() -> None:
    box = PgType(603, "box", "base")
    assert to_json_value(array_of(box, ";"), "{(1,1),(0,0);(3,3),(2,2)}") == ["(1,1),(0,0)", "(3,3),(2,2)"]
    assert to_json_value(array_of(box, ";"), '{"(1,1),(0,0)";NULL}') == ["(1,1),(0,0)", None]


def test_array_of_domain_element() -> None:
    price = PgType(60000, "numeric", "base", base_typmod=(10 << 16 | 2) + 4, domain_name="price")
    assert to_json_value(array_of(price), "{1.50,2.00}") == ["1.50", "2.00"]


@pytest.mark.parametrize("text", ["", "1,2", "{1,2", "{1,2}}", '{"a}', "{1}x", '{a"b}', "{{1},2"])
def test_bad_array_literal_raises(text: str) -> None:
    with pytest.raises(ValueError):
        converter(array_of(base("text")))(text)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("interval", "1 day"),
        ("interval", "P"),
        ("interval", "P1.5Y"),
        ("date", "2024-13"),
        ("int4", "x"),
        ("bool", "maybe"),
        ("time", "10:00:00.1234567"),
        ("timetz", "10:00:00"),
        ("timestamp", "2024-01-01"),
        ("timestamp", ""),
        ("timestamptz", ""),
        ("date", ""),
        ("float8", ""),
        ("time", ""),
        ("timetz", ""),
    ],
)
def test_bad_scalar_raises(name: str, text: str) -> None:
    with pytest.raises(ValueError):
        converter(base(name))(text)


# ---------------------------------------------------------------------------------------------
# JSON exactness
# ---------------------------------------------------------------------------------------------
def test_json_round_trip_exactness() -> None:
    values = [
        converter(base("numeric"))("3.14159265358979323846264338327950288419716939937510"),
        converter(base("numeric"))("1.000"),
        converter(base("int8"))("9223372036854775807"),
        converter(base("int8"))("-9223372036854775808"),
        converter(base("date"))("infinity"),
        converter(base("date"))("-infinity"),
        converter(base("timestamp"))("294276-12-31 23:59:59.999999"),  # beyond int64 since 1970 (fits u64)
        converter(base("float8"))("0.1"),
        converter(base("float8"))("NaN"),
        converter(base("float4"))("Infinity"),
        converter(array_of(base("numeric")))("{1.10,NULL}"),
    ]
    encoded = orjson.dumps(values)
    assert orjson.loads(encoded) == values
    assert b'"3.14159265358979323846264338327950288419716939937510"' in encoded
    assert b'"1.000"' in encoded and b'"NaN"' in encoded and b'"Infinity"' in encoded
    assert b"9223372036854775807" in encoded and b"-9223372036854775808" in encoded


def test_float_shortest_repr() -> None:
    # the JSON text is the shortest that reads back as the same double (literal bytes, not our output)
    for text, shortest in (
        ("0.1", b"0.1"),
        ("1.1", b"1.1"),
        ("123456.789", b"123456.789"),
        ("1e-05", b"0.00001"),
        ("3.0000000000000004", b"3.0000000000000004"),
        ("0.30000000000000004", b"0.30000000000000004"),
        ("1.10000000000000008881784197001", b"1.1"),  # more digits than needed: shortened
    ):
        value = converter(base("float8"))(text)
        assert orjson.dumps(value) == shortest, text
        assert orjson.loads(shortest) == float(text)


def test_common_converters_are_cheap() -> None:
    # The hot types are builtins (no Python frame per value), not dispatching wrappers.
    assert converter(base("int4")) is int
    assert converter(base("int8")) is int
    assert converter(base("text")) is str
    assert converter(base("numeric")) is str
    assert converter(PgType(1, "mood", "enum")) is str


def test_timestamptz_prints_the_column_precision() -> None:
    """Debezium 3 prints timestamptz(p) with p fraction digits (6 when undeclared)."""
    t = base("timestamptz")
    assert converter(t, 3)("2024-01-01 12:00:00.5+00") == "2024-01-01T12:00:00.500Z"
    assert converter(t, 0)("2024-01-01 12:00:00+00") == "2024-01-01T12:00:00Z"
    assert converter(t, -1)("2024-01-01 12:00:00+00") == "2024-01-01T12:00:00.000000Z"
    assert converter(t, 2)("2024-01-01 01:00:00.25+05:30") == "2023-12-31T19:30:00.25Z"
