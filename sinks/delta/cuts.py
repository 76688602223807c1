"""Consistent reads at a cut: `_cdc_cuts`, a small Delta table at the sink's path (DESIGN.md §7).

Each table of a cut is its own Delta commit, so a reader of two live follower tables can see one
after cut N and the other before it: half of a source transaction. After a cut's rows and markers
are committed (and before the apply checkpoint records the cut), the sink appends one row to
`<path>/_cdc_cuts`:

    cut_id bigint, lsn bigint (the cut's commit LSN), lsn_text string ('0/16B3748'),
    log_id string, versions map<string, bigint> (every follower table -> its Delta version),
    paths map<string, string> (every follower table -> its directory under the sink's path),
    applied_at timestamp (UTC)

A cut applied again after a crash records nothing new: the apply job says when the cut is one an
earlier run started (its pending checkpoint), and only then is `_cdc_cuts` read for a row of that
cut and log. A first attempt is a plain blind append: a Delta idempotent write (txnAppId) would make
Delta rebuild the table's whole state just to look its transactions up, on every cut (three Spark
jobs, 1-3 s per cut on 2 cores). On a local path the row is written by delta-rs from the driver
(milliseconds; Spark took 0.5 s for the one row), elsewhere by Spark; the table is the same either
way, and a lake whose `_cdc_cuts` Spark wrote goes on with delta-rs appends. Reading every table at its version of one row
(time travel: Spark `versionAsOf`, delta-rs `DeltaTable(path, version=...)`) gives all tables as of
the same cut. The latest row is the latest complete cut. A table the follower clears for a rebuild
starts its Delta versions over, so the rows naming it are deleted (`forget_table`): no cut before
the rebuild can be read any more.

Spark readers: `read_at_cut`, `views_at_cut`; readers without a JVM: `read_at_cut_arrow`,
`tables_at_cut_arrow`, `list_cuts_arrow` (and `cdc sql`, pipelines/lakesql_df.py).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc.ground.errors import UsageError
from cdc.ground.formats import DELTA_CUTS, VERSION, check_version
from cdc.ground.lsn import format_lsn
from cdc.ground.tables import TableName
from sinks.delta.arrowread import read_delta
from sinks.delta.paths import table_path

if TYPE_CHECKING:
    import pyarrow
    from pyspark.sql import DataFrame, SparkSession

CUTS_DIR = "_cdc_cuts"
# `format`/`cdc_version` (cdc/ground/formats.py DELTA_CUTS) came with 0.2.0: rows of 0.1.0 have
# them null (format 0, the same columns otherwise); the first append adds them (mergeSchema).
_DDL = (
    "cut_id bigint, lsn bigint, lsn_text string, log_id string, versions map<string, bigint>, "
    "paths map<string, string>, applied_at timestamp, format int, cdc_version string"
)


@dataclass(frozen=True)
class CutRecord:
    """One row of `_cdc_cuts`: the follower's tables (as 'schema.table') and their Delta versions."""

    cut_id: int
    lsn: int
    log_id: str
    versions: dict[str, int]
    paths: dict[str, str]  # relative to the sink's path
    applied_at: dt.datetime

    def describe(self) -> str:
        return f"cut {self.cut_id} ({format_lsn(self.lsn)}, applied {self.applied_at:%Y-%m-%d %H:%M:%S})"


def cuts_path(base: str | Path) -> str:
    if "://" in str(base):  # a URI (an Iceberg warehouse on an object store): Path would drop a slash
        return str(base).rstrip("/") + "/" + CUTS_DIR
    return str(Path(base) / CUTS_DIR)


def _record(r: dict[str, Any]) -> CutRecord:
    # a row a newer cdc wrote in a format this one cannot read: FormatTooNew (exit 5)
    where = f"cut {r.get('cut_id')} in {CUTS_DIR}"
    check_version(DELTA_CUTS, r.get("format"), where, r.get("cdc_version"))
    versions = dict(r["versions"])
    paths = dict(r.get("paths") or {})
    return CutRecord(int(r["cut_id"]), int(r["lsn"]), r["log_id"], versions, paths, utc(r["applied_at"]))


def utc(when: dt.datetime) -> dt.datetime:
    """An aware UTC time: Spark collects timestamps as naive local times, delta-rs as aware ones."""
    return when.astimezone(dt.UTC)


def table_dir(base: str | Path, record: CutRecord, table: str) -> str:
    """The table's directory as the cut recorded it (a sink may rename a table's directory)."""
    rel = record.paths.get(table)
    return str(Path(base) / rel) if rel else str(table_path(Path(base), TableName.parse(table)))


