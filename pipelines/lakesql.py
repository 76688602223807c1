"""`cdc sql PIPELINE "SELECT ..." [--sink NAME] [--cut N] [--engine auto|datafusion|polars|spark]`:
SQL over a Delta or Iceberg follower's tables, every table as of the same applied cut (the latest
complete one by default), read through `_cdc_cuts` (sinks/delta/cuts.py: Delta versions;
sinks/iceberg/cuts.py: Iceberg snapshot ids). Tables answer to their source names, qualified or
bare (pipelines/lakenames.py); columns to their stored names, and the header gives a column stored
encoded its source name (sinks/delta/names.py).

Engines without a JVM: DataFusion for Delta (pipelines/lakesql_df.py, about a second), Polars over
pyiceberg for Iceberg (pipelines/lakesql_polars.py); `auto` runs the query there and hands one that
engine cannot open, plan or run to Spark (a note on stderr says why); `--engine spark` always uses
Spark (Spark SQL semantics, a JVM start: tens of seconds)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc.ground.config import Pipeline, SinkConfig
from cdc.ground.errors import UsageError
from pipelines.lakenames import spark_query, spark_views
from sinks.delta.cuts import CutRecord, cut_record_arrow, list_cuts_arrow, table_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENGINES = ("auto", "datafusion", "polars", "spark")
LAKE_KINDS = ("delta", "iceberg")
NO_JVM = {"delta": "datafusion", "iceberg": "polars"}  # the engine without a JVM per follower kind


def lake_sink(pipeline: Pipeline, name: str | None, engine: str = "auto") -> SinkConfig:
    """The named sink, which must be a delta or iceberg one, or the pipeline's first of those; the
    engine must be one that reads it."""
    if name:
        cfg = pipeline.sink(name)
        if cfg.kind not in LAKE_KINDS:
            raise UsageError(
                f"sink {name!r} is a {cfg.kind} sink, not a delta or iceberg sink",
                "name a delta or iceberg sink with --sink",
            )
    else:
        found = [s for s in pipeline.sinks if s.kind in LAKE_KINDS]
        if not found:
            raise UsageError(
                f"pipeline {pipeline.name} has no delta or iceberg sink",
                "add a sink with `delta: {path: ...}` or `iceberg: {warehouse: ...}`",
            )
        cfg = found[0]
    if engine in NO_JVM.values() and engine != NO_JVM[cfg.kind]:
        raise UsageError(
            f"--engine {engine} does not read {cfg.kind} followers (sink {cfg.name})",
            f"--engine {NO_JVM[cfg.kind]} or --engine spark (or leave --engine out)",
        )
    return cfg


def _value(v: Any) -> Any:
    return v if v is None or isinstance(v, int | float | str | bool) else str(v)


def run_sql(
    pipeline: Pipeline,
    spark: Callable[[], SparkSession],
    query: str | None,
    sink_name: str | None,
    cut: int | None,
    limit: int,
    as_json: bool,
    list_only: bool,
    out: Callable[[str], None],
    note: Callable[[str], None],
    engine: str = "auto",
) -> int:
    """`spark` starts (or returns) the session: called only when Spark runs the query."""
    cfg = lake_sink(pipeline, sink_name, engine)
    if cfg.kind == "iceberg":
        from sinks.iceberg.catalog import warehouse
        from sinks.iceberg.settings import iceberg_settings

        base: str | Path = warehouse(iceberg_settings(cfg), pipeline)
    else:
        from sinks.delta.settings import delta_settings

        base = pipeline.path(delta_settings(cfg).path)
    if list_only:  # the cut records are read with delta-rs whatever the engine
        for record in list_cuts_arrow(base):
            tables = ", ".join(f"{t}@{v}" for t, v in sorted(record.versions.items()))
            out(f"{record.describe()}: {tables}")
        return 0
    if not query:
        raise UsageError(
            "no query given", f'`{pipeline.command("sql")} "SELECT ..."` (or --cuts to list the cuts)'
        )
    record = cut_record_arrow(base, cut)
    tables = ", ".join(sorted(record.versions))
    columns: list[str] | None = None
    rows: list[tuple[Any, ...]] = []
    if cfg.kind == "iceberg":
        if engine != "spark":
            columns, rows = _polars_rows(pipeline, cfg, record, query, limit, engine, note)
    elif engine != "spark":
        from pipelines.lakesql_df import DataFusionRefused, query_at_cut

        try:
            columns, rows = query_at_cut(base, record, query, limit)
            note(f"-- sink {cfg.name}: {record.describe()}; engine datafusion; tables: {tables}")
        except DataFusionRefused as exc:
            if engine == "datafusion" or exc.missing_table:
                raise UsageError(
                    f"DataFusion refused the query: {exc}",
                    f"tables: {tables} (schema.table, or the bare name; quote capitals and spaces "
                    '"like this"); `--engine spark` runs Spark SQL',
                ) from None
            note(f"-- DataFusion cannot run it ({exc}); running it on Spark")
    if columns is None:
        if cfg.kind == "iceberg":
            columns, rows = _spark_iceberg_rows(spark(), pipeline, cfg, record, query, limit)
        else:
            columns, rows = _spark_rows(spark(), base, record, query, limit)
        views = spark_views(record.versions)
        note(
            f"-- sink {cfg.name}: {record.describe()}; engine spark; views: "
            + ", ".join(f"{v} = {t}" for t, v in views.items())
        )
    if as_json:
        for row in rows:
            out(json.dumps({k: _value(v) for k, v in zip(columns, row, strict=True)}, ensure_ascii=False))
        return 0
    out("\t".join(columns))
    for row in rows:
        out("\t".join("NULL" if v is None else str(v) for v in row))
    return 0


def _polars_rows(
    pipeline: Pipeline,
    cfg: SinkConfig,
    record: CutRecord,
    query: str,
    limit: int,
    engine: str,
    note: Callable[[str], None],
) -> tuple[list[str] | None, list[tuple[Any, ...]]]:
    """The query on Polars over pyiceberg; (None, []) when `auto` should hand it to Spark."""
    from pipelines.lakesql_polars import PolarsRefused, query_at_cut
    from sinks.iceberg.catalog import pyiceberg_catalog

    tables = ", ".join(sorted(record.versions))
    try:
        catalog = pyiceberg_catalog(cfg, pipeline)
    except ValueError as exc:  # a JDBC catalog on a database pyiceberg cannot open
        if engine == "polars":
            raise UsageError(f"sink {cfg.name}: {exc}", "`--engine spark` reads it through Spark") from None
        note(f"-- {exc}; running it on Spark")
        return None, []
    try:
        columns, rows = query_at_cut(catalog, record, query, limit)
    except PolarsRefused as exc:
        if engine == "polars" or exc.missing_table:
            raise UsageError(
                f"Polars refused the query: {exc}",
                f"tables: {tables} (schema.table, or the bare name; names are case-sensitive); "
                "`--engine spark` runs Spark SQL",
            ) from None
        note(f"-- Polars cannot run it ({exc}); running it on Spark")
        return None, []
    note(f"-- sink {cfg.name}: {record.describe()}; engine polars; tables: {tables}")
    return columns, rows


def _spark_iceberg_rows(
    spark: SparkSession, pipeline: Pipeline, cfg: SinkConfig, record: CutRecord, query: str, limit: int
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The query on Spark over the Iceberg tables at the cut's snapshots."""
    from sinks.iceberg.catalog import register
    from sinks.iceberg.cuts import spark_at_cut

    name = register(spark, cfg, pipeline)
    return _run_spark(spark, record, query, limit, lambda table: spark_at_cut(spark, name, record, table))


