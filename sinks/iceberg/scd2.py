"""SCD type 2 for Iceberg followers (`mode: scd2`): every transaction that touched a key adds a
version row (columns and versions: sinks/scd2.py, shared with the Delta follower).

One cut is at most three commits, each safe to run again:
  1. a new base (the follower starts the table over from a snapshot): the current versions older
     than it end where it began;
  2. one MERGE that ends the current version of every key the batch touches (only versions
     older than the key's first change in the batch) and inserts the batch's versions not there
     yet (matched by key and _cdc_start_lsn);
  3. a truncate in the batch: the current versions older than its first truncate end there.
The last of them carries the cut's snapshot properties (sinks/iceberg/commit.py): a replay after a
crash finds the cut only once all of it is committed, and then skips it.

Unchanged-TOAST values the batch could not resolve come from the key's version before the batch
(the newest that began before the cut's first change, ended or not: a replay finds it too), read
before any of these commits (and kept apart from the table: a local checkpoint).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc.ground.tables import spark_ident as q
from sinks.changes import Batch, NetChanges
from sinks.iceberg import jvm
from sinks.iceberg.commit import APP_ID, CUT, snapshot_properties
from sinks.iceberg.sources import source_view
from sinks.scd2 import fill_from_before, first_versions, version_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_KIND = "__cdc_kind"  # 'e': ends a key's current version; 'i': a version to insert


def _before(versions: NetChanges, ident: str, snapshot: int | None) -> DataFrame | None:
    """The table as it is (under its current column names: prepare may have renamed one since its
    last snapshot), in the session the versions were read in (the sink registered its catalog
    there): a join across sessions does not resolve."""
    if snapshot is None:
        return None
    return versions.df.sparkSession.table(ident)


def _fill_unchanged(table: DataFrame | None, versions: NetChanges, keys: tuple[str, ...]) -> DataFrame:
    if not versions.unchanged or table is None:
        return versions.df
    return fill_from_before(versions, table, keys)


def apply_scd2(
    spark: SparkSession,
    where: tuple[str, str, str],
    batch: Batch,
    versions: NetChanges,
    cut_id: int,
    app_id: str,
) -> int:
    """The cut's versions into the table at `where` (catalog, namespace, name); returns how many
    versions were inserted."""
    ident = ".".join(q(part) for part in where)
    before = jvm.table(spark, *where)
    current = None if before is None else before.currentSnapshot()
    snapshot = None if current is None else int(current.snapshotId())
    inserted = 0
    keys = batch.key_columns
    columns = [f.name for f in batch.spark_schema.fields]
    props = {APP_ID: app_id, CUT: str(cut_id)}
    # Materialised with its lineage cut (a local checkpoint): the table is read once, before this
    # cut writes it, and the MERGE's source does not name its own target (Spark cannot resolve a
    # MERGE whose source plan reads the target table: AMBIGUOUS_REFERENCE).
    filled = _fill_unchanged(_before(versions, ident, snapshot), versions, keys).localCheckpoint()
    try:
        if batch.bootstrap and batch.snapshot_lsn is not None and snapshot is not None:
            # Versions older than a new snapshot end when it began (its rows' _cdc_commit_ts), so
            # "as of" a time finds exactly one version per key on either side of it.
            first = filled.filter(F.col("_cdc_op") == "r").agg(F.min(F.unix_micros("_cdc_commit_ts"))).first()
            began = None if first is None else first[0]
            ts = f"timestamp_micros({began})" if began is not None else "current_timestamp()"
            spark.sql(
                f"UPDATE {ident} SET _cdc_end_lsn = {batch.snapshot_lsn}, _cdc_end_ts = {ts} "
                f"WHERE _cdc_end_lsn IS NULL AND _cdc_start_lsn < {batch.snapshot_lsn}"
            )
        rows = version_rows(filled, columns, batch.truncates).withColumn(_KIND, F.lit("i"))
        enders = first_versions(filled, keys).withColumn(_KIND, F.lit("e"))
        source = rows.unionByName(enders, allowMissingColumns=True)
        on_key = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in keys)
        names = [*rows.columns[:-1]]
        on = (
            f"{on_key} AND ((s.{_KIND} = 'e' AND t._cdc_end_lsn IS NULL AND t._cdc_start_lsn < s.first_lsn)"
            f" OR (s.{_KIND} = 'i' AND t._cdc_start_lsn = s._cdc_start_lsn))"
        )
        clauses = (
            f"WHEN MATCHED AND s.{_KIND} = 'e' THEN UPDATE SET t._cdc_end_lsn = s.first_lsn, "
            "t._cdc_end_ts = s.first_ts "
            f"WHEN NOT MATCHED AND s.{_KIND} = 'i' THEN INSERT ({', '.join(q(c) for c in names)}) "
            f"VALUES ({', '.join(f's.{q(c)}' for c in names)})"
        )
        with source_view(source) as view:
            merge = f"MERGE INTO {ident} t USING {view} s ON {on} {clauses}"
            if batch.truncates:
                spark.sql(merge)
            else:
                with snapshot_properties(spark, props):
                    spark.sql(merge)
        merged = jvm.table(spark, *where)
        if merged is not None and merged.currentSnapshot() is not None:
            done = jvm.summary(merged.currentSnapshot())
            inserted = int(
                done.get("spark.merge-into.num-target-rows-inserted", done.get("added-records", 0))
            )
        if batch.truncates:
            lsn, _seq, ts_us = batch.truncates[0]
            end_ts = f"timestamp_micros({ts_us})" if ts_us is not None else "current_timestamp()"
            with snapshot_properties(spark, props):
                spark.sql(
                    f"UPDATE {ident} SET _cdc_end_lsn = {lsn}, _cdc_end_ts = {end_ts} "
                    f"WHERE _cdc_end_lsn IS NULL AND _cdc_start_lsn < {lsn}"
                )
    finally:
        filled.unpersist()  # the checkpoint's blocks
    return inserted