# ---- writing (the delta sink) ---------------------------------------------------------------------
def table_version(spark: SparkSession, path: str) -> int | None:
    """The table's latest Delta version (None: no table there), without a Spark job."""
    from delta.tables import DeltaTable

    from sinks.delta.snapshot import table_version as latest_version

    if not DeltaTable.isDeltaTable(spark, path):
        return None
    return latest_version(spark, path)


def record_cut(
    spark: SparkSession,
    base: str | Path,
    log_id: str,
    cut_id: int,
    lsn: int,
    versions: dict[str, int],
    paths: dict[str, str],
    again: bool = True,
) -> None:
    """Append the cut's row. `again`: an earlier run may have recorded this cut already (it crashed
    before its checkpoint said so): the row is appended only if `_cdc_cuts` has none of this cut
    and log. The apply job passes False for a cut no run had started (no pending checkpoint).

    On a local path the row is written with delta-rs from the driver: a few milliseconds where a
    Spark append costs 0.5 s per cut and sink (two Spark jobs for one row). Elsewhere (object
    stores, whose credentials live in Spark's Hadoop configuration) Spark writes it."""
    path = cuts_path(base)
    now = dt.datetime.now(dt.UTC)  # aware: Spark stores the instant whatever its time zone
    row = (cut_id, lsn, format_lsn(lsn), log_id, versions, paths, now, DELTA_CUTS.version, VERSION)
    if _local(path):
        if again and any(r["cut_id"] == cut_id and r["log_id"] == log_id for r in _rows_arrow(base)):
            return
        _append_arrow(path, row)
        return
    if again and _recorded(spark, path, log_id, cut_id):
        return
    frame = spark.createDataFrame([row], _DDL)
    frame.write.format("delta").mode("append").option("mergeSchema", "true").save(path)


def _local(path: str) -> bool:
    return "://" not in path or path.startswith("file:")


def _arrow_schema() -> pyarrow.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("cut_id", pa.int64()),
            ("lsn", pa.int64()),
            ("lsn_text", pa.string()),
            ("log_id", pa.string()),
            ("versions", pa.map_(pa.string(), pa.int64())),
            ("paths", pa.map_(pa.string(), pa.string())),
            ("applied_at", pa.timestamp("us", tz="UTC")),
            ("format", pa.int32()),
            ("cdc_version", pa.string()),
        ]
    )


def _append_arrow(path: str, row: tuple) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    schema = _arrow_schema()
    columns = [
        pa.array([list(v.items()) if isinstance(v, dict) else v], type=f.type)
        for v, f in zip(row, schema, strict=True)
    ]
    # schema_mode merge: a table 0.1.0 created (without format/cdc_version) gains them
    write_deltalake(
        path.removeprefix("file:"), pa.table(columns, schema=schema), mode="append", schema_mode="merge"
    )


def _recorded(spark: SparkSession, path: str, log_id: str, cut_id: int) -> bool:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    if not DeltaTable.isDeltaTable(spark, path):
        return False
    rows = spark.read.format("delta").load(path)
    return bool(rows.where((F.col("cut_id") == cut_id) & (F.col("log_id") == log_id)).limit(1).count())


def forget_table(spark: SparkSession, base: str | Path, table: TableName) -> None:
    """The table is cleared for a rebuild (its versions start over): no recorded cut reads it right."""
    from delta.tables import DeltaTable

    path = cuts_path(base)
    if DeltaTable.isDeltaTable(spark, path):
        name = str(table).replace("'", "\\'")
        DeltaTable.forPath(spark, path).delete(f"element_at(versions, '{name}') IS NOT NULL")


# ---- reading with Spark ---------------------------------------------------------------------------
def _pick(rows: list[dict[str, Any]], base: str | Path, cut: int | None) -> CutRecord:
    """The latest recorded cut, or cut `cut` (the latest such id: ids start over with a new log)."""
    if cut is not None:
        rows = [r for r in rows if r["cut_id"] == cut]
    if not rows:
        what = "no cut is recorded" if cut is None else f"cut {cut} is not recorded"
        raise UsageError(
            f"{cuts_path(base)}: {what} (or its tables were rebuilt since, or `cdc maintain` let it go)",
            "run `cdc apply` (each applied cut is recorded); `cdc sql ... --cut` takes a cut id listed by `cdc sql --cuts`",
        )
    return max((_record(r) for r in rows), key=lambda c: (c.applied_at, c.cut_id))


def list_cuts(spark: SparkSession, base: str | Path) -> list[CutRecord]:
    """Every recorded cut, newest first."""
    from delta.tables import DeltaTable

    path = cuts_path(base)
    if not DeltaTable.isDeltaTable(spark, path):
        return []
    cuts = [_record(r.asDict()) for r in spark.read.format("delta").load(path).collect()]
    return sorted(cuts, key=lambda c: (c.applied_at, c.cut_id), reverse=True)


