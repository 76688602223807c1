"""Consistent reads at a cut for Iceberg followers: each applied cut recorded with every follower
table's Iceberg snapshot id (docs/follower-iceberg.md, reads at a cut).

Each table of a cut is its own Iceberg commit, so a reader of two live tables can see one after
cut N and the other before it. After a cut's rows and markers are committed (and before the
apply checkpoint records the cut), the sink appends one row to `<warehouse>/_cdc_cuts`: the same
small Delta table, in the same format, the Delta follower keeps (sinks/delta/cuts.py), with
`versions` = each table's current snapshot id (-1: the table has no snapshot yet, it is empty)
and `paths` = each table's name in its namespace (the source schema; a rename included). The
row costs no Spark job: the snapshot ids come from the tables' metadata through Iceberg's Java
API, and on a local warehouse delta-rs appends the row from the driver.

Reading every table at its snapshot of one row (pyiceberg `scan(snapshot_id=...)`, Polars
`scan_iceberg(..., snapshot_id=...)`, Spark `spark.read.option("snapshot-id", ...)`) gives all
tables as of the same cut; the latest row is the latest complete cut. A table the follower drops
and makes again (a rebuild) has no snapshot of an earlier cut: the rows naming it are deleted.
Readers: `tables_at_cut` / `scans_at_cut` (pyiceberg, no JVM) and `cdc sql`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName
from cdc.ground.tables import spark_ident as q
from sinks.delta.cuts import CutRecord, cut_record_arrow, list_cuts_arrow

if TYPE_CHECKING:
    import pyarrow
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import DataScan, Table
    from pyspark.sql import DataFrame, SparkSession

NO_SNAPSHOT = -1  # the table existed at the cut with no snapshot: no rows


# ---- writing (the iceberg sink) --------------------------------------------------------------------
def snapshot_id(spark: SparkSession, catalog: str, namespace: str, name: str) -> int | None:
    """The table's current snapshot id (NO_SNAPSHOT: none yet; None: no such table), read from its
    metadata through the session's Iceberg catalog."""
    from sinks.iceberg.jvm import table

    found = table(spark, catalog, namespace, name)
    if found is None:
        return None
    current = found.currentSnapshot()
    return NO_SNAPSHOT if current is None else int(current.snapshotId())


# ---- reading ---------------------------------------------------------------------------------------
def cut_record(warehouse: str | Path, cut: int | None = None) -> CutRecord:
    """The latest complete cut (or cut `cut`) recorded under the warehouse, read with delta-rs."""
    return cut_record_arrow(warehouse, cut)


def list_cuts(warehouse: str | Path) -> list[CutRecord]:
    """Every recorded cut, newest first (delta-rs)."""
    return list_cuts_arrow(warehouse)


def identifier(record: CutRecord, table: str) -> tuple[str, str]:
    """(namespace, table name) of the table in the catalog, as the cut recorded it."""
    name = TableName.parse(table)
    return name.schema, record.paths.get(table) or name.name


def _key(record: CutRecord, table: str | TableName) -> str:
    key = str(table if isinstance(table, TableName) else TableName.parse(table))
    if key not in record.versions:
        raise UsageError(
            f"{record.describe()} has no table {key} (tables: {', '.join(sorted(record.versions)) or 'none'})",
            "name a table the follower has, as schema.table",
        )
    return key


def scans_at_cut(
    catalog: Catalog, warehouse: str | Path, cut: int | None = None
) -> tuple[CutRecord, dict[str, tuple[Table, DataScan]]]:
    """Every follower table at one cut (latest by default) with pyiceberg, lazily: (the cut,
    {schema.table: (the pyiceberg table, its scan pinned at the cut's snapshot)}). Filter or select
    on the scans (`scan.filter(...)`, `scan.select(...)`) before reading them; for Polars:
    `pl.scan_iceberg(table, snapshot_id=record.versions[name])`.

    `catalog` is the sink's catalog opened in pyiceberg under the sink's name (docs/follower-iceberg.md, reading); `warehouse` the sink's warehouse directory (where `_cdc_cuts` is)."""
    record = cut_record(warehouse, cut)
    out = {}
    for name in sorted(record.versions):
        table = catalog.load_table(identifier(record, name))
        out[name] = (table, _scan(table, record.versions[name]))
    return record, out


def _scan(table: Table, snapshot: int) -> DataScan:
    if snapshot == NO_SNAPSHOT:
        from pyiceberg.expressions import AlwaysFalse

        return table.scan(row_filter=AlwaysFalse())
    return table.scan(snapshot_id=snapshot)


def tables_at_cut(
    catalog: Catalog, warehouse: str | Path, cut: int | None = None
) -> tuple[CutRecord, dict[str, pyarrow.Table]]:
    """Every follower table at one cut (latest by default) read with pyiceberg, no JVM:
    (the cut, {schema.table: its rows as a pyarrow Table})."""
    record, scans = scans_at_cut(catalog, warehouse, cut)
    return record, {name: scan.to_arrow() for name, (_table, scan) in scans.items()}


def read_at_cut(
    catalog: Catalog, warehouse: str | Path, table: str | TableName, cut: int | None = None
) -> pyarrow.Table:
    """One follower table at the latest complete cut (or cut `cut`) with pyiceberg. For several
    tables take `tables_at_cut` (or pass the same `cut`): two calls without one may see two cuts."""
    record = cut_record(warehouse, cut)
    key = _key(record, table)
    return _scan(catalog.load_table(identifier(record, key)), record.versions[key]).to_arrow()


def spark_at_cut(spark: SparkSession, catalog: str, record: CutRecord, table: str) -> DataFrame:
    """One table of the cut in Spark (the sink's catalog registered in the session)."""
    key = _key(record, table)
    ident = ".".join(q(part) for part in (catalog, *identifier(record, key)))
    snapshot = record.versions[key]
    if snapshot == NO_SNAPSHOT:
        return spark.table(ident).limit(0)
    return spark.sql(f"SELECT * FROM {ident} VERSION AS OF {snapshot}")
