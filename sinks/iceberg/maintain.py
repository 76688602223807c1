"""Upkeep of Iceberg follower tables (`cdc maintain`, docs/follower-iceberg.md, upkeep), through
Iceberg's Spark actions (the procedures' code, called without Iceberg's SQL extensions), safe
beside a running `cdc apply`.

Per table of the sink (the tables whose marker names this pipeline and sink):
* rewrite data files: small files bin-packed (groups of two or more), and every data file that
  position deletes point at rewritten without its deleted rows (what merge-on-read leaves after
  each cut); a commit that changes no row, with partial progress.
* rewrite position deletes: the delete files left are compacted, those of rewritten files dropped.
* expire snapshots: those older than the retention, except every snapshot a kept cut pins
  (`_cdc_cuts`, the `keep_cuts` newest and those younger than the retention) and the newest one
  carrying each follower's `pgcdc.cut` (a replay after a crash recognises its cut by it,
  sinks/iceberg/commit.py). Files no kept snapshot needs are deleted with them.
* remove orphan files: files under the table's location no metadata names, older than the
  retention (a write in progress has written files it has not committed yet: they are younger).

Cut records older than the retention (the newest kept) are forgotten first, as for Delta.
Conflicts with an apply's commits are retried (sinks/iceberg/conflicts.py).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sinks.iceberg import jvm
from sinks.iceberg.commit import APP_ID, CUT
from sinks.iceberg.conflicts import retry_conflicts
from sinks.iceberg.position import walk_to_follower

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sinks.delta.cuts import CutRecord

MARKER_PROPERTY = "cdc.follower"


@dataclass
class Files:
    data: int
    deletes: int
    snapshots: int

    def text(self) -> str:
        return f"{self.data} data files, {self.deletes} delete files, {self.snapshots} snapshots"


@dataclass
class Maintained:
    table: str  # namespace.table
    before: Files
    after: Files
    expired: int
    orphans: int

    def line(self) -> str:
        return (
            f"{self.table}: {self.before.text()} -> {self.after.text()}"
            f" ({self.expired} snapshot(s) expired, {self.orphans} orphan file(s) removed)"
        )


def follower_tables(spark: SparkSession, catalog: str, pipeline: str, sink: str) -> list[tuple[str, str]]:
    """(namespace, table) of the catalog's tables whose marker names this pipeline and sink (a
    shared catalog may hold others)."""
    found = []
    for ns, name in jvm.tables(spark, catalog):
        table = jvm.table(spark, catalog, ns, name)
        text = None if table is None else table.properties().get(MARKER_PROPERTY)
        try:
            marker = json.loads(text) if text else {}
        except ValueError:
            marker = {}
        if marker.get("pipeline") == pipeline and marker.get("sink") == sink:
            found.append((ns, name))
    return found


def files_of(table: Any) -> Files:
    current = table.currentSnapshot()
    summary = {} if current is None else jvm.summary(current)
    snapshots = sum(1 for _ in table.snapshots())
    return Files(
        int(summary.get("total-data-files", 0)), int(summary.get("total-delete-files", 0)), snapshots
    )


def protected(table: Any, pinned: set[int]) -> set[int]:
    """Snapshot ids expiry must keep: the pinned ones, the current one, and per follower (app id)
    every snapshot from the current one down to the follower's position (position.py: expiring
    one of them would cut the walk, and a table rolled back behind the tool would then look as if
    it held the rolled-back cuts again). Where that walk finds no position (the chain was cut
    before), the follower's newest snapshot with a cut, as its position is then read."""
    keep = set(pinned)
    current = table.currentSnapshot()
    current_id = None if current is None else int(current.snapshotId())
    if current_id is not None:
        keep.add(current_id)

    def lookup(snapshot_id: int) -> tuple[int | None, dict[str, str]] | None:
        snapshot = table.snapshot(snapshot_id)  # null once expired
        if snapshot is None:
            return None
        parent = snapshot.parentId()
        return (None if parent is None else int(parent)), jvm.summary(snapshot)

    newest: dict[str, tuple[int, int]] = {}
    for snap in table.snapshots():
        summary = jvm.summary(snap)
        if APP_ID in summary and CUT in summary:
            cut = (int(summary[CUT]), int(snap.snapshotId()))
            newest[summary[APP_ID]] = max(newest.get(summary[APP_ID], cut), cut)
    for app_id, (_cut, newest_id) in newest.items():
        walked = walk_to_follower(current_id, lookup, app_id)
        if walked.summary is not None:
            keep.update(walked.ids)
        elif walked.chain_cut:
            keep.add(newest_id)
    return keep


