"""SCD type 2 for Delta followers: every transaction that touched a key adds a version row
(columns and versions: sinks/scd2.py, shared with the Iceberg follower). A follower that
starts a table over from a new snapshot ends every current version at the snapshot point
and records the snapshot rows as new versions (history before is kept).

Writes are idempotent per step, so replaying a cut changes nothing:
  1. end the current versions of keys the batch touches (only versions older than the batch's first);
  2. end current versions at the first truncate of the batch (only older ones);
  3. insert the batch's versions that are not there yet (key + start), with Delta's
     idempotent-write confs.
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc.ground.tables import spark_ident as q
from sinks.changes import NetChanges
from sinks.delta.batch import DeltaBatch
from sinks.delta.idempotent import follower_write
from sinks.scd2 import SCD2_COLUMNS, fill_from_before, first_versions, version_rows

__all__ = ["SCD2_COLUMNS", "apply_scd2"]


def _fill_unchanged(target: DeltaTable, versions: NetChanges, keys: tuple[str, ...]) -> DataFrame:
    """Unchanged-TOAST values the batch could not resolve come from the key's version before the
    cut (sinks/scd2.py fill_from_before: ended or not, so a replay keeps them too)."""
    if not versions.unchanged:
        return versions.df
    # The table as of its version now (time travel), not `target.toDF()`: Delta's writes below
    # drop cached plans over the table, and re-reading it after the current versions were ended
    # would find no value to keep.
    version, location = (
        target.history(1).select("version").collect()[0][0],
        target.detail().select("location").collect()[0][0],
    )
    snapshot = target.toDF().sparkSession.read.format("delta").option("versionAsOf", version).load(location)
    return fill_from_before(versions, snapshot, keys)


def apply_scd2(
    spark: SparkSession,
    target: DeltaTable,
    batch: DeltaBatch,
    versions: NetChanges,
    cut_id: int,
    app_id: str,
    fresh: bool,
) -> dict[str, int]:
    keys = batch.key_columns
    columns = [f.name for f in batch.spark_schema.fields]
    filled = _fill_unchanged(target, versions, keys).persist()  # read the target before changing it
    try:
        filled.count()
        rows = version_rows(filled, columns, batch.truncates)
        on_key = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in keys)
        if not fresh:
            if batch.bootstrap and batch.snapshot_lsn is not None:
                # Versions older than a new snapshot end when it began (its rows' _cdc_commit_ts), so
                # "as of" a time finds exactly one version per key on either side of it.
                began = filled.filter(F.col("_cdc_op") == "r").agg(F.min("_cdc_commit_ts")).collect()[0][0]
                target.update(
                    f"_cdc_end_lsn IS NULL AND _cdc_start_lsn < {batch.snapshot_lsn}",
                    {
                        "_cdc_end_lsn": F.lit(batch.snapshot_lsn),
                        "_cdc_end_ts": F.lit(began) if began else F.current_timestamp(),
                    },
                )
            firsts = first_versions(filled, keys)
            (
                target.alias("t")
                .merge(
                    firsts.alias("s"),
                    f"{on_key} AND t._cdc_end_lsn IS NULL AND t._cdc_start_lsn < s.first_lsn",
                )
                .whenMatchedUpdate(
                    set={"_cdc_end_lsn": F.col("s.first_lsn"), "_cdc_end_ts": F.col("s.first_ts")}
                )
                .execute()
            )
            if batch.truncates:
                lsn, _seq, ts = batch.truncates[0]
                target.update(
                    f"_cdc_end_lsn IS NULL AND _cdc_start_lsn < {lsn}",
                    {"_cdc_end_lsn": F.lit(lsn), "_cdc_end_ts": F.timestamp_micros(F.lit(ts))},
                )
        insert: dict[str, str | Column] = {q(c): F.col(f"s.{q(c)}") for c in rows.columns}
        with follower_write(spark, app_id, cut_id):
            metrics = (
                target.alias("t")
                .merge(rows.alias("s"), f"{on_key} AND t._cdc_start_lsn = s._cdc_start_lsn")
                .whenNotMatchedInsert(values=insert)
                .execute()
                .first()
            )
        return {"inserted": int(metrics["num_inserted_rows"]) if metrics else 0}
    finally:
        filled.unpersist()
