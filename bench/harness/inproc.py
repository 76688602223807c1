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
