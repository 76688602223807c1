"""One table's rows compared in Spark for `cdc verify`: the source typed like apply types it,
counts and an order-independent content hash first, then a full outer join on the key (a keyless
table: EXCEPT ALL both ways) for the first differing keys; what the log changed since the point is
excused. The outcome is a TableVerdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc.ground.tables import spark_ident as q
from cdc.log.base import TableSchema
from pipelines.apply.readers.copyfiles import copy_rows
from sinks.changes import typed_columns
from sinks.shaping import Shape, shape_rows

SAMPLE_KEYS = 10


@dataclass
class TableVerdict:
    table: str
    source_rows: int = 0
    follower_rows: int = 0
    missing: int = 0  # in the source, not in the follower
    extra: int = 0  # in the follower, not in the source
    different: int = 0
    excused: int = 0  # differ, but changed after the verification point
    keyless: bool = False  # compared as a multiset: `excused` counts rows inserted or deleted since the point
    samples: list[str] = field(default_factory=list)
    missing_columns: list[str] = field(default_factory=list)  # the source has them, the follower does not
    # (old name, new name): renamed in the source, the follower still has the old name (compared under it)
    renamed_columns: list[tuple[str, str]] = field(default_factory=list)
    # (old name, new name, LSN): the same, but the log has the rename (at LSN): the follower's next apply brings it
    pending_renames: list[tuple[str, str, int]] = field(default_factory=list)
    # (name, LSN): added in the source, in the log at LSN, not applied by the follower yet (not compared)
    pending_columns: list[tuple[str, int]] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)  # said on the report: columns no follower can have

    @property
    def identical(self) -> bool:
        return (
            self.missing == self.extra == self.different == 0
            and not self.missing_columns
            and not self.renamed_columns
            and not self.pending_renames
            and not self.pending_columns
        )


def _typed_source(
    spark: SparkSession, schema: TableSchema, path: Path, shape: Shape | None = None
) -> DataFrame:
    """The source's rows typed like apply types them; shaped (columns, masks) like the sink's when given."""
    raw = shape_rows(copy_rows(spark, path), shape)
    schema = shape.schema if shape is not None else schema
    typed = typed_columns(schema, [F.col("vals")[i] for i in range(len(schema.columns))])
    return raw.select(*(t.alias(n) for n, t, _ in typed))


def compare(
    spark: SparkSession,
    schema: TableSchema,
    source: DataFrame,
    follower: DataFrame | None,
    excused: DataFrame | None,
    table: str,
    renamed: dict[str, str] | None = None,
    since: int | None = None,
    columns: dict[str, tuple[str | None, int | None]] | None = None,
) -> TableVerdict:
    """`renamed`: new name -> old name of source columns renamed since the log last saw the table;
    a follower that has the old name and not the new one is compared under the old name.
    `columns`: what `follower_columns` says of the follower's columns (by attnum, through the log's
    schema history): a column the log has renamed is compared under the follower's old name, one
    the log has added is not compared; both are named as not applied yet.
    `since`: a keyless table's follower rows committed at or after it are excused (past the source's
    point) when the log's changes past it are not given; with them (`excused` of a keyless table:
    typed rows with `__op`, from _keyless_after), the source at the point plus the rows inserted since
    is compared with the follower plus the rows deleted since (a multiset equation that holds
    through deletes of one of two identical rows)."""
    verdict = TableVerdict(table)
    names = [c.name for c in schema.columns]
    keys = list(schema.key)
    verdict.keyless = not keys
    if follower is None:
        follower = source.limit(0)
    if not keys and excused is not None:
        verdict.excused = excused.count()
    elif not keys and since is not None and "_cdc_lsn" in follower.columns:
        later = F.col("_cdc_lsn") >= since
        verdict.excused = follower.filter(later).count()
        follower = follower.filter(~later)
    old: dict[str, str] = {}
    for n in names:
        if n in follower.columns:
            continue
        was, brings = (columns or {}).get(n, (None, None))
        if was is not None and was in follower.columns:
            old[n] = was
            if brings is None:
                verdict.renamed_columns.append((was, n))
            else:
                verdict.pending_renames.append((was, n, brings))
        elif was is None and brings is not None and n not in keys:
            verdict.pending_columns.append((n, brings))
        elif (o := (renamed or {}).get(n)) is not None and o in follower.columns:
            old[n] = o
            verdict.renamed_columns.append((o, n))
    if verdict.pending_columns:  # the follower's next apply brings them: the rest is compared
        pending = {n for n, _ in verdict.pending_columns}
        names = [n for n in names if n not in pending]
        source = source.select(*(q(n) for n in names))
    missing_cols = [n for n in names if n not in follower.columns and n not in old]
    verdict.missing_columns = missing_cols
    follower = follower.select(
        *(
            F.col(q(old.get(n, n))).cast(source.schema[n].dataType).alias(n)
            if n in follower.columns or n in old
            else F.lit(None).cast(source.schema[n].dataType).alias(n)
            for n in names
        )
    )

    if not keys and excused is not None:
        after = excused.select(*(q(n) for n in names), "__op")
        source = source.select(*(q(n) for n in names)).unionByName(
            after.where(F.col("__op") != "d").drop("__op")
        )
        follower = follower.unionByName(after.where(F.col("__op") == "d").drop("__op"))

    def fingerprint(df):
        return df.agg(
            F.count(F.lit(1)).alias("n"), F.bit_xor(F.xxhash64(*(F.col(q(n)) for n in names))).alias("h")
        ).first()

    s, f = fingerprint(source), fingerprint(follower)
    verdict.source_rows, verdict.follower_rows = s["n"], f["n"]
    if s["n"] == f["n"] and s["h"] == f["h"] and not missing_cols:
        return verdict
    if not keys:
        return _multiset_differences(verdict, source, follower, names)
    on = [F.col(f"s.{q(k)}") == F.col(f"f.{q(k)}") for k in keys]
    joined = source.alias("s").join(follower.alias("f"), on=on, how="full_outer")
    s_present = F.col(f"s.{q(keys[0])}").isNotNull()
    f_present = F.col(f"f.{q(keys[0])}").isNotNull()
    same = F.lit(True)
    for n in names:
        same = same & F.col(f"s.{q(n)}").eqNullSafe(F.col(f"f.{q(n)}"))
    kind = F.when(~f_present, "missing").when(~s_present, "extra").when(~same, "different")
    diffs = joined.select(
        *(F.coalesce(F.col(f"s.{q(k)}"), F.col(f"f.{q(k)}")).alias(k) for k in keys), kind.alias("__kind")
    ).filter(F.col("__kind").isNotNull())
    if excused is not None:
        excused_keys = diffs.join(excused, on=keys, how="left_semi")
        verdict.excused = excused_keys.count()
        diffs = diffs.join(excused, on=keys, how="left_anti")
    for row in diffs.groupBy("__kind").count().collect():
        setattr(verdict, row["__kind"], row["count"])
    for row in diffs.limit(SAMPLE_KEYS).collect():
        key = ", ".join(f"{k}={row[k]!r}" for k in keys)
        verdict.samples.append(f"{row['__kind']}: {key}")
    return verdict


def _multiset_differences(
    verdict: TableVerdict, source: DataFrame, follower: DataFrame, names: list[str]
) -> TableVerdict:
    """A keyless table: rows compared as multisets (EXCEPT ALL both ways, NULLs equal); the first
    differing rows are named by their values with how many more (missing) or fewer (extra) copies."""
    missing, extra = source.exceptAll(follower), follower.exceptAll(source)
    verdict.missing, verdict.extra = missing.count(), extra.count()
    for kind, df in (("missing", missing), ("extra", extra)):
        for row in df.groupBy(*(q(n) for n in names)).count().limit(SAMPLE_KEYS).collect():
            values = ", ".join(f"{n}={row[n]!r}" for n in names)
            verdict.samples.append(f"{kind}: {row['count']} row(s) ({values})")
    return verdict
