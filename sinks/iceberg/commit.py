"""Exactly once per cut: the follower's position committed with the data, in the Iceberg snapshot.

The MERGE of a cut commits with snapshot summary properties `pgcdc.app-id` (the follower and its
log, Sink.app_id) and `pgcdc.cut` (the cut id). Iceberg's Spark writes add the properties that
`org.apache.iceberg.spark.CommitMetadata` holds for the committing thread (its thread-local, the
hook `CommitMetadata.withCommitProperties` sets); pyspark pins each Python thread to its own JVM
thread, so the properties set here go to the MERGE this thread runs next, and to nothing else.
Before a MERGE the sink reads the newest cut its app id committed to the table's current state
(`applied_cut`, the ancestors of the current snapshot: position.py):
a replayed cut (a crash between the commit and the checkpoint) is skipped. The same cut is the
follower's position in its marker (sinks/marker.py): no marker commit per cut.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sinks.iceberg.position import APP_ID, CUT, follower_snapshot
from sinks.jvm import driver_jvm

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["APP_ID", "CUT", "applied_cut", "snapshot_properties"]


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


def applied_cut(
    spark: SparkSession, catalog: str, namespace: str, name: str, app_id: str
) -> tuple[int | None, dict[str, str]]:
    """The newest cut `app_id` committed to the table's current state and that snapshot's summary
    ((None, {}): none, or no such table), read from the table's metadata through the Iceberg Java
    API on the driver (no Spark job). Only the current snapshot's ancestors count (a rollback
    behind the tool leaves the rolled-back cuts' snapshots in the metadata, not in the table;
    position.py, which says what is read where the chain is cut by expired snapshots). The walk
    usually ends at the current snapshot, the cut's own MERGE: a few calls into the JVM."""
    from sinks.iceberg import jvm

    table = jvm.table(spark, catalog, namespace, name)
    if table is None:
        return None, {}
    current = table.currentSnapshot()

    def lookup(snapshot_id: int) -> tuple[int | None, Any] | None:
        snapshot = table.snapshot(snapshot_id)  # null once expired
        if snapshot is None:
            return None
        parent = snapshot.parentId()
        return (None if parent is None else int(parent)), snapshot.summary()

    def kept_newest_first() -> Iterator[tuple[int, Any]]:
        for snapshot in reversed(list(table.snapshots())):  # commit order
            yield int(snapshot.snapshotId()), snapshot.summary()

    found = follower_snapshot(
        None if current is None else int(current.snapshotId()), lookup, kept_newest_first, app_id
    )
    if found is None:
        return None, {}
    summary = {str(k): str(v) for k, v in dict(found[1]).items()}
    return int(summary[CUT]), summary
