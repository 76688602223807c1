"""A small cut typed in the driver by pyarrow (sinks/arrowtyping.py) holds exactly the values Spark's
casts give (sinks/sparktypes.py), on values PostgreSQL itself printed under cdc's session settings;
where pyarrow would differ or cannot parse a value, it declines and Spark types the cut (and names
a value no Spark type holds)."""

from __future__ import annotations

import psycopg2
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import functions as F

from cdc.log.base import Column
from cdc.pgtypes import resolve_types
from cdc.session import libpq_options
from sinks.arrowtyping import typed_text
from sinks.sparktypes import cast_failures, from_text

pytestmark = pytest.mark.integration

# (column type, values as SQL literals, whether pyarrow types them all)
CASES = [
    ("int2", ["0", "32767", "-32768", "NULL"], True),
    ("int4", ["2147483647", "-2147483648", "42"], True),
    ("int8", ["9223372036854775807", "-9223372036854775808"], True),
    ("oid", ["4294967295", "0"], True),
    ("float4", ["1.1", "3.4028235e38", "-0", "'NaN'", "'Infinity'", "'-Infinity'", "1e-45", "0.1"], True),
    (
        "float8",
        [
            "0.1",
            "1e308",
            "1.7976931348623157e308",
            "5e-324",
            "'NaN'",
            "'-Infinity'",
            "-0",
            "123456789.123456789",
        ],
        True,
    ),
    ("numeric(12,2)", ["0", "1.5", "-1234567890.12", "9999999999.99", "0.005", "-0.004"], True),
    ("numeric(38,10)", ["1234567890123456789012345678.0123456789", "-0.0000000001"], True),
    ("numeric(5,0)", ["99999", "-1"], True),
    ("numeric", ["'NaN'", "1.23456789012345678901234567890", "1e100"], True),  # kept as text
    ("bool", ["true", "false", "NULL"], True),
    ("date", ["'2024-02-29'", "'0001-01-01'", "'9999-12-31'", "'1582-10-04'"], True),
    (
        "timestamp",
        [
            "'2024-01-01 12:34:56.123456'",
            "'0001-01-01 00:00:00'",
            "'9999-12-31 23:59:59.999999'",
            "'1900-01-01 00:00:00.5'",
        ],
        True,
    ),
    (
        "timestamptz",
        ["'2024-01-01 12:34:56.123456+05:30'", "'0001-01-01 00:00:00+00'", "'1969-12-31 23:59:59.999999-08'"],
        True,
    ),
    ("text", ["'a'", "''", "'ünï ✓'", "E'tab\\there'"], True),
    ("varchar(20)", ["'code'"], True),
    ("uuid", ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"], True),
    ("jsonb", ['\'{"b": 1, "a": [1, 2]}\''], True),
    ("bytea", ["'\\x00ff'", "''", "decode(repeat('ab', 300), 'hex')", "NULL"], True),
    ("time", ["'12:34:56.5'", "'24:00:00'", "'00:00:00.000001'", "'23:59:59.999999'", "NULL"], True),
    ("time(0)", ["'12:34:56.7'"], True),
    # pyarrow declines: Spark decides (and stops on the values it cannot hold)
    ("numeric(12,2)", ["1.5", "'NaN'"], False),
    ("date", ["'2024-01-01'", "'infinity'"], False),
    ("date", ["'2024-01-01 BC'"], False),
    ("date", ["'10000-01-01'"], False),
    ("timestamp", ["'-infinity'"], False),
    ("timestamptz", ["'0044-03-15 12:00:00+00 BC'"], False),
    # arrays: split by Spark's own parser (cdc.pgarrays), their elements typed as columns are
    ("int4[]", ["'{1,2}'", "'{}'", "'{NULL,3}'", "NULL", "'[0:1]={5,6}'"], True),
    ("int8[][]", ["'{{1,2},{3,4}}'", "'{{NULL,NULL}}'", "'{}'"], True),
    ("text[]", ["ARRAY['a,b', 'NULL', NULL, '', ' sp ', 'q\"uote', 'back\\slash', 'ünï ✓']"], True),
    ("float8[]", ["'{NaN,Infinity,-Infinity,-0,5e-324,0.1}'"], True),
    ("float4[]", ["'{1.1,NaN}'"], True),
    ("numeric(12,2)[]", ["'{1.5,-0.01,NULL}'"], True),
    ("bool[]", ["'{t,f,NULL}'"], True),
    ("date[]", ["'{2024-02-29,0001-01-01}'"], True),
    (
        "timestamptz[]",
        ["ARRAY['2024-01-01 12:34:56.5+05:30'::timestamptz, '9999-12-31 23:59:59.999999+00']"],
        True,
    ),
    ("timestamp[]", ["ARRAY['0001-01-01 00:00:00'::timestamp]"], True),
    ("bytea[]", ["ARRAY['\\x00ff'::bytea, '', NULL]"], True),
    ("time[]", ["ARRAY['24:00:00'::time, '00:00:00.000001']"], True),
    ("uuid[]", ["ARRAY['a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid]"], True),
    ("jsonb[]", ["ARRAY['{\"a\": [1, \"x,y\"]}'::jsonb, 'null']"], True),
    ("interval", ["'1 day 2 hours'"], False),
    ("interval[]", ["'{1 day}'"], False),
    ("timetz[]", ["'{12:00+02}'"], False),
    ("int4[]", ["'{{1,2},{3,4}}'"], False),  # more dimensions than declared: Spark stops on it
    ("numeric(12,2)[]", ["'{NaN}'"], False),
    ("date[]", ["'{infinity}'"], False),
]


def _printed(dsn: str, type_sql: str, literals: list[str]) -> tuple[Column, object, list[str | None]]:
    """The column, its resolved type, and PostgreSQL's text of each value, from a real table."""
    conn = psycopg2.connect(dsn, options=libpq_options())
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS typed; CREATE TABLE typed (n serial, v {type_sql})")
            cur.execute(f"INSERT INTO typed (v) VALUES {', '.join(f'({lit})' for lit in literals)}")
            cur.execute(
                "SELECT atttypid, atttypmod, attndims FROM pg_attribute"
                " WHERE attrelid = 'typed'::regclass AND attname = 'v'"
            )
            oid, typmod, ndims = cur.fetchone()
            pg_type = resolve_types(conn, [oid])[oid]
            # the type's output function's text, as pgoutput and COPY send it (bool: t/f, not true/false)
            raw = psycopg2.extensions.new_type((oid,), "RAW", lambda value, _cur: value)
            psycopg2.extensions.register_type(raw, cur)
            cur.execute("SELECT v FROM typed ORDER BY n")
            texts = [r[0] for r in cur.fetchall()]
    finally:
        conn.close()
    return Column("v", oid, typmod, ndims), pg_type, texts


@pytest.mark.parametrize(
    ("type_sql", "literals", "typed_here"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_pyarrow_types_a_value_as_spark_does_or_declines(
    spark, pg_db, type_sql, literals, typed_here
) -> None:
    column, pg_type, texts = _printed(pg_db, type_sql, literals)
    here = typed_text(pa.array(texts, pa.string()), pg_type, column)
    assert (here is not None) == typed_here, (type_sql, texts)
    if here is None:
        return
    frame = spark.createDataFrame([(t,) for t in texts], "text string")
    typed = from_text(F.col("text"), pg_type, column)
    spark_typed = frame.select(
        typed.alias("v"), cast_failures(F.col("text"), typed, pg_type, column).alias("failed")
    )
    result = spark_typed.toArrow()
    assert not any(result["failed"].to_pylist()), (type_sql, texts)  # Spark holds every value too
    theirs = result["v"].combine_chunks()
    while pa.types.is_list(here.type):  # the same nesting and NULLs, then the elements below
        assert here.type.value_field.name == theirs.type.value_field.name, (here.type, theirs.type)
        assert pc.list_value_length(here).to_pylist() == pc.list_value_length(theirs).to_pylist(), texts
        here, theirs = here.flatten(), theirs.flatten()
    result = {"v": theirs}
    assert here.type == result["v"].type or here.type.equals(pa.timestamp("us", tz="UTC"))
    if not pa.types.is_floating(here.type):
        assert here.to_pylist() == result["v"].cast(here.type).to_pylist(), (type_sql, texts)
    else:  # -0.0 == 0.0 and NaN != NaN: compare the bits
        assert here.null_count == result["v"].null_count
        assert (
            here.cast(pa.float64()).to_numpy(zero_copy_only=False).tobytes()
            == result["v"].cast(pa.float64()).to_numpy(zero_copy_only=False).tobytes()
        )
