"""A keyless table as a multiset, in Delta and in Iceberg (docs/keyless-tables.md).

Each follower row is one source row, identified by the position of the event that inserted it
(`_cdc_lsn`, `_cdc_seq`: a snapshot row's or an insert's). A delete names no position, only the
deleted row's content (REPLICA IDENTITY FULL sends the whole old row; an update is logged as that
delete and an insert of the new row): it removes one row with that content. Identical rows are
interchangeable, so which one goes does not change the multiset; the choice is still fixed, so a
cut always means the same commit: per content, among the rows the table has and the rows the cut
inserts, the oldest positions go, as many as the cut deletes.

The cut's changes and those removals are one MERGE on the position, committed with the follower's
cut id (Delta: its idempotent-write id, txnAppId = follower, txnVersion = cut id; Iceberg: the
snapshot summary's cut id, sinks/iceberg/commit.py): a cut applied again after a crash before the
checkpoint is skipped, so no second copy is removed. An insert-only table's cuts have no deletes
and add their inserts on the position alone.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from cdc.ground.tables import spark_ident as q
from sinks.changes import META_COLUMNS

POSITION = ["_cdc_lsn", "_cdc_seq"]


def multiset_source(
    changes: DataFrame, content: list[str], target: DataFrame | None, restart: bool = False
) -> DataFrame:
    """The MERGE source of one cut: the inserted rows that stay (op 'c'/'r', their own position) and,
    as op 'd' at their position, the table's rows that the cut's deletes remove. `changes`: one row
    per event (a keyless table's log key is the position), typed, stored column names + META_COLUMNS;
    `target`: the follower table as it is (None for a table made in this cut). `restart`: the cut starts
    the table over from a new base (its whole history is in the cut), so every row the table holds
    goes, in the same commit, except those the cut inserts again at the same position."""
    cols = [q(c) for c in content]
    events = changes.select(*cols, *META_COLUMNS)
    deletes = events.where(F.col("_cdc_op") == "d").groupBy(*cols).agg(F.count(F.lit(1)).alias("__cdc_n"))
    inserts = events.where(F.col("_cdc_op") != "d")
    pool = inserts.withColumn("__cdc_new", F.lit(True))
    if target is not None and not restart:
        held = target.select(*cols, *META_COLUMNS).withColumn("__cdc_new", F.lit(False))
        pool = held.unionByName(pool)
    same = reduce(
        lambda a, b: a & b,
        (F.col(f"p.{c}").eqNullSafe(F.col(f"d.{c}")) for c in cols),
        F.lit(True),
    )
    # per content, rows ranked oldest first; the first n go (n = the cut's deletes of that content)
    oldest = Window.partitionBy(*(F.col(f"p.{c}") for c in cols)).orderBy(
        F.col("p._cdc_lsn"), F.col("p._cdc_seq")
    )
    doomed = (
        pool.alias("p")
        .join(deletes.alias("d"), same, "inner")
        .select("p.*", F.col("d.__cdc_n"), F.row_number().over(oldest).alias("__cdc_rank"))
        .where(F.col("__cdc_rank") <= F.col("__cdc_n"))
        .select(*cols, *META_COLUMNS, "__cdc_new")
    )
    kept = inserts.join(doomed.where(F.col("__cdc_new")).select(*POSITION), POSITION, "left_anti")
    removed = doomed.where(~F.col("__cdc_new")).select(*cols, *META_COLUMNS)
    if target is not None and restart:
        removed = target.select(*cols, *META_COLUMNS).join(kept.select(*POSITION), POSITION, "left_anti")
    removed = removed.withColumn("_cdc_op", F.lit("d"))
    return kept.select(*cols, *META_COLUMNS).unionByName(removed.select(*cols, *META_COLUMNS))
