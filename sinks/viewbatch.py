"""A derived view's changes between two versions of its out table, as a sink applies a table's.

The view stage (pipelines/views/) keeps each view in a Delta table of its own with Change Data
Feed on (`<state_dir>/views/out/<view>`). A follower of the view reads the changes of that table
between the version it reached and the view's current version, reduced to the last change per
view key (a delete -> `_cdc_op` 'd'), or, when it starts the view over (a new epoch, a follower
that never applied it), every row of the table at the current version. `ViewBatch` offers what
the sinks read of a `TableBatch` (sinks/changes.py), so every follower kind applies `views.<name>`
with its own key encoding, type mapping, position guard and idempotence per cut, unchanged.

The view's columns are Spark types; the sinks map PostgreSQL types. `view_schema` gives each
column the PostgreSQL type that `sinks/sparktypes.py` maps back to the same Spark type (a decimal
keeps its precision and scale via the type modifier). A Spark type no PostgreSQL type maps to
(a struct, a map, a byte) is stored as its JSON text, or as a short.

Positions: every row of one view batch is at (the view's cut LSN, 0): the view changes only when
a cut does, and the cut LSNs only grow, so a replayed batch is never newer than what it wrote.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.config import VIEW_SCHEMA  # a view is followed as the table `views.<name>`
from cdc.ground.errors import SinkError
from cdc.ground.tables import TableName
from cdc.log.base import Column, TableSchema
from sinks.changes import NetChanges, cached_property

# Spark type -> (PostgreSQL type oid, name, array type oid, array name)
_PG: dict[type, tuple[int, str, int, str]] = {
    T.ShortType: (21, "int2", 1005, "_int2"),
    T.ByteType: (21, "int2", 1005, "_int2"),
    T.IntegerType: (23, "int4", 1007, "_int4"),
    T.LongType: (20, "int8", 1016, "_int8"),
    T.FloatType: (700, "float4", 1021, "_float4"),
    T.DoubleType: (701, "float8", 1022, "_float8"),
    T.BooleanType: (16, "bool", 1000, "_bool"),
    T.BinaryType: (17, "bytea", 1001, "_bytea"),
    T.DateType: (1082, "date", 1182, "_date"),
    T.TimestampNTZType: (1114, "timestamp", 1115, "_timestamp"),
    T.TimestampType: (1184, "timestamptz", 1185, "_timestamptz"),
    T.StringType: (25, "text", 1009, "_text"),
}
_NUMERIC = (1700, "numeric", 1231, "_numeric")
_TEXT = _PG[T.StringType]


def view_table(name: str) -> TableName:
    return TableName(VIEW_SCHEMA, name)


def _scalar(dtype: T.DataType) -> tuple[tuple[int, str, int, str], int]:
    """(oids and names, typmod) of a non-array Spark type."""
    if isinstance(dtype, T.DecimalType):
        return _NUMERIC, ((dtype.precision << 16) | dtype.scale) + 4
    return _PG.get(type(dtype), _TEXT), -1


def _storable(dtype: T.DataType) -> T.DataType:
    """The Spark type the follower holds a view column as (what sparktypes maps its oid back to)."""
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(_storable(dtype.elementType), True)
    if isinstance(dtype, T.ByteType):
        return T.ShortType()
    if isinstance(dtype, T.DecimalType) or type(dtype) in _PG:
        return dtype
    return T.StringType()


def _column_value(name: str, dtype: T.DataType) -> Any:
    """The column as the follower holds it: structs, maps (and arrays of them) as JSON text."""
    col = F.col(f"`{name}`")
    target = _storable(dtype)
    if target == dtype:
        return col.alias(name)
    if isinstance(target, T.StringType) and not isinstance(dtype, T.StringType):
        if isinstance(dtype, T.StructType | T.MapType | T.ArrayType):
            return F.to_json(col).alias(name)
        return col.cast(T.StringType()).alias(name)
    return col.cast(target).alias(name)


def as_stored(df: DataFrame, columns: list[tuple[str, T.DataType]]) -> DataFrame:
    """The view's rows with each column as a follower holds it (`cdc verify` compares these)."""
    return df.select(*(_column_value(n, t) for n, t in columns))


def view_schema(columns: list[tuple[str, T.DataType]], key: tuple[str, ...]) -> TableSchema:
    """A TableSchema (PostgreSQL type oids) that sinks/sparktypes.py maps back to the view's Spark types."""
    cols: list[Column] = []
    types: dict[int, dict[str, Any]] = {}

    def pgtype(oid: int, name: str, kind: str = "base", element: dict | None = None) -> dict[str, Any]:
        return {
            "oid": oid, "name": name, "kind": kind, "element": element,
            "delimiter": ",", "base_typmod": -1, "domain_name": None,
        }  # fmt: skip

    for attnum, (name, dtype) in enumerate(columns, start=1):
        depth, inner = 0, _storable(dtype)
        while isinstance(inner, T.ArrayType):
            depth, inner = depth + 1, inner.elementType
        (oid, tname, array_oid, array_name), typmod = _scalar(inner)
        types[oid] = pgtype(oid, tname)
        if depth:
            types[array_oid] = pgtype(array_oid, array_name, "array", types[oid])
            cols.append(Column(name, array_oid, typmod, depth, None, attnum))
        else:
            cols.append(Column(name, oid, typmod, 0, None, attnum))
    return TableSchema(tuple(cols), tuple(key), types)


