"""The base tables as one run of the view stage reads them, shared by every view it maintains.

* `frame(table, version)`: the base table at a Delta version, loaded once per run (each load
  resolves a Delta snapshot: Spark jobs whatever the size of the cut), with the source's current
  columns (a column dropped at the source is not there, so a view using it fails naming it; one
  added since is NULL).
* `touched(table, v0, v1)`: did the base follower change any row between two versions? Read from
  the JSON commits (pipelines/views/deltalog.py): the follower commits a marker per table per cut
  even when the cut has no row of it, and such a cut must cost a view nothing.
* `changes(table, v0, v1)`: the table's changed rows, old (at v0) and new (at v1), from its change
  data feed alone (never a scan of the table), materialised once (localCheckpoint) and reused by
  every view reading the table: per key, the first change in the range gives the old row (a
  pre-image or a delete) and the last one the new row (an insert or a post-image).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.tables import spark_ident as q
from pipelines.views.deltalog import data_changed
from pipelines.views.state import base_path
from sinks.delta.names import decoded, source_name
from sinks.delta.paths import table_path

if TYPE_CHECKING:
    from cdc.ground.tables import TableName

SIDE = "_cdcv_side"  # 'o' the row at v0, 'n' the row at v1
_OLD_KINDS = ("update_preimage", "delete")  # a change whose row is the one before it


class NoChangeData(Exception):
    """A base table's versions between two cuts lack change data: the cut is recomputed in full."""


class BaseTables:
    def __init__(self, spark: SparkSession, state: Path, log) -> None:
        self.spark = spark
        self.state = state
        self.log = log
        self._frames: dict[tuple[str, int], DataFrame] = {}
        self._latest: dict[str, dict[str, T.DataType]] = {}
        self._changes: dict[tuple[str, int, int], tuple[DataFrame, DataFrame]] = {}

    def path(self, table: TableName) -> str:
        return str(table_path(base_path(self.state), table))

    def _columns(self, df: DataFrame, table: TableName) -> list:
        """The source's current columns of `df` (NULL for one the version read lacks)."""
        have = set(df.columns)
        return [
            F.col(q(c)) if c in have else F.lit(None).cast(self._latest_type(table, c)).alias(c)
            for c in self.log.schema(table).column_names
        ]

    def _latest_type(self, table: TableName, column: str) -> T.DataType:
        """A column the version read lacks (added since): its type in the latest version."""
        name = str(table)
        if name not in self._latest:
            schema = DeltaTable.forPath(self.spark, self.path(table)).toDF().schema
            self._latest[name] = {source_name(f.name, f.metadata): f.dataType for f in schema.fields}
        return self._latest[name].get(column, T.StringType())

    def frame(self, table: TableName, version: int) -> DataFrame:
        key = (str(table), version)
        if key not in self._frames:
            # the base follower stores a name plain Delta cannot hold encoded (sinks/delta/names.py)
            df = decoded(
                self.spark.read.format("delta").option("versionAsOf", version).load(self.path(table))
            )
            self._frames[key] = df.select(*self._columns(df, table))
        return self._frames[key]

    def touched(self, table: TableName, v0: int, v1: int) -> bool:
        if v0 == v1:
            return False
        changed = data_changed(self.path(table), v0, v1)
        return True if changed is None else changed  # a commit file gone: assume rows changed

    def changes(self, table: TableName, v0: int, v1: int) -> tuple[DataFrame, DataFrame]:
        """(old rows, new rows) of the keys changed in (v0, v1]; NoChangeData without a feed."""
        cache_key = (str(table), v0, v1)
        if cache_key in self._changes:
            return self._changes[cache_key]
        try:
            feed = (
                self.spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", v0 + 1)
                .option("endingVersion", v1)
                .load(self.path(table))
            )
            feed = decoded(feed)  # analysed here: a range without change data fails now
        except Exception as exc:
            raise NoChangeData(
                f"base table {table} has no change data feed across versions {v0 + 1}..{v1}"
            ) from exc
        key = [q(k) for k in self.log.schema(table).key]
        late = F.when(F.col("_change_type").isin(*_OLD_KINDS), 0).otherwise(1)
        events = feed.select("*", late.alias("_cdcv_late"))
        order = [F.col("_commit_version"), F.col("_cdcv_late")]
        first = Window.partitionBy(*key).orderBy(*order)
        last = Window.partitionBy(*key).orderBy(*[c.desc() for c in order])
        ranked = events.select(
            "*",
            F.row_number().over(first).alias("_cdcv_first"),
            F.row_number().over(last).alias("_cdcv_last"),
        )
        picked = ranked.where(
            "(_cdcv_first = 1 AND _cdcv_late = 0) OR (_cdcv_last = 1 AND _cdcv_late = 1)"
        ).select("*", F.when(F.col("_cdcv_late") == 0, "o").otherwise("n").alias(SIDE))
        both = picked.select(*self._columns(feed, table), F.col(SIDE))
        # one job: the feed read once, then every view reads the checkpointed rows
        both = both.localCheckpoint(eager=True)
        old = both.where(F.col(SIDE) == "o").drop(SIDE)
        new = both.where(F.col(SIDE) == "n").drop(SIDE)
        self._changes[cache_key] = (old, new)
        return old, new
