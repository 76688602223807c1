"""Source columns -> Iceberg columns, and which type changes Iceberg's schema evolution can make.

Iceberg has no 8- or 16-bit integers: Spark's smallint/tinyint columns are stored as int (so a
smallint source column is `int` in the table and in every reader). Widening (metadata only) is
what Iceberg's spec allows: int -> bigint, float -> double, decimal(P,S) -> decimal(P',S) with
P' > P (same scale). Anything else is not a widening.
"""

from __future__ import annotations

from pyspark.sql import types as T


def stored_type(t: T.DataType) -> T.DataType:
    """The type Iceberg stores a Spark type as."""
    if isinstance(t, T.ByteType | T.ShortType):
        return T.IntegerType()
    if isinstance(t, T.ArrayType):
        return T.ArrayType(stored_type(t.elementType), True)
    return t


def same_type(have: T.DataType, want: T.DataType) -> bool:
    """The table's column type holds the source's (nullability aside)."""
    have, want = stored_type(have), stored_type(want)
    if isinstance(have, T.ArrayType) and isinstance(want, T.ArrayType):
        return same_type(have.elementType, want.elementType)
    return have == want


def widenable(have: T.DataType, want: T.DataType) -> bool:
    have, want = stored_type(have), stored_type(want)
    if isinstance(have, T.IntegerType) and isinstance(want, T.LongType):
        return True
    if isinstance(have, T.FloatType) and isinstance(want, T.DoubleType):
        return True
    if isinstance(have, T.DecimalType) and isinstance(want, T.DecimalType):
        return want.scale == have.scale and want.precision > have.precision
    return False


def type_sql(t: T.DataType) -> str:
    return stored_type(t).simpleString()