@dataclass
class ViewBatch:
    """What a sink applies of a view in one cut (the TableBatch attributes sinks read)."""

    spark: SparkSession
    view: str
    path: str  # the view's out table
    from_version: int  # the out table's version the follower reached (-1: none)
    to_version: int  # the view's version at this cut
    bootstrap: bool  # the follower starts the view over: every row at `to_version`
    columns: list[tuple[str, T.DataType]]
    key: tuple[str, ...]
    lsn: int  # the view's cut LSN: every row's position is (lsn, 0)
    epoch: int = 0
    # a TableBatch's attributes that a view never has (no source DDL, no truncate events)
    defaults: dict[str, tuple[int, str]] = field(default_factory=dict)
    retired: frozenset[str] = frozenset()
    renames: dict[str, tuple[str, ...]] = field(default_factory=dict)
    truncate_position: tuple[int, int] | None = None
    truncates: list[tuple[int, int, int | None]] = field(default_factory=list)
    value_kind: str = "view"

    @property
    def table(self) -> TableName:
        return view_table(self.view)

    @cached_property
    def schema(self) -> TableSchema:
        return view_schema(self.columns, self.key)

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(self.key)

    @cached_property
    def spark_schema(self) -> T.StructType:
        return T.StructType([T.StructField(n, _storable(t), True) for n, t in self.columns])

    @property
    def snapshot_lsn(self) -> int | None:
        # starting over is a truncate at (lsn, 0) for every sink kind: older rows of the view go
        return self.lsn if self.bootstrap else None

    @property
    def first_offset(self) -> int:
        return self.from_version

    @property
    def last_offset(self) -> int:
        return self.to_version

    @property
    def empty(self) -> bool:
        return not self.bootstrap and self.to_version <= self.from_version

    def default_value(self, column: str):
        raise KeyError(column)  # views have no fast defaults

    def check(self) -> None:
        """The out table must hold every column of the view with the key (a hand-edited or lost table)."""
        have = {f.name for f in self._read_schema()}
        missing = [n for n, _t in self.columns if n not in have]
        if missing:
            raise SinkError(
                f"view {self.view}: its table {self.path} lacks column(s) {', '.join(missing)}",
                "the view's table was changed outside the tool: remove it; the next `cdc apply` rebuilds the view",
            )

    def _read_schema(self) -> T.StructType:
        try:
            return (
                self.spark.read.format("delta").option("versionAsOf", self.to_version).load(self.path).schema
            )
        except Exception as exc:
            raise SinkError(
                f"view {self.view}: version {self.to_version} of its table {self.path} cannot be read "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})",
                "the view's table was removed or vacuumed outside the tool: remove it; the next `cdc apply` rebuilds the view",
            ) from None

    @cached_property
    def _commit_ts(self) -> dt.datetime | None:
        from delta.tables import DeltaTable

        row = DeltaTable.forPath(self.spark, self.path).history().filter(F.col("version") == self.to_version)
        found = row.select("timestamp").first()
        return None if found is None else found[0]

    def _changes(self) -> DataFrame:
        """The last change per key between the two versions (CDF), as (columns..., op, ts)."""
        feed = (
            self.spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", self.from_version + 1)
            .option("endingVersion", self.to_version)
            .load(self.path)
            .filter(F.col("_change_type") != "update_preimage")
        )
        # the newest version wins; in one version a write beats a delete of the same key (a replace)
        latest = Window.partitionBy(*(F.col(f"`{k}`") for k in self.key)).orderBy(
            F.col("_commit_version").desc(), (F.col("_change_type") == "delete").asc()
        )
        feed = feed.withColumn("__cdc_rn", F.row_number().over(latest)).filter(F.col("__cdc_rn") == 1)
        op = (
            F.when(F.col("_change_type") == "delete", "d")
            .when(F.col("_change_type") == "insert", "c")
            .otherwise("u")
        )
        return feed.select("*", op.alias("__op"), F.col("_commit_timestamp").alias("__ts"))

    def _all_rows(self) -> DataFrame:
        rows = self.spark.read.format("delta").option("versionAsOf", self.to_version).load(self.path)
        ts = self._commit_ts
        return rows.select("*", F.lit("c").alias("__op"), F.lit(ts).cast(T.TimestampType()).alias("__ts"))

    def net(self) -> NetChanges:
        df = self._all_rows() if self.bootstrap else self._changes()
        meta = [
            F.lit(self.lsn).cast(T.LongType()).alias("_cdc_lsn"),
            F.lit(0).cast(T.LongType()).alias("_cdc_seq"),
            F.col("__op").alias("_cdc_op"),
            F.col("__ts").cast(T.TimestampType()).alias("_cdc_commit_ts"),
        ]
        typed = df.select(*(_column_value(n, t) for n, t in self.columns), *meta)
        return NetChanges(typed)

    def versions(self) -> NetChanges:
        """SCD2 followers keep one version per view row and cut: the net change, with no next version."""
        net = self.net()
        extra = [
            F.lit(None).cast(T.LongType()).alias("_cdc_next_lsn"),
            F.lit(None).cast(T.TimestampType()).alias("_cdc_next_ts"),
        ]
        return NetChanges(net.df.select("*", *extra))

    def release(self) -> None:
        return None
