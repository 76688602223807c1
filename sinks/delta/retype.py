"""A re-base that changes a column's type in a way Delta cannot widen (int -> text, text -> int,
int -> numeric, ... after `ALTER COLUMN ... TYPE ... USING`): the table takes the new type.

Outside a re-base such a change stops the batch (sinks/delta/sink.py); in a batch that starts the
table over from a new base, every row the table holds is replaced or ended anyway, so:

* SCD1: the table is rewritten in ONE Delta commit (`overwriteSchema`) to exactly what a new
  follower builds from the base: the batch's rows with the new column types. Columns the table
  has and the source no longer has (dropped earlier) stay, NULL, as after any re-base. The commit
  carries the follower's (txnAppId, txnVersion = cut id), so a replayed cut is skipped by Delta;
  a replay also finds the new type already there and takes the ordinary re-base path.
* SCD2: history is kept exactly, in ONE Delta commit (`overwriteSchema`) before the new base's
  versions are added (sinks/delta/scd2.py): every current version older than the base ends at the
  base (as any re-base ends them), and each retyped column's old values move to a column
  `<column>__before_<base LSN>` (its old type; NULL in versions started at or after the base),
  while `<column>` gets the new type (NULL in the older versions). A version is read as
  `coalesce(<column>, <column>__before_<L>)` where the types allow it. A replay finds the new type
  already there and does not rewrite again.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.tables import spark_ident as q
from sinks.changes import META_COLUMNS, META_TYPES, NetChanges
from sinks.delta.batch import DeltaBatch
from sinks.delta.idempotent import follower_write


def _overwrite(df, path: str) -> None:
    df.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)


def archive_name(column: str, base_lsn: int) -> str:
    """Where an SCD2 table keeps a retyped column's values of versions older than the base."""
    return f"{column}__before_{base_lsn}"


def rebuild_scd1(
    spark: SparkSession,
    path: str,
    current: dict[str, T.DataType],
    rename: list[tuple[str, str]],
    batch: DeltaBatch,
    changes: NetChanges,
    cut_id: int,
    app_id: str,
) -> int:
    """Replace the table with the batch's rows (new types) in one idempotent commit; rows written."""
    source = [(f.name, f.dataType) for f in batch.spark_schema.fields]
    meta = [(m, META_TYPES[m]) for m in META_COLUMNS]
    renamed_from = {old for old, _new in rename}
    wanted = {n for n, _t in source + meta}
    kept = [(n, t) for n, t in current.items() if n not in wanted and n not in renamed_from]
    rows = changes.df.filter(F.col("_cdc_op") != "d").select(
        # an encoded name keeps its comment (sinks/delta/names.py): a cast drops column metadata
        *(F.col(q(n)).cast(t).alias(n, metadata=batch.metadata(n)) for n, t in source + meta),
        *(F.lit(None).cast(t).alias(n) for n, t in kept),
    )
    rows = rows.persist()
    try:
        count = rows.count()
        with follower_write(spark, app_id, cut_id):
            _overwrite(rows, path)
        return count
    finally:
        rows.unpersist()


def end_history(
    spark: SparkSession,
    path: str,
    rename: list[tuple[str, str]],
    replace: list[tuple[str, T.DataType, T.DataType]],
    batch: DeltaBatch,
    changes: NetChanges,
) -> None:
    """SCD2: end the versions older than the base and retype the columns, in one commit."""
    base = batch.snapshot_lsn
    assert base is not None  # only planned for a batch from a new base
    [(began,)] = changes.df.filter(F.col("_cdc_op") == "r").agg(F.min("_cdc_commit_ts")).collect()
    table = spark.read.format("delta").load(path)
    new_names = dict(rename)  # old name -> new name
    retyped = {name: new for name, _old, new in replace}
    wanted = {f.name: f.dataType for f in batch.spark_schema.fields}
    older = F.col("_cdc_end_lsn").isNull() & (F.col("_cdc_start_lsn") < base)
    out, archive = [], []
    for f in table.schema.fields:
        name = new_names.get(f.name, f.name)
        col = F.col(q(f.name))
        meta = batch.metadata(name)
        if name in retyped:
            archive.append(col.alias(archive_name(name, base)))
            out.append(F.lit(None).cast(retyped[name]).alias(name, metadata=meta))
        elif f.name == "_cdc_end_lsn":
            out.append(F.when(older, F.lit(base)).otherwise(col).alias(f.name))
        elif f.name == "_cdc_end_ts":
            ended = F.lit(began).cast(T.TimestampType()) if began is not None else F.current_timestamp()
            out.append(F.when(older, ended).otherwise(col).alias(f.name))
        elif name in wanted and wanted[name] != f.dataType:
            out.append(col.cast(wanted[name]).alias(name, metadata=meta))  # a widening (exact)
        elif f.name != name:
            out.append(col.alias(name, metadata=meta))
        else:
            out.append(col.alias(name))
    have = {new_names.get(f.name, f.name) for f in table.schema.fields}
    added = [
        F.lit(None).cast(t).alias(n, metadata=batch.metadata(n)) for n, t in wanted.items() if n not in have
    ]
    _overwrite(table.select(*out, *added, *archive), path)


def rewrite_columns(
    spark: SparkSession,
    path: str,
    rename: list[tuple[str, str]],
    retype: dict[str, T.DataType],
    metadata: Callable[[str], dict[str, str]],
) -> None:
    """Rename and/or widen columns by rewriting the table in one commit (`overwriteSchema`), for
    tables without column mapping or type widening: no table feature is taken on, so every
    reader keeps the table (docs/reading-the-lake.md). Every row is kept (SCD2: history too);
    `retype` (by the column's new name) holds widenings only, so each cast is exact. The table's
    properties (the follower's marker) and its Delta txn versions stay as they are. A renamed or
    retyped column takes `metadata(new name)` (an encoded name's comment, sinks/delta/names.py)."""
    table = spark.read.format("delta").load(path)
    new_names = dict(rename)  # old name -> new name
    out = []
    for f in table.schema.fields:
        name = new_names.get(f.name, f.name)
        col = F.col(q(f.name))
        if name in retype or name != f.name:
            out.append(
                (col.cast(retype[name]) if name in retype else col).alias(name, metadata=metadata(name))
            )
        else:
            out.append(col.alias(name))
    _overwrite(table.select(*out), path)
