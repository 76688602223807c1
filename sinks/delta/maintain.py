"""Upkeep of Delta follower tables (`cdc maintain`, docs/run-continuously.md): compaction, VACUUM and
a log checkpoint per table, safe beside a running `cdc apply`.

* OPTIMIZE bin-packs the small files each cut's MERGE leaves into few large ones (a commit
  with dataChange = false: the rows, and so every reader's results, stay the same).
* VACUUM deletes files no version within the retention still needs. The retention is never
  shorter than Delta's own safety default (7 days, 168 hours) unless the user asks for less, and
  never shorter than the age of the oldest cut readers may still pin (`keep_cuts`): time travel
  to a cut recorded in `_cdc_cuts` needs its versions' files.
* A checkpoint of `_delta_log` at the latest version, so readers (Spark, delta-rs) start from
  one Parquet file instead of replaying every JSON commit. Delta itself removes JSON commits
  older than `delta.logRetentionDuration` (30 days by default) at a checkpoint.

No lock is held: apply and maintenance meet through Delta's optimistic concurrency, and a
commit that loses a conflict is retried (sinks/delta/conflicts.py). Below the safety default
VACUUM could delete the files of a MERGE that has written them but not committed yet, so a
shorter retention must only be used while no `cdc apply` of the sink runs.
"""

from __future__ import annotations

import datetime as dt
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sinks.delta.conflicts import retry_conflicts
from sinks.delta.cuts import CUTS_DIR, cuts_path, list_cuts
from sinks.jvm import driver_jvm

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SAFE_RETENTION_HOURS = 168.0  # Delta's default delta.deletedFileRetentionDuration (1 week)
_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
_LISTING = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


@dataclass
class Files:
    """What a table holds on disk."""

    data: int  # Parquet data files on disk (live ones and those VACUUM has not removed yet)
    live: int  # data files of the latest version
    log_json: int  # JSON commits in _delta_log
    checkpoints: int  # checkpoint files in _delta_log

    def text(self) -> str:
        return (
            f"{self.data} data files ({self.live} live), "
            f"_delta_log {self.log_json} json + {self.checkpoints} checkpoint"
        )


@dataclass
class Maintained:
    table: str  # directory relative to the sink's path
    before: Files
    after: Files

    def line(self) -> str:
        return f"{self.table}: {self.before.text()} -> {self.after.text()}"


def delta_tables(base: Path) -> list[Path]:
    """Every Delta table under the sink's path (<schema>/<table>, renamed ones, `_cdc_cuts`)."""
    found = []
    for root, dirs, _files in os.walk(base):
        if "_delta_log" in dirs:
            found.append(Path(root))
            dirs.clear()  # a table's own directories hold no tables
        elif Path(root).relative_to(base).parts.__len__() >= 2:
            dirs.clear()
    return sorted(found)


def files_of(spark: SparkSession, path: Path) -> Files:
    from delta.tables import DeltaTable

    data = sum(
        1
        for root, dirs, files in os.walk(path)
        if "_delta_log" not in Path(root).relative_to(path).parts
        for f in files
        if f.endswith(".parquet")
    )
    log = [p.name for p in (path / "_delta_log").iterdir()]
    [detail] = DeltaTable.forPath(spark, str(path)).detail().collect()  # one row
    live = detail["numFiles"]
    return Files(
        data=data,
        live=int(live),
        log_json=sum(1 for n in log if n.endswith(".json")),
        checkpoints=sum(1 for n in log if ".checkpoint" in n and n.endswith(".parquet")),
    )


def retention_hours(
    spark: SparkSession,
    base: Path,
    retain_hours: float | None,
    keep_cuts: int,
    now: dt.datetime | None = None,
) -> float:
    """VACUUM's retention: the user's (default 168 h) but at least the age of the `keep_cuts`-th
    newest cut, so those cuts stay readable by time travel."""
    hours = SAFE_RETENTION_HOURS if retain_hours is None else retain_hours
    cuts = list_cuts(spark, base)
    if keep_cuts and cuts:
        oldest = cuts[min(keep_cuts, len(cuts)) - 1].applied_at
        now = now or dt.datetime.now(dt.UTC)
        hours = max(hours, (now - oldest).total_seconds() / 3600)
    return hours


def optimize(spark: SparkSession, path: Path) -> None:
    retry_conflicts(lambda: spark.sql(f"OPTIMIZE delta.`{path}`").collect())


def vacuum(spark: SparkSession, path: Path, hours: float) -> None:
    # RETAIN takes fractions of an hour: rounded up to 3.6 s, so nothing a kept cut needs goes
    text = str(max(0, math.ceil(hours * 1000) / 1000))
    below = hours < SAFE_RETENTION_HOURS
    if below:  # the user asked for less than Delta's safety default (pipelines/maintain.py says so)
        spark.conf.set(_CHECK, "false")
    # VACUUM lists the table's directories with this many tasks (Spark's default, 10000, is made
    # for huge partitioned tables: on a few cores the listing alone then takes minutes)
    listing = spark.conf.get(_LISTING, None)
    spark.conf.set(_LISTING, str(max(2, spark.sparkContext.defaultParallelism)))
    try:
        retry_conflicts(lambda: spark.sql(f"VACUUM delta.`{path}` RETAIN {text} HOURS").collect())
    finally:
        if below:
            spark.conf.unset(_CHECK)
        if listing is None:
            spark.conf.unset(_LISTING)
        else:
            spark.conf.set(_LISTING, listing)


def checkpoint(spark: SparkSession, path: Path) -> None:
    """A `_delta_log` checkpoint at the latest version (Delta's own, as every 10th commit makes)."""
    jvm = driver_jvm(spark)
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(path))
    none = jvm.scala.Option.empty()
    log.checkpoint(log.update(False, none, none), none)


def prune_cuts(spark: SparkSession, base: Path, hours: float) -> int:
    """Forget cuts older than the retention (their files may be gone): rows of `_cdc_cuts`."""
    from delta.tables import DeltaTable

    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(hours=hours)
    old = [c for c in list_cuts(spark, base)[1:] if c.applied_at < cutoff]  # the newest always stays
    by_log: dict[str, list[int]] = {}
    for c in old:
        by_log.setdefault(c.log_id, []).append(c.cut_id)
    if by_log:  # by id, not by time: no time zone to get wrong
        which = " OR ".join(
            f"(log_id = '{log}' AND cut_id IN ({', '.join(map(str, ids))}))" for log, ids in by_log.items()
        )
        retry_conflicts(lambda: DeltaTable.forPath(spark, cuts_path(base)).delete(which))
    return len(old)


def maintain_table(
    spark: SparkSession, base: Path, path: Path, hours: float, do_optimize: bool, do_vacuum: bool
) -> Maintained:
    before = files_of(spark, path)
    if do_optimize:
        optimize(spark, path)
    if do_vacuum:
        vacuum(spark, path, hours)
    checkpoint(spark, path)
    return Maintained(str(path.relative_to(base)), before, files_of(spark, path))


def is_cuts_table(base: Path, path: Path) -> bool:
    return path == base / CUTS_DIR
