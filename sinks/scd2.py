"""SCD type 2, the part every table engine shares (Delta: sinks/delta/scd2.py, Iceberg:
sinks/iceberg/scd2.py): every transaction that touched a key adds a version row.

Columns beyond the source's: _cdc_start_lsn (commit LSN the version began at), _cdc_end_lsn
and _cdc_end_ts (the change that ended it; NULL = current), plus the SCD1 ones (_cdc_lsn and
_cdc_seq: the last event folded into the version, _cdc_op, _cdc_commit_ts: when it began).
A delete or a truncate ends the current version without starting a new one.

Here: the batch's version rows with their ends, the first version per key (which ends the key's
current version in the table), and unchanged-TOAST values taken from the table's version before
the batch. The engines write them.
"""

from __future__ import annotations

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.tables import spark_ident as q
from sinks.changes import NetChanges

SCD2_COLUMNS = {
    "_cdc_start_lsn": T.LongType(),
    "_cdc_end_lsn": T.LongType(),
    "_cdc_end_ts": T.TimestampType(),
}


def ends(truncates: list[tuple[int, int, int | None]]) -> tuple[SparkColumn, SparkColumn]:
    """Each version ends at the next version of its key or at the first truncate after it."""
    end_lsn, end_ts = F.col("_cdc_next_lsn"), F.col("_cdc_next_ts")
    for lsn, _seq, ts in reversed(truncates):  # the earliest applicable truncate is applied last and wins
        applies = (F.col("_cdc_lsn") < lsn) & (end_lsn.isNull() | (end_lsn > lsn))
        end_lsn = F.when(applies, F.lit(lsn)).otherwise(end_lsn)
        end_ts = F.when(applies, F.timestamp_micros(F.lit(ts))).otherwise(end_ts)
    return end_lsn, end_ts


def version_rows(
    filled: DataFrame, columns: list[str], truncates: list[tuple[int, int, int | None]]
) -> DataFrame:
    """The batch's versions as table rows (deletes start none): source columns, the SCD1 meta
    columns, and _cdc_start_lsn/_cdc_end_lsn/_cdc_end_ts."""
    end_lsn, end_ts = ends(truncates)
    return filled.filter(F.col("_cdc_op") != "d").select(
        *(F.col(q(c)) for c in columns),
        "_cdc_lsn",
        "_cdc_seq",
        "_cdc_op",
        "_cdc_commit_ts",
        F.col("_cdc_lsn").alias("_cdc_start_lsn"),
        end_lsn.alias("_cdc_end_lsn"),
        end_ts.alias("_cdc_end_ts"),
    )


def first_versions(filled: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Per key of the batch: its first change (`first_lsn`, `first_ts`), where the key's current
    version in the table ends."""
    return (
        filled.groupBy(*(F.col(q(k)) for k in keys))
        .agg(F.min(F.struct("_cdc_lsn", "_cdc_commit_ts")).alias("f"))
        .select(
            *(F.col(q(k)) for k in keys),
            F.col("f._cdc_lsn").alias("first_lsn"),
            F.col("f._cdc_commit_ts").alias("first_ts"),
        )
    )


def fill_from_before(versions: NetChanges, table: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """`fill_from` with each key's newest version in `table` that began before the batch's first
    change, ended or not. Not "the current version": a cut replayed after a crash between ending
    the current versions and inserting the new ones finds them ended, and must still keep the
    values (the batch's own versions, which a replay may also find, all begin at or after it)."""
    if not versions.unchanged:
        return versions.df
    first = versions.df.agg(F.min("_cdc_lsn")).first()
    older = table.filter(F.col("_cdc_start_lsn") < (first[0] if first is not None else 0))
    wanted = [c for c in versions.unchanged if c not in keys]  # (a key is never an unchanged value)
    newest = F.max_by(F.struct(*(F.col(q(c)) for c in wanted)), F.col("_cdc_start_lsn")).alias("__cdc_v")
    previous = older.groupBy(*(F.col(q(k)) for k in keys)).agg(newest)
    previous = previous.select(
        *(F.col(q(k)) for k in keys), *(F.col(f"__cdc_v.{q(c)}").alias(c) for c in wanted)
    )
    return fill_from(versions, previous, keys)


def fill_from(versions: NetChanges, current: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """The versions with each unchanged-TOAST value the batch could not resolve taken from
    `current` (keys + the unchanged columns: each key's version in the table before the batch)."""
    v = versions.df
    wanted = list(versions.unchanged)
    current = current.select(
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