def cut_record(spark: SparkSession, base: str | Path, cut: int | None = None) -> CutRecord:
    from delta.tables import DeltaTable

    path = cuts_path(base)
    rows = []
    if DeltaTable.isDeltaTable(spark, path):
        rows = [r.asDict() for r in spark.read.format("delta").load(path).collect()]
    return _pick(rows, base, cut)


def read_at_cut(
    spark: SparkSession, base: str | Path, table: str | TableName, cut: int | None = None
) -> DataFrame:
    """One follower table as of the latest complete cut (or cut `cut`): Delta time travel to the
    version `_cdc_cuts` recorded. Read every table of a query through the same cut."""
    record = cut_record(spark, base, cut)
    return _at(spark, base, record, table)


def _at(spark: SparkSession, base: str | Path, record: CutRecord, table: str | TableName) -> DataFrame:
    key = str(table if isinstance(table, TableName) else TableName.parse(table))
    if key not in record.versions:
        raise UsageError(
            f"{record.describe()} has no table {key} (tables: {', '.join(sorted(record.versions)) or 'none'})",
            "name a table the follower has, as schema.table",
        )
    version = record.versions[key]
    return spark.read.format("delta").option("versionAsOf", version).load(table_dir(base, record, key))


def view_names(tables: list[str]) -> dict[str, str]:
    """Temp view name per table: the table's name, or schema_table when two schemas share it."""
    parsed = {t: TableName.parse(t) for t in tables}
    counts: dict[str, int] = {}
    for name in parsed.values():
        counts[name.name] = counts.get(name.name, 0) + 1
    return {t: n.name if counts[n.name] == 1 else f"{n.schema}_{n.name}" for t, n in parsed.items()}


def views_at_cut(
    spark: SparkSession, base: str | Path, cut: int | None = None
) -> tuple[CutRecord, dict[str, str]]:
    """A temp view per follower table as of one cut (latest by default), named like the source
    table (`orders`; `sales_orders` when two schemas have an `orders`). Returns the cut and
    {schema.table: view name}."""
    record = cut_record(spark, base, cut)
    names = view_names(sorted(record.versions))
    for table, view in names.items():
        _at(spark, base, record, table).createOrReplaceTempView(view)
    return record, names


# ---- reading without Spark (delta-rs) --------------------------------------------------------------
def _rows_arrow(base: str | Path) -> list[dict[str, Any]]:
    path = cuts_path(base)
    try:
        rows = read_delta(path).to_pylist()
    except Exception as exc:  # deltalake raises TableNotFoundError for a missing table
        if type(exc).__name__ != "TableNotFoundError":
            raise
        rows = []
    for r in rows:  # delta-rs gives maps as lists of (key, value)
        r["versions"] = dict(r["versions"])
        r["paths"] = dict(r.get("paths") or {})
    return rows


def cut_record_arrow(base: str | Path, cut: int | None = None) -> CutRecord:
    """`cut_record` read with delta-rs (the `deltalake` package), no JVM."""
    return _pick(_rows_arrow(base), base, cut)


def list_cuts_arrow(base: str | Path) -> list[CutRecord]:
    """`list_cuts` read with delta-rs, no JVM: every recorded cut, newest first."""
    cuts = [_record(r) for r in _rows_arrow(base)]
    return sorted(cuts, key=lambda c: (c.applied_at, c.cut_id), reverse=True)


def read_at_cut_arrow(base: str | Path, table: str | TableName, cut: int | None = None) -> pyarrow.Table:
    """One follower table at the latest complete cut (or cut `cut`) with delta-rs:
    `DeltaTable(path, version=<the cut's version>)`. For several tables, take one `cut_record_arrow`
    and open each at `record.versions[table]` (or pass the same `cut`)."""
    record = cut_record_arrow(base, cut)
    key = str(table if isinstance(table, TableName) else TableName.parse(table))
    if key not in record.versions:
        raise UsageError(
            f"{record.describe()} has no table {key}", "name a table the follower has, as schema.table"
        )
    return read_delta(table_dir(base, record, key), record.versions[key])


def tables_at_cut_arrow(
    base: str | Path, cut: int | None = None
) -> tuple[CutRecord, dict[str, pyarrow.Table]]:
    """Every follower table at one cut (latest by default) with delta-rs: (the cut, {schema.table: rows})."""
    record = cut_record_arrow(base, cut)
    return record, {t: read_delta(table_dir(base, record, t), v) for t, v in sorted(record.versions.items())}
