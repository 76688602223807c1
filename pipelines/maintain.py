"""`cdc maintain PIPELINE [--sink NAME]`: compaction, VACUUM and log checkpoints of the Delta
followers' tables (sinks/delta/maintain.py); data and delete file rewrites, snapshot expiry and
orphan removal of the Iceberg followers' tables (sinks/iceberg/maintain.py); beside a running
`cdc apply` (no lock taken)."""

from __future__ import annotations

import logging

from pyspark.sql import SparkSession

from cdc.ground.config import Pipeline, SinkConfig
from cdc.ground.errors import UsageError
from sinks.delta.maintain import (
    SAFE_RETENTION_HOURS,
    delta_tables,
    is_cuts_table,
    maintain_table,
    prune_cuts,
    retention_hours,
)
from sinks.delta.settings import delta_settings

logger = logging.getLogger(__name__)

MAINTAINED = ("delta", "iceberg")


def lake_sinks(pipeline: Pipeline, sink_names: list[str] | None) -> list[SinkConfig]:
    """The named sinks (each must be a delta or iceberg one), or every such sink of the pipeline."""
    sinks = (
        [pipeline.sink(n) for n in sink_names]
        if sink_names
        else [s for s in pipeline.sinks if s.kind in MAINTAINED]
    )
    if not sinks:
        raise UsageError(
            f"pipeline {pipeline.name} has no delta or iceberg sink",
            "add one under `sinks:` in the pipeline file",
        )
    for cfg in sinks:
        if cfg.kind not in MAINTAINED:
            raise UsageError(
                f"sink {cfg.name} is a {cfg.kind} follower; cdc maintain looks after Delta and Iceberg followers",
                "name a delta or iceberg sink with --sink",
            )
    return sinks


def run_maintain(
    pipeline: Pipeline,
    spark: SparkSession,
    sink_names: list[str] | None,
    retain_hours: float | None,
    keep_cuts: int,
    do_optimize: bool,
    do_vacuum: bool,
) -> int:
    sinks = lake_sinks(pipeline, sink_names)
    if retain_hours is not None and retain_hours < SAFE_RETENTION_HOURS:
        logger.info(
            f"note: --retain-hours {retain_hours:g} is below Delta's safety default ({SAFE_RETENTION_HOURS:g} h): "
            "run it only while no `cdc apply` of these sinks runs (VACUUM and Iceberg's orphan file removal "
            "could delete files a MERGE has written but not committed yet), and readers lose time travel past it"
        )
    for cfg in sinks:
        if cfg.kind == "iceberg":
            _maintain_iceberg(pipeline, spark, cfg, retain_hours, keep_cuts, do_optimize, do_vacuum)
            continue
        base = pipeline.path(delta_settings(cfg).path)
        tables = delta_tables(base) if base.is_dir() else []
        if not tables:
            logger.info(f"sink {cfg.name}: no Delta tables under {base} yet")
            continue
        hours = retention_hours(spark, base, retain_hours, keep_cuts)
        logger.info(f"sink {cfg.name}: {len(tables)} table(s) under {base}; VACUUM retention {hours:.3g} h")
        totals = [0, 0, 0, 0]
        for path in tables:
            if is_cuts_table(base, path) and do_vacuum:
                forgotten = prune_cuts(spark, base, hours)
                if forgotten:
                    logger.info(
                        f"sink {cfg.name}: _cdc_cuts: {forgotten} cut(s) older than the retention forgotten"
                    )
            done = maintain_table(spark, base, path, hours, do_optimize, do_vacuum)
            logger.info(f"sink {cfg.name}: {done.line()}")
            totals[0] += done.before.data
            totals[1] += done.after.data
            totals[2] += done.before.log_json
            totals[3] += done.after.log_json
        logger.info(
            f"sink {cfg.name}: data files {totals[0]} -> {totals[1]}, _delta_log json files {totals[2]} -> {totals[3]}"
        )
    return 0


def _maintain_iceberg(
    pipeline: Pipeline,
    spark: SparkSession,
    cfg: SinkConfig,
    retain_hours: float | None,
    keep_cuts: int,
    do_optimize: bool,
    do_expire: bool,
) -> None:
    from sinks.iceberg.catalog import register, warehouse
    from sinks.iceberg.maintain import maintain_sink
    from sinks.iceberg.settings import iceberg_settings

    catalog = register(spark, cfg, pipeline)
    where = warehouse(iceberg_settings(cfg), pipeline)
    hours = retention_hours(spark, where, retain_hours, keep_cuts)  # type: ignore[arg-type]
    maintain_sink(spark, catalog, pipeline.name, cfg.name, where, hours, do_optimize, do_expire)