def expirable(table: Any, keep: set[int], cutoff_ms: int) -> list[int]:
    return [
        int(s.snapshotId())
        for s in table.snapshots()
        if int(s.timestampMillis()) < cutoff_ms and int(s.snapshotId()) not in keep
    ]


def _names(record: CutRecord, table: str) -> tuple[str, str]:
    from sinks.iceberg.cuts import identifier

    return identifier(record, table)


def maintain_table(
    spark: SparkSession,
    catalog: str,
    namespace: str,
    name: str,
    cuts: list[CutRecord],
    hours: float,
    do_optimize: bool,
    do_expire: bool,
    now: dt.datetime | None = None,
) -> Maintained:
    table = jvm.table(spark, catalog, namespace, name)
    key = f"{namespace}.{name}"
    before = files_of(table)
    actions = jvm.actions(spark)
    if do_optimize:
        retry_conflicts(
            lambda: (
                actions.rewriteDataFiles(jvm.table(spark, catalog, namespace, name))
                .option("min-input-files", "2")
                .option("delete-file-threshold", "1")
                .option("remove-dangling-deletes", "true")
                .option("partial-progress.enabled", "true")
                .execute()
            )
        )
        retry_conflicts(
            lambda: (
                actions.rewritePositionDeletes(jvm.table(spark, catalog, namespace, name))
                .option("min-input-files", "2")
                .option("partial-progress.enabled", "true")
                .execute()
            )
        )
    expired = orphans = 0
    if do_expire:
        now = now or dt.datetime.now(dt.UTC)
        cutoff_ms = int((now - dt.timedelta(hours=hours)).timestamp() * 1000)
        pinned = {c.versions[t] for c in cuts for t in c.versions if _names(c, t) == (namespace, name)}
        table = jvm.table(spark, catalog, namespace, name)
        ids = expirable(table, protected(table, pinned), cutoff_ms)
        if ids:

            def expire() -> Any:
                action = actions.expireSnapshots(jvm.table(spark, catalog, namespace, name))
                action = action.expireOlderThan(1)  # only the ids below: no age rule of the table's own
                for sid in ids:
                    action = action.expireSnapshotId(sid)
                return action.execute()

            retry_conflicts(expire)
            expired = len(ids)
        result = retry_conflicts(
            lambda: (
                actions.deleteOrphanFiles(jvm.table(spark, catalog, namespace, name))
                .olderThan(cutoff_ms)
                .execute()
            )
        )
        orphans = sum(1 for _ in result.orphanFileLocations())
    after = files_of(jvm.table(spark, catalog, namespace, name))
    return Maintained(key, before, after, expired, orphans)


def maintain_sink(
    spark: SparkSession,
    catalog: str,
    pipeline: str,
    sink: str,
    warehouse: str,
    hours: float,
    do_optimize: bool,
    do_expire: bool,
) -> None:
    """Every follower table of the sink; `hours` is the retention (the caller made it cover the
    cuts readers keep). Cut records older than it are forgotten first."""
    from sinks.delta.cuts import list_cuts
    from sinks.delta.maintain import prune_cuts

    tables = follower_tables(spark, catalog, pipeline, sink)
    if not tables:
        logger.info(f"sink {sink}: no Iceberg follower tables in catalog {catalog} yet")
        return
    logger.info(f"sink {sink}: {len(tables)} table(s) in catalog {catalog}; retention {hours:.3g} h")
    if do_expire:
        forgotten = prune_cuts(spark, warehouse, hours)  # type: ignore[arg-type]  # a URI too
        if forgotten:
            logger.info(f"sink {sink}: _cdc_cuts: {forgotten} cut(s) older than the retention forgotten")
    cuts = list_cuts(spark, warehouse)
    for namespace, name in tables:
        done = maintain_table(spark, catalog, namespace, name, cuts, hours, do_optimize, do_expire)
        logger.info(f"sink {sink}: {done.line()}")
