"""`dropped_columns: null | drop` on a Delta SCD1 follower: at the cut that brings a
column's DROP (the batch whose schema span retires it), after that cut's MERGE:

* null: every row gets NULL in the column (an UPDATE of the rows that still hold a value, so a cut
  applied again after a crash rewrites nothing); later inserts get NULL and later updates leave it;
* drop: the column goes from the table: metadata only on a table with column mapping, otherwise the
  table is rewritten without it in one commit (overwriteSchema; properties and the idempotent-write
  versions are kept), so plain readers (delta-rs, Polars) keep reading it.

Neither commit carries the cut's txn version (Delta would skip it as written already): both are
idempotent by themselves, and a replayed cut repeats them harmlessly.
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc.ground.tables import spark_ident as q
from sinks.delta.features import has_column_mapping
from sinks.delta.snapshot import table_property


def retire_columns(spark: SparkSession, path: str, columns: list[str], how: str) -> list[str]:
    """NULL or drop `columns` in the Delta table at `path`; the columns it changed."""
    table = DeltaTable.forPath(spark, path)
    fields = {f.name: f.dataType for f in table.toDF().schema.fields}
    present = [c for c in columns if c in fields]
    if not present:
        return []
    if how == "null":
        held = " OR ".join(f"{q(c)} IS NOT NULL" for c in present)
        table.update(held, {q(c): F.lit(None).cast(fields[c]) for c in present})
        return present
    mapping = table_property(spark, path, "delta.columnMapping.mode")
    if has_column_mapping({"delta.columnMapping.mode": mapping or "none"}):
        spark.sql(f"ALTER TABLE delta.{q(path)} DROP COLUMNS ({', '.join(q(c) for c in present)})")
    else:
        rows = spark.read.format("delta").load(path).drop(*present)
        rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)
    return present
