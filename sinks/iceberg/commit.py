"""Exactly once per cut: the follower's position committed with the data, in the Iceberg snapshot.

The MERGE of a cut commits with snapshot summary properties `pgcdc.app-id` (the follower and its
log, Sink.app_id) and `pgcdc.cut` (the cut id). Iceberg's Spark writes add the properties that
`org.apache.iceberg.spark.CommitMetadata` holds for the committing thread (its thread-local, the
hook `CommitMetadata.withCommitProperties` sets); pyspark pins each Python thread to its own JVM
thread, so the properties set here go to the MERGE this thread runs next, and to nothing else.
Before a MERGE the sink reads the newest cut its app id committed to the table (`applied_cut`):
a replayed cut (a crash between the commit and the checkpoint) is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sinks.jvm import driver_jvm

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

APP_ID = "pgcdc.app-id"
CUT = "pgcdc.cut"


def _thread_local(spark: SparkSession) -> Any:
    jvm = driver_jvm(spark)
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()  # spark.jars' loader
    cls = jvm.java.lang.Class.forName("org.apache.iceberg.spark.CommitMetadata", True, loader)
    field = cls.getDeclaredField("COMMIT_PROPERTIES")
    field.setAccessible(True)
    return field.get(None)


@contextmanager
def snapshot_properties(spark: SparkSession, props: dict[str, str]) -> Iterator[None]:
    """Iceberg commits this thread makes inside the block carry `props` in their snapshot summary."""
    local = _thread_local(spark)
    values = driver_jvm(spark).java.util.HashMap()
    for key, value in props.items():
        values.put(key, value)
    local.set(values)
    try:
        yield
    finally:
        local.remove()


def applied_cut(spark: SparkSession, table: str, app_id: str) -> tuple[int | None, dict[str, str]]:
    """The newest cut `app_id` committed to `table` (a Spark identifier) and that snapshot's summary."""
    value = app_id.replace("\\", "\\\\").replace("'", "\\'")
    row = spark.sql(
        f"SELECT summary FROM {table}.snapshots WHERE summary['{APP_ID}'] = '{value}' "
        f"ORDER BY CAST(summary['{CUT}'] AS BIGINT) DESC LIMIT 1"
    ).first()
    if row is None:
        return None, {}
    return int(row["summary"][CUT]), dict(row["summary"])
