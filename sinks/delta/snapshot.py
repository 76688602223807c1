"""A Delta table's latest version and table properties without a Spark job.

`DeltaTable.detail()` reports numFiles/sizeInBytes, so it builds the snapshot's whole file list
(Delta's "Compute snapshot for version N": three Spark jobs over the log) just to hand back the
properties; `history(1)` runs a job to read one commit. The apply job asks both after every cut
(the follower's marker, the versions `_cdc_cuts` records), so each cut paid one extra state
reconstruction and a history job (issue 15 item 5). The table's DeltaLog, brought up to date
(a listing of `_delta_log`), knows its version, and its metadata (read from the commit's
checksum file) holds the properties.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def latest_snapshot(spark: SparkSession, path: str) -> Any:
    """The JVM Snapshot of the table's latest version (DeltaLog.update: lists `_delta_log`, reuses
    the cached snapshot when nothing was committed since)."""
    jvm = spark.sparkContext._jvm
    none = jvm.scala.Option.empty()
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    return log.update(False, none, none)  # (stalenessAcceptable, checkIfUpdatedSinceTs, catalogTable)


def table_version(spark: SparkSession, path: str) -> int:
    """The table's latest Delta version (the table must exist)."""
    return int(latest_snapshot(spark, path).version())


def table_id(spark: SparkSession, path: str) -> str:
    """The table's id (its metaData id: the same for the table's whole life, new if it is made anew)."""
    return str(latest_snapshot(spark, path).metadata().id())


def table_property(spark: SparkSession, path: str, key: str) -> str | None:
    """One table property of the latest version (None: not set)."""
    found = latest_snapshot(spark, path).metadata().configuration().get(key)
    return found.get() if found.isDefined() else None


def reader_protocol(spark: SparkSession, path: str) -> tuple[int, set[str]]:
    """The table's minimum reader version and its explicit reader features (empty below version 3)."""
    protocol = latest_snapshot(spark, path).protocol()
    features = protocol.readerFeatures()
    names = set()
    if features.isDefined():
        it = features.get().iterator()
        while it.hasNext():
            names.add(str(it.next()))
    return int(protocol.minReaderVersion()), names
