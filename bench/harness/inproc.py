"""`cdc apply` in the bench process: an ApplyJob on this process's SparkSession (JVM start-up is
paid once, before anything is timed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MASTER = "local[2]"


def apply_job(pipe: Path, confs: dict[str, str] | None = None) -> tuple[Any, Any]:
    """(spark, ApplyJob) of the pipeline file; runtime SQL confs (e.g. spark.sql.shuffle.partitions)
    set first; the job's lines are log records (cdc/ground/logsetup.py), not shown here."""
    from pipelines.apply.job import ApplyJob
    from pipelines.spark import spark_session
    from sinks.registry import load_pipeline

    spark = spark_session(master=MASTER)
    for key, value in (confs or {}).items():
        spark.conf.set(key, value)
    return spark, ApplyJob(load_pipeline(pipe), spark)


def last_job_id(spark) -> int:
    """The id of the newest Spark job (ids count up from 0; cdc sets no job groups)."""
    return max(spark.sparkContext.statusTracker().getJobIdsForGroup(None), default=-1)


def job_names(spark, after: int, upto: int) -> list[str]:
    """The Spark jobs after id `after` up to `upto`: '<id> <name> (<stages> stages, <s> s)' each, from
    Spark's status store (the job list of the web UI), for `--steps`' profile of a batch."""
    store = spark.sparkContext._jsc.sc().statusStore()
    found = []
    for job_id in range(after + 1, upto + 1):
        try:
            data = store.job(job_id)
        except Exception:  # dropped from the store (spark.ui.retainedJobs)
            continue
        took = ""
        if data.submissionTime().isDefined() and data.completionTime().isDefined():
            took = f", {(data.completionTime().get().getTime() - data.submissionTime().get().getTime()) / 1000:.2f} s"
        described = data.description()
        what = described.get() if described.isDefined() else data.name()
        found.append(f"{job_id} {what[:160]} ({data.stageIds().size()} stages{took})")
    return found
