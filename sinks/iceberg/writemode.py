"""Each Iceberg table's write mode (docs/follower-iceberg.md, write modes): the sink's
`write_mode`, or the table's own in `table_options`, held as the table properties
`write.merge.mode`, `write.update.mode` and `write.delete.mode` (what Spark's MERGE, UPDATE and
DELETE read). Set when the table is made; a changed setting is set on the existing table by an
ALTER of its properties (metadata only: no snapshot, no file rewritten, nothing rebuilt)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MODE_PROPERTIES = ("write.merge.mode", "write.update.mode", "write.delete.mode")


def write_properties(mode: str) -> dict[str, str]:
    return dict.fromkeys(MODE_PROPERTIES, mode)


def _lit(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def align_write_mode(spark: SparkSession, ident: str, mode: str) -> bool:
    """Set the table's write-mode properties to `mode` where they differ; True when any changed."""
    have = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES {ident}").collect()}
    wanted = write_properties(mode)
    if all(have.get(k) == v for k, v in wanted.items()):
        return False
    sets = ", ".join(f"{_lit(k)} = {_lit(v)}" for k, v in wanted.items())
    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ({sets})")
    return True
