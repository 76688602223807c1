"""sinks/viewbatch.py: a derived view's Spark column types, given PostgreSQL type oids, map back to
the same Spark types through the sinks' own type mapping (sinks/sparktypes.py), so every follower
kind holds a view's column like a table's column of that type. No Spark session."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from cdc.schema import schema_types
from sinks.sparktypes import spark_type
from sinks.viewbatch import view_schema

pytestmark = pytest.mark.unit


def test_view_types_map_back_to_themselves():
    columns = [
        ("id", T.LongType()),
        ("n", T.IntegerType()),
        ("s", T.ShortType()),
        ("name", T.StringType()),
        ("revenue", T.DecimalType(20, 2)),
        ("big", T.DecimalType(38, 0)),
        ("ratio", T.DoubleType()),
        ("f", T.FloatType()),
        ("ok", T.BooleanType()),
        ("blob", T.BinaryType()),
        ("day", T.DateType()),
        ("at", T.TimestampType()),
        ("local", T.TimestampNTZType()),
        ("tags", T.ArrayType(T.StringType())),
        ("grid", T.ArrayType(T.ArrayType(T.DecimalType(10, 3)))),
    ]
    schema = view_schema(columns, ("id",))
    types = schema_types(schema)
    assert schema.key == ("id",)
    assert [spark_type(types[c.type_oid], c) for c in schema.columns] == [t for _n, t in columns]


def test_types_without_a_postgresql_type_are_held_as_text_or_short():
    columns = [("id", T.IntegerType()), ("b", T.ByteType()), ("m", T.MapType(T.StringType(), T.LongType()))]
    schema = view_schema(columns, ("id",))
    types = schema_types(schema)
    assert [spark_type(types[c.type_oid], c) for c in schema.columns] == [
        T.IntegerType(), T.ShortType(), T.StringType(),
    ]  # fmt: skip
