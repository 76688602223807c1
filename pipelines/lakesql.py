"""`cdc sql PIPELINE "SELECT ..." [--sink NAME] [--cut N] [--engine auto|datafusion|spark]`: SQL
over a Delta follower's tables, every table as of the same applied cut (the latest complete one by
default), read through `_cdc_cuts` (sinks/delta/cuts.py). Tables answer to their source names,
qualified or bare (pipelines/lakenames.py); columns to their stored names, and the header gives a
column stored encoded its source name (sinks/delta/names.py).

Engines: DataFusion (pipelines/lakesql_df.py, no JVM, about a second) runs the query by default;
`auto` hands a query DataFusion cannot open, plan or run to Spark (a note on stderr says why),
`--engine spark` always uses Spark (Spark SQL semantics, a JVM start: tens of seconds)."""

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

ENGINES = ("auto", "datafusion", "spark")


def delta_sink(pipeline: Pipeline, name: str | None) -> SinkConfig:
    """The named sink, which must be a delta one, or the pipeline's first delta sink."""
    return pipeline.sink_of_kind("delta", name, "delta: {path: ...}")


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
    cfg = delta_sink(pipeline, sink_name)
    base = pipeline.path(cfg.settings.path)
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
    columns, rows = None, []
    if engine != "spark":
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


def _spark_rows(
    spark: SparkSession, base: str | Path, record: CutRecord, query: str, limit: int
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The query on Spark: a temp view per table at the cut's version, table names rewritten."""
    from pipelines.lakesql_df import source_header

    views = spark_views(record.versions)
    fields: dict[str, Any] = {}
    for table, view in views.items():
        version = record.versions[table]
        df = spark.read.format("delta").option("versionAsOf", version).load(table_dir(base, record, table))
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
