"""cdc.typemap against a real PostgreSQL 15: every mapped type, read back via COPY and via ::text."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from decimal import Decimal

import orjson
import psycopg2
import pytest

from cdc.copytext import copy_text_unescape, split_copy_line
from cdc.pgdatetime import INT64_MAX, INT64_MIN, days_from_civil
from cdc.pgtypes import PgType, resolve_types
from cdc.session import libpq_options
from cdc.typemap import converter

pytestmark = pytest.mark.integration

SAME = object()  # expected JSON value: PostgreSQL's text output itself (locale- or version-specific)

SETUP = """
CREATE EXTENSION citext;
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy', 'with space', 'quo"te');
CREATE TYPE pair AS (a int4, b text);
CREATE DOMAIN price AS numeric(10,2);
CREATE DOMAIN label AS text;
CREATE DOMAIN short_label AS label CHECK (length(VALUE) < 100);
CREATE DOMAIN int_list AS int4[];
"""


def ts_micros(year: int, month: int, day: int, h: int = 0, m: int = 0, s: int = 0, us: int = 0) -> int:
    return (days_from_civil(year, month, day) * 86400 + h * 3600 + m * 60 + s) * 1_000_000 + us


# column name, SQL type, [(SQL expression, expected JSON value)]; missing rows are NULL
COLUMNS: list[tuple[str, str, list[tuple[str, object]]]] = [
    ("c_int2", "int2", [("-32768", -32768), ("32767", 32767), ("0", 0)]),
    ("c_int4", "int4", [("-2147483648", -2147483648), ("2147483647", 2147483647)]),
    ("c_int8", "int8", [("-9223372036854775808", INT64_MIN), ("9223372036854775807", INT64_MAX)]),
    ("c_oid", "oid", [("4294967295", 4294967295), ("0", 0)]),
    ("c_xid", "xid", [("'12345'", 12345)]),
    (
        "c_float4",
        "float4",
        [
            ("1.1", 1.1),
            ("'NaN'", "NaN"),
            ("'-Infinity'", "-Infinity"),
            ("'3.4028235e38'", 3.4028235e38),
            ("'1e-45'", 1e-45),
            ("-0.0", -0.0),
        ],
    ),
    (
        "c_float8",
        "float8",
        [
            ("0.1", 0.1),
            ("'-0'", -0.0),
            ("'1.7976931348623157e308'", 1.7976931348623157e308),
            ("'Infinity'", "Infinity"),
            ("'NaN'", "NaN"),
            ("'5e-324'", 5e-324),
            ("1/3.0::float8", 1 / 3),
        ],
    ),
    (
        "c_numeric",
        "numeric",
        [
            ("1.50", "1.50"),
            ("'NaN'", "NaN"),
            ("-0.000001", "-0.000001"),
            ("'123456789012345678901234567890.123456789'", "123456789012345678901234567890.123456789"),
            ("'Infinity'", "Infinity"),
            ("'-Infinity'", "-Infinity"),
            ("0", "0"),
        ],
    ),
    ("c_numeric_ps", "numeric(12,4)", [("1.5", "1.5000"), ("-12345678.12345", "-12345678.1235")]),
    ("c_price", "price", [("1.5", "1.50"), ("-99999999.99", "-99999999.99"), ("0", "0.00")]),
    ("c_money", "money", [("1000.5", SAME), ("-0.01", SAME)]),
    ("c_bool", "bool", [("true", True), ("false", False)]),
    (
        "c_text",
        "text",
        [
            ("''", ""),
            ("'héllo 😀 ünï'", "héllo 😀 ünï"),
            (
                "E'tab\\there\\nnewline\\r\\\\back \"q\" {b} ,c \\b\\f\\x0b'",
                'tab\there\nnewline\r\\back "q" {b} ,c \b\f\v',
            ),
            ("'NULL'", "NULL"),
            ("'\\N'", "\\N"),
        ],
    ),
    ("c_varchar", "varchar(10)", [("'abc'", "abc"), ("''", "")]),
    ("c_bpchar", "char(5)", [("'ab'", "ab   "), ("''", "     ")]),
    ("c_name", "name", [("'pg_class'", "pg_class")]),
    ("c_char", '"char"', [("'x'", "x")]),
    ("c_citext", "citext", [("'MiXeD Case'", "MiXeD Case")]),
    ("c_xml", "xml", [("'<a>1 &amp; 2</a>'", "<a>1 &amp; 2</a>")]),
    ("c_inet", "inet", [("'192.168.0.1/24'", "192.168.0.1/24"), ("'::1'", "::1")]),
    ("c_cidr", "cidr", [("'10.0.0.0/8'", "10.0.0.0/8")]),
    ("c_macaddr", "macaddr", [("'08:00:2B:01:02:03'", "08:00:2b:01:02:03")]),
    ("c_uuid", "uuid", [("'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")]),
    (
        "c_json",
        "json",
        [('\'{"b": 1,  "a": [1.10]}\'', '{"b": 1,  "a": [1.10]}'), ("'\"x\\ty\"'", '"x\\ty"')],
    ),
    ("c_jsonb", "jsonb", [('\'{"b": 1,  "a": [1.10]}\'', '{"a": [1.10], "b": 1}'), ("'null'", "null")]),
    ("c_bit", "bit(3)", [("B'101'", "101")]),
    ("c_varbit", "varbit", [("B''", ""), ("B'1'", "1")]),
    ("c_tsvector", "tsvector", [("'a fat cat'", "'a' 'cat' 'fat'")]),
    ("c_mood", "mood", [("'happy'", "happy"), ("'with space'", "with space"), ("'quo\"te'", 'quo"te')]),
    ("c_label", "short_label", [("'x'", "x"), ("''", "")]),
    (
        "c_bytea",
        "bytea",
        [
            ("'\\x'", ""),
            ("'\\x00ff0a'", base64.b64encode(b"\x00\xff\x0a").decode()),
            ("convert_to('\\', 'UTF8')", base64.b64encode(b"\\").decode()),
        ],
    ),
    (
        "c_date",
        "date",
        [
            ("'1970-01-01'", 0),
            ("'0044-03-15 BC'", -735160),
            ("'5874897-12-31'", 2145042905),
            ("'4714-11-24 BC'", -2440588),
            ("'infinity'", INT64_MAX),
            ("'-infinity'", INT64_MIN),
            ("'2024-02-29'", 19782),
            ("'0001-01-01 BC'", days_from_civil(0, 1, 1)),
        ],
    ),
    (
        "c_time",
        "time",
        [
            ("'00:00'", 0),
            ("'24:00:00'", 86_400_000_000),
            ("'23:59:59.999999'", 86_399_999_999),
            ("'10:15:30.5'", 36_930_500_000),
        ],
    ),
    (
        "c_timetz",
        "timetz",
        [
            ("'10:15:30.123+02'", "08:15:30.123Z"),
            ("'00:00:00-15:59'", "15:59:00Z"),
            ("'24:00:00+00'", "00:00:00Z"),
            ("'12:00:00.000001+05:30'", "06:30:00.000001Z"),
            ("'12:00:00-00:00:28'", "12:00:28Z"),
        ],
    ),
    (
        "c_timestamp",
        "timestamp",
        [
            ("'1970-01-01 00:00'", 0),
            ("'2024-01-01 00:00:01.5'", 1_704_067_201_500_000),
            ("'4714-11-24 00:00:00 BC'", ts_micros(-4713, 11, 24)),
            ("'294276-12-31 23:59:59.999999'", ts_micros(294276, 12, 31, 23, 59, 59, 999999)),
            ("'infinity'", INT64_MAX),
            ("'-infinity'", INT64_MIN),
            ("'0044-03-15 12:00:00.25 BC'", ts_micros(-43, 3, 15, 12, 0, 0, 250000)),
            ("'1969-12-31 23:59:59.999999'", -1),
        ],
    ),
    (
        "c_timestamptz",
        "timestamptz",
        [
            ("'2024-01-01 12:00:00.5+00'", "2024-01-01T12:00:00.500000Z"),
            ("'2024-01-01 01:00+05:30'", "2023-12-31T19:30:00.000000Z"),
            ("'0044-03-15 10:00:00 BC'", "-0043-03-15T10:00:00.000000Z"),
            ("'10000-01-01 00:00:00+00'", "+10000-01-01T00:00:00.000000Z"),
            ("'294276-12-31 23:59:59.999999+00'", "+294276-12-31T23:59:59.999999Z"),
            ("'infinity'", "infinity"),
            ("'-infinity'", "-infinity"),
            ("'4714-11-24 00:00:00+00 BC'", "-4713-11-24T00:00:00.000000Z"),
            ("'0001-01-01 00:00:00+00 BC'", "0000-01-01T00:00:00.000000Z"),
            ("'2024-06-30 23:59:59.123456-07'", "2024-07-01T06:59:59.123456Z"),
        ],
    ),
    (
        "c_interval",
        "interval",
        [
            ("'0'", "P0Y0M0DT0H0M0S"),
            ("'1 year 2 mons 3 days 04:05:06.78'", "P1Y2M3DT4H5M6.78S"),
            ("'-1 day -1.5 sec'", "P0Y0M-1DT0H0M-1.5S"),
            ("'-1 year -2 mons'", "P-1Y-2M0DT0H0M0S"),
            ("'-0.5 sec'", "P0Y0M0DT0H0M-0.5S"),
            ("'178000000 years'", "P178000000Y0M0DT0H0M0S"),
            ("'1 day -00:00:00.000001'", "P0Y0M1DT0H0M-0.000001S"),
            ("'1 year -2 mons 3 days -04:05:06.5'", "P0Y10M3DT-4H-5M-6.5S"),
            ("'2562047788 hours 54.775807 sec'", "P0Y0M0DT2562047788H0M54.775807S"),
        ],
    ),
    ("c_int4_arr", "int4[]", [("'{}'", []), ("'{1,NULL,3}'", [1, None, 3]), ("'[0:1]={1,2}'", [1, 2])]),
    (
        "c_int4_arr2",
        "int4[][]",
        [
            ("'{{1,2},{3,4}}'", [[1, 2], [3, 4]]),
            ("'{{NULL,2},{3,NULL}}'", [[None, 2], [3, None]]),
            ("'[1:1][-2:-1]={{7,8}}'", [[7, 8]]),
        ],
    ),
    (
        "c_text_arr",
        "text[]",
        [
            (
                "ARRAY['a,b', '\"q\"', '{x}', 'back\\slash', 'NULL', NULL, '', ' sp ', E'tab\\t nl\\n', 'ünï😀', '\\N']",
                ["a,b", '"q"', "{x}", "back\\slash", "NULL", None, "", " sp ", "tab\t nl\n", "ünï😀", "\\N"],
            ),
            ("'{}'::text[]", []),
            ("ARRAY[NULL]::text[]", [None]),
        ],
    ),
    ("c_numeric_arr", "numeric[]", [("'{1.50,NaN,-0.001,Infinity}'", ["1.50", "NaN", "-0.001", "Infinity"])]),
    (
        "c_tstz_arr",
        "timestamptz[]",
        [
            (
                "ARRAY['2024-01-01 12:00:00.5+00', '0044-03-15 10:00:00+00 BC', 'infinity', NULL]::timestamptz[]",
                ["2024-01-01T12:00:00.500000Z", "-0043-03-15T10:00:00.000000Z", "infinity", None],
            )
        ],
    ),
    (
        "c_bytea_arr",
        "bytea[]",
        [
            (
                "ARRAY['\\x0a0b'::bytea, '\\x'::bytea, NULL, convert_to('\\\"', 'UTF8')]",
                ["Cgs=", "", None, base64.b64encode(b'\\"').decode()],
            )
        ],
    ),
    (
        "c_uuid_arr",
        "uuid[]",
        [
            (
                "ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid, NULL]",
                ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", None],
            )
        ],
    ),
    ("c_bool_arr", "bool[]", [("'{t,f,NULL}'", [True, False, None])]),
    (
        "c_date_arr",
        "date[]",
        [("ARRAY['1970-01-02', '0044-03-15 BC', 'infinity']::date[]", [1, -735160, INT64_MAX])],
    ),
    ("c_float8_arr", "float8[]", [("'{1.5,NaN,-Infinity}'", [1.5, "NaN", "-Infinity"])]),
    (
        "c_mood_arr",
        "mood[]",
        [("ARRAY['happy', 'with space', 'quo\"te', NULL]::mood[]", ["happy", "with space", 'quo"te', None])],
    ),
    ("c_price_arr", "price[]", [("ARRAY[1.5, 2]::price[]", ["1.50", "2.00"])]),
    ("c_int_list", "int_list", [("'{4,5}'", [4, 5])]),
    (
        "c_interval_arr",
        "interval[]",
        [("ARRAY['1 day', '-1.5 sec']::interval[]", ["P0Y0M1DT0H0M0S", "P0Y0M0DT0H0M-1.5S"])],
    ),
    (
        "c_box_arr",
        "box[]",
        [("ARRAY[box '((0,0),(1,1))', box '((2,2),(3,3))']", ["(1,1),(0,0)", "(3,3),(2,2)"])],
    ),
    ("c_pair", "pair", [("ROW(1, 'a b')::pair", '(1,"a b")'), ("ROW(NULL, '')::pair", '(,"")')]),
    ("c_pair_arr", "pair[]", [("ARRAY[ROW(1, 'x')::pair, NULL]", ["(1,x)", None])]),
    ("c_int4range", "int4range", [("'[1,5)'", "[1,5)"), ("'empty'", "empty"), ("'(,3]'", "(,4)")]),
    ("c_multirange", "int4multirange", [("'{[1,3),[5,7)}'", "{[1,3),[5,7)}")]),
    ("c_point", "point", [("'(1,2.5)'", "(1,2.5)")]),
]
ROWS = max(len(values) for _, _, values in COLUMNS)
NAMES = [name for name, _, _ in COLUMNS]


@pytest.fixture
def conn(pg_db: str) -> Iterator[psycopg2.extensions.connection]:
    connection = psycopg2.connect(pg_db, options=libpq_options())
    connection.autocommit = True
    with connection.cursor() as cur:
        cur.execute(SETUP)
        cols = ", ".join(f"{name} {sqltype}" for name, sqltype, _ in COLUMNS)
        cur.execute(f"CREATE TABLE t (id int PRIMARY KEY, {cols})")
        for row in range(ROWS):
            exprs = [values[row][0] if row < len(values) else "NULL" for _, _, values in COLUMNS]
            cur.execute(f"INSERT INTO t VALUES ({row}, {', '.join(exprs)})")
    try:
        yield connection
    finally:
        connection.close()


def column_types(connection: psycopg2.extensions.connection) -> dict[str, tuple[PgType, int]]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT attname, atttypid::int8, atttypmod FROM pg_attribute "
            "WHERE attrelid = 't'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        )
        attrs = cur.fetchall()
    types = resolve_types(connection, [oid for _, oid, _ in attrs])
    return {name: (types[oid], typmod) for name, oid, typmod in attrs}


# For these types the explicit cast to text is not the output function: bool::text is 'true', not 't';
# bpchar::text drops the padding; inet::text always shows the netmask ('::1/128'). The log holds the
# output function's text (COPY and pgoutput print that), which format('%s', ...) gives.
NOT_OUTPUT_FORM_AS_TEXT = {"c_bool", "c_bpchar", "c_inet", "c_cidr"}


def text_expr(name: str) -> str:
    if name in NOT_OUTPUT_FORM_AS_TEXT:  # format() prints NULL as ''
        return f"CASE WHEN {name} IS NOT NULL THEN format('%s', {name}) END"
    return f"{name}::text"


def pg_texts(connection: psycopg2.extensions.connection) -> list[list[str | None]]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT {', '.join(text_expr(n) for n in NAMES)} FROM t ORDER BY id")
        return [list(row) for row in cur.fetchall()]


def copy_texts(connection: psycopg2.extensions.connection) -> list[list[str | None]]:
    buf = io.StringIO()
    with connection.cursor() as cur:
        cur.copy_expert(f"COPY (SELECT {', '.join(NAMES)} FROM t ORDER BY id) TO STDOUT", buf)
    lines = buf.getvalue().split("\n")
    assert lines[-1] == ""
    return [[copy_text_unescape(f) for f in split_copy_line(line)] for line in lines[:-1]]


def expected_value(column: int, row: int, text: str | None) -> object:
    values = COLUMNS[column][2]
    if row >= len(values):
        return None
    expected = values[row][1]
    return text if expected is SAME else expected


def assert_converted(rows: list[list[str | None]], types: dict[str, tuple[PgType, int]]) -> None:
    convs = [converter(*types[name]) for name in NAMES]
    assert len(rows) == ROWS
    failures = []
    for r, row in enumerate(rows):
        assert len(row) == len(NAMES)
        for c, text in enumerate(row):
            got = None if text is None else convs[c](text)
            want = expected_value(c, r, text)
            if got != want or type(got) is not type(want):
                failures.append(f"{NAMES[c]} row {r}: {text!r} -> {got!r}, expected {want!r}")
            assert orjson.loads(orjson.dumps(got)) == got
    assert not failures, "\n".join(failures)


def test_resolve_types(conn: psycopg2.extensions.connection) -> None:
    types = column_types(conn)
    assert types["c_int4"][0].kind == "base" and types["c_int4"][0].name == "int4"
    assert types["c_int4"][0].oid == 23
    assert types["c_mood"][0].kind == "enum" and types["c_mood"][0].name == "mood"
    assert types["c_citext"][0].name == "citext"
    price, typmod = types["c_price"]
    assert (price.name, price.kind, price.domain_name, typmod) == ("numeric", "base", "price", -1)
    assert price.base_typmod == (10 << 16 | 2) + 4
    label = types["c_label"][0]
    assert (label.name, label.kind, label.domain_name) == ("text", "base", "short_label")
    int_arr2 = types["c_int4_arr2"][0]
    assert (int_arr2.name, int_arr2.kind, int_arr2.element.name) == ("_int4", "array", "int4")
    int_list = types["c_int_list"][0]
    assert (int_list.kind, int_list.name, int_list.domain_name, int_list.element.name) == (
        "array",
        "_int4",
        "int_list",
        "int4",
    )
    price_arr = types["c_price_arr"][0]
    assert price_arr.kind == "array"
    assert (price_arr.element.name, price_arr.element.domain_name) == ("numeric", "price")
    assert price_arr.element.base_typmod == (10 << 16 | 2) + 4
    assert types["c_mood_arr"][0].element.kind == "enum"
    assert types["c_box_arr"][0].delimiter == ";"
    assert types["c_text_arr"][0].delimiter == ","
    assert types["c_pair"][0].kind == "composite"
    assert types["c_int4range"][0].kind == "range"
    assert types["c_multirange"][0].kind == "multirange"
    assert types["c_numeric_ps"][1] == (12 << 16 | 4) + 4
    # an unknown oid, a pseudo type, int2vector (not an array literal) and no oids at all
    more = resolve_types(conn, [2_000_000_000, 2249, 22, 23])
    assert more[2_000_000_000].kind == "other"
    assert more[2249].kind == "pseudo"
    assert more[22].kind == "base" and more[22].name == "int2vector"
    assert resolve_types(conn, []) == {}


def test_convert_select_text(conn: psycopg2.extensions.connection) -> None:
    assert_converted(pg_texts(conn), column_types(conn))


def test_convert_copy_text(conn: psycopg2.extensions.connection) -> None:
    rows = copy_texts(conn)
    assert rows == pg_texts(conn)  # COPY text, once unescaped, is exactly the ::text output
    assert_converted(rows, column_types(conn))


def _column_values(conn: psycopg2.extensions.connection, name: str) -> list[tuple[int, str]]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT id, {name}::text FROM t WHERE {name} IS NOT NULL ORDER BY id")
        return cur.fetchall()


def test_cross_check_with_postgres(conn: psycopg2.extensions.connection) -> None:
    types = column_types(conn)
    conv = {name: converter(*types[name]) for name in NAMES}
    checked = 0
    with conn.cursor() as cur:
        # date: days since the epoch, computed by PostgreSQL
        cur.execute("SELECT c_date::text, c_date - '1970-01-01'::date FROM t WHERE isfinite(c_date)")
        for text, days in cur.fetchall():
            assert conv["c_date"](text) == days
            checked += 1
        # timestamp: exact microseconds (extract(epoch) is inexact beyond int64 micros, so use date + time)
        cur.execute(
            "SELECT c_timestamp::text, (c_timestamp::date - '1970-01-01'::date)::numeric * 86400000000"
            " + extract(epoch FROM c_timestamp::time) * 1000000 FROM t WHERE isfinite(c_timestamp)"
        )
        for text, micros in cur.fetchall():
            assert conv["c_timestamp"](text) == int(micros)
            checked += 1
        # timestamptz: the fields of the same instant in UTC, as PostgreSQL's to_char prints them
        cur.execute(
            "SELECT c_timestamptz::text, to_char(c_timestamptz AT TIME ZONE 'UTC', 'YYYY|MM|DD|HH24|MI|SS|US|BC')"
            " FROM t WHERE isfinite(c_timestamptz)"
        )
        for text, fields in cur.fetchall():
            year_s, month, day, hour, minute, second, micros_s, era = fields.split("|")
            year = int(year_s) if era == "AD" else 1 - int(year_s)
            year_iso = f"{year:04d}" if 0 <= year <= 9999 else (f"+{year}" if year > 0 else f"-{-year:04d}")
            micros = int(micros_s)
            frac = f".{micros:06d}"  # timestamptz without declared precision: 6 digits, as Debezium 3
            iso = conv["c_timestamptz"](text)
            assert iso == f"{year_iso}-{month}-{day}T{hour}:{minute}:{second}{frac}Z"
            if iso[0].isdigit() and iso[:4] != "0000":  # PostgreSQL parses 4-digit years AD in ISO form
                cur.execute("SELECT %s::timestamptz = %s::timestamptz", (iso, text))
                assert cur.fetchone()[0], (iso, text)
            checked += 1
        # time and timetz: microseconds since midnight (UTC for timetz)
        cur.execute(
            "SELECT c_time::text, extract(epoch FROM c_time) * 1000000 FROM t WHERE c_time IS NOT NULL"
        )
        for text, micros in cur.fetchall():
            assert conv["c_time"](text) == int(micros)
            checked += 1
        cur.execute("SELECT c_timetz::text, extract(epoch FROM c_timetz) FROM t WHERE c_timetz IS NOT NULL")
        for text, seconds in cur.fetchall():
            iso = conv["c_timetz"](text)
            cur.execute("SELECT extract(epoch FROM %s::timetz)", (iso,))
            assert cur.fetchone()[0] % 86400 == seconds % 86400, (text, iso)
            checked += 1
        # numeric: the string is PostgreSQL's own value
        for name in ("c_numeric", "c_numeric_ps", "c_price"):
            for _, text in _column_values(conn, name):
                cur.execute("SELECT %s::numeric::text", (conv[name](text),))
                assert cur.fetchone()[0] == text
                checked += 1
        # floats: the same double psycopg2 reads
        cur.execute("SELECT c_float8::text, c_float8 FROM t WHERE c_float8 IS NOT NULL")
        for text, value in cur.fetchall():
            got = conv["c_float8"](text)
            if isinstance(got, str):
                assert got == str(value).replace("inf", "Infinity").replace("nan", "NaN")
            else:
                assert got == value
            checked += 1
        # interval: Debezium's string parses back to the same interval
        for _, text in _column_values(conn, "c_interval"):
            cur.execute("SELECT %s::interval::text", (conv["c_interval"](text),))
            assert cur.fetchone()[0] == text
            checked += 1
        # bytea: base64 of the bytes
        cur.execute("SELECT c_bytea::text, c_bytea FROM t WHERE c_bytea IS NOT NULL")
        for text, raw in cur.fetchall():
            assert base64.b64decode(conv["c_bytea"](text)) == bytes(raw)
            checked += 1
        # arrays: element by element against unnest()
        cur.execute(
            "SELECT c_numeric_arr::text, ARRAY(SELECT e::text FROM unnest(c_numeric_arr) e) FROM t"
            " WHERE c_numeric_arr IS NOT NULL"
        )
        for text, elements in cur.fetchall():
            assert conv["c_numeric_arr"](text) == elements
            checked += 1
    assert checked >= 40


def test_same_values_with_server_defaults_differ_without_session_settings(pg_db: str) -> None:
    # Why every connection uses cdc.session: with other settings the text (and so the JSON) changes.
    connection = psycopg2.connect(
        pg_db, options="-c DateStyle=German -c IntervalStyle=postgres -c TimeZone=Asia/Kolkata"
    )
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT '2024-01-01 12:00:00+00'::timestamptz::text, '1 day'::interval::text")
            ts_text, interval_text = cur.fetchone()
        assert ts_text != "2024-01-01 12:00:00+00" and interval_text == "1 day"
    finally:
        connection.close()
    connection = psycopg2.connect(pg_db, options=libpq_options())
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT '2024-01-01 12:00:00+00'::timestamptz::text, '1 day'::interval::text")
            ts_text, interval_text = cur.fetchone()
        assert converter(PgType(1184, "timestamptz", "base"))(ts_text) == "2024-01-01T12:00:00.000000Z"
        assert converter(PgType(1186, "interval", "base"))(interval_text) == "P0Y0M1DT0H0M0S"
    finally:
        connection.close()


def test_decimal_exactness_through_json(conn: psycopg2.extensions.connection) -> None:
    types = column_types(conn)
    num = converter(*types["c_numeric"])
    for _, text in _column_values(conn, "c_numeric"):
        value = orjson.loads(orjson.dumps({"v": num(text)}))["v"]
        assert value == text
        if value not in ("NaN", "Infinity", "-Infinity"):
            assert Decimal(value) == Decimal(text)
