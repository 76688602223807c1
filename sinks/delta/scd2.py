"""SCD type 2 for Delta followers: every transaction that touched a key adds a version row.

Columns beyond the source's: _cdc_start_lsn (commit LSN the version began at), _cdc_end_lsn
and _cdc_end_ts (the change that ended it; NULL = current), plus the SCD1 ones (_cdc_lsn and
_cdc_seq: the last event folded into the version, _cdc_op, _cdc_commit_ts: when it began).
A delete or a truncate ends the current version without starting a new one. A follower that
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
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.tables import spark_ident as q
from sinks.changes import NetChanges
from sinks.delta.batch import DeltaBatch
from sinks.delta.idempotent import follower_write

SCD2_COLUMNS = {
    "_cdc_start_lsn": T.LongType(),
    "_cdc_end_lsn": T.LongType(),
    "_cdc_end_ts": T.TimestampType(),
}


def _ends(v: DataFrame, truncates: list[tuple[int, int, int | None]]) -> tuple[SparkColumn, SparkColumn]:
    """Each version ends at the next version of its key or at the first truncate after it."""
    end_lsn, end_ts = F.col("_cdc_next_lsn"), F.col("_cdc_next_ts")
    for lsn, _seq, ts in reversed(truncates):  # the earliest applicable truncate is applied last and wins
        applies = (F.col("_cdc_lsn") < lsn) & (end_lsn.isNull() | (end_lsn > lsn))
        end_lsn = F.when(applies, F.lit(lsn)).otherwise(end_lsn)
        end_ts = F.when(applies, F.timestamp_micros(F.lit(ts))).otherwise(end_ts)
    return end_lsn, end_ts


def _fill_unchanged(
    target: DeltaTable, versions: NetChanges, keys: tuple[str, ...], columns: list[str]
) -> DataFrame:
    """Unchanged-TOAST values the batch could not resolve come from the key's current version."""
    v = versions.df
    if not versions.unchanged:
        return v
    wanted = list(versions.unchanged)
    # The table as of its version now (time travel), not `target.toDF()`: Delta's writes below
    # drop cached plans over the table, and re-reading it after the current versions were ended
    # would find no value to keep.
    version, location = (
        target.history(1).select("version").first()[0],
        target.detail().select("location").first()[0],
    )
    snapshot = target.toDF().sparkSession.read.format("delta").option("versionAsOf", version).load(location)
    current = snapshot.filter(F.col("_cdc_end_lsn").isNull()).select(
        *(F.col(q(k)) for k in keys), *(F.col(q(c)).alias(f"__cdc_cur_{i}") for i, c in enumerate(wanted))
    )
    joined = v.join(current, on=list(keys), how="left")
    out = []
    for c in v.columns:
        if c in versions.unchanged:
            i = wanted.index(c)
            out.append(
                F.when(F.col(versions.unchanged[c]), F.col(f"__cdc_cur_{i}")).otherwise(F.col(q(c))).alias(c)
            )
        elif c not in versions.unchanged.values():
            out.append(F.col(q(c)))
    return joined.select(*out)


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
    filled = _fill_unchanged(target, versions, keys, columns).persist()  # read the target before changing it
    try:
        filled.count()
        end_lsn, end_ts = _ends(filled, batch.truncates)
        rows = filled.filter(F.col("_cdc_op") != "d").select(
            *(F.col(q(c)) for c in columns),
            "_cdc_lsn",
            "_cdc_seq",
            "_cdc_op",
            "_cdc_commit_ts",
            F.col("_cdc_lsn").alias("_cdc_start_lsn"),
            end_lsn.alias("_cdc_end_lsn"),
            end_ts.alias("_cdc_end_ts"),
        )
        on_key = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in keys)
        if not fresh:
            if batch.bootstrap and batch.snapshot_lsn is not None:
                # Versions older than a new snapshot end when it began (its rows' _cdc_commit_ts), so
                # "as of" a time finds exactly one version per key on either side of it.
                began = filled.filter(F.col("_cdc_op") == "r").agg(F.min("_cdc_commit_ts")).first()[0]
                target.update(
                    f"_cdc_end_lsn IS NULL AND _cdc_start_lsn < {batch.snapshot_lsn}",
                    {
                        "_cdc_end_lsn": F.lit(batch.snapshot_lsn),
                        "_cdc_end_ts": F.lit(began) if began else F.current_timestamp(),
                    },
                )
            firsts = (
                filled.groupBy(*(F.col(q(k)) for k in keys))
                .agg(F.min(F.struct("_cdc_lsn", "_cdc_commit_ts")).alias("f"))
                .select(
                    *(F.col(q(k)) for k in keys),
                    F.col("f._cdc_lsn").alias("first_lsn"),
                    F.col("f._cdc_commit_ts").alias("first_ts"),
                )
            )
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
        insert = {q(c): F.col(f"s.{q(c)}") for c in rows.columns}
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