def _spark_rows(
    spark: SparkSession, base: str | Path, record: CutRecord, query: str, limit: int
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The query on Spark: a temp view per Delta table at the cut's version."""

    def frame(table: str):
        version = record.versions[table]
        return spark.read.format("delta").option("versionAsOf", version).load(table_dir(base, record, table))

    return _run_spark(spark, record, query, limit, frame)


def _run_spark(
    spark: SparkSession, record: CutRecord, query: str, limit: int, frame: Callable[[str], Any]
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """A temp view per table (`frame` reads it at the cut), table names rewritten, the query run."""
    from pipelines.lakesql_df import source_header

    views = spark_views(record.versions)
    fields: dict[str, Any] = {}
    for table, view in views.items():
        df = frame(table)
        df.createOrReplaceTempView(view)
        fields.update((f.name, f.metadata) for f in df.schema.fields if f.metadata.get("comment"))
    try:
        df = spark.sql(spark_query(query, views))
    except Exception as exc:  # a bad query is the user's input: exit 2 with Spark's own first line
        if type(exc).__name__ not in ("AnalysisException", "ParseException"):
            raise
        first = str(exc).strip().splitlines()[0][:500]
        raise UsageError(
            f"Spark SQL refused the query: {first}",
            "views: "
            + ", ".join(f"{v} = {t}" for t, v in views.items())
            + " (schema.table works too; quote names with `backticks` in Spark SQL)",
        ) from None
    return source_header(list(df.columns), fields), [tuple(r) for r in df.limit(limit).collect()]
