"""A Delta table's latest version and table properties without a Spark job.

`DeltaTable.detail()` reports numFiles/sizeInBytes, so it builds the snapshot's whole file list
(Delta's "Compute snapshot for version N": three Spark jobs over the log) just to hand back the
properties; `history(1)` runs a job to read one commit. The apply job asks both after every cut
(the follower's marker, the versions `_cdc_cuts` records), so each cut paid one extra state
reconstruction and a history job. The table's DeltaLog, brought up to date
(a listing of `_delta_log`), knows its version, and its metadata (read from the commit's
checksum file) holds the properties.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sinks.jvm import driver_jvm

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def latest_snapshot(spark: SparkSession, path: str) -> Any:
    """The JVM Snapshot of the table's latest version (DeltaLog.update: lists `_delta_log`, reuses
    the cached snapshot when nothing was committed since)."""
    jvm = driver_jvm(spark)
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


def txn_version(spark: SparkSession, path: str, app_id: str) -> int | None:
    """The newest idempotent-write version (the cut id) `app_id` committed to the table (None: it
    committed none). Read from the latest version's checksum file, which Delta writes with the
    table's transactions after each commit (no Spark job); a table without one (its checksum not
    written) asks the snapshot, which rebuilds the table's state (Spark jobs)."""
    snapshot = latest_snapshot(spark, path)
    checksum = snapshot.checksumOpt()
    known = checksum.get().setTransactions() if checksum.isDefined() else None
    if known is not None and known.isDefined():
        versions = [int(t.version()) for t in _iterate(known.get()) if str(t.appId()) == app_id]
        return max(versions) if versions else None
    found = snapshot.transactions().get(app_id)
    return int(found.get()) if found.isDefined() else None


def _iterate(seq: Any) -> list[Any]:
    it = seq.iterator()
    items = []
    while it.hasNext():
        items.append(it.next())
    return items


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


def written_rows(spark: SparkSession, path: str, app_id: str, txn_version: int, look_back: int = 5) -> int:
    """`numOutputRows` of the newest commit that carries the follower's idempotent write (app_id,
    txn_version), read from its commit file (one small file, no Spark job); 0 when none of the
    last `look_back` commits does."""
    import json

    jvm = driver_jvm(spark)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    latest = table_version(spark, path)
    for version in range(latest, max(latest - look_back, -1), -1):
        commit = jvm.org.apache.hadoop.fs.Path(f"{path}/_delta_log/{version:020d}.json")
        stream = commit.getFileSystem(conf).open(commit)
        try:
            text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        finally:
            stream.close()
        actions = [json.loads(line) for line in text.splitlines() if line.strip()]
        txn = next((a["txn"] for a in actions if "txn" in a), None)
        if txn and txn.get("appId") == app_id and int(txn.get("version", -1)) == txn_version:
            info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            return int((info.get("operationMetrics") or {}).get("numOutputRows", 0))
    return 0
