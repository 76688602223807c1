"""`cdc sql PIPELINE "SELECT ..." [--sink NAME] [--cut N]`: Spark SQL over a Delta follower's
tables, every table as of the same applied cut (the latest complete one by default), read
through `_cdc_cuts` (sinks/delta/cuts.py). Each table is a temp view named like the source
table (`orders`; `sales_orders` when two schemas have an `orders`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession

from cdc.ground.config import Pipeline, SinkConfig
from cdc.ground.errors import UsageError
from sinks.delta.cuts import list_cuts, views_at_cut


def delta_sink(pipeline: Pipeline, name: str | None) -> SinkConfig:
    """The named sink, which must be a delta one, or the pipeline's first delta sink."""
    return pipeline.sink_of_kind("delta", name, "delta: {path: ...}")


def _value(v: Any) -> Any:
    return v if v is None or isinstance(v, int | float | str | bool) else str(v)


def run_sql(
    pipeline: Pipeline,
    spark: SparkSession,
    query: str | None,
    sink_name: str | None,
    cut: int | None,
    limit: int,
    as_json: bool,
    list_only: bool,
    out: Callable[[str], None],
    note: Callable[[str], None],
) -> int:
    cfg = delta_sink(pipeline, sink_name)
    base = pipeline.path(cfg.settings.path)
    if list_only:
        for record in list_cuts(spark, base):
            tables = ", ".join(f"{t}@{v}" for t, v in sorted(record.versions.items()))
            out(f"{record.describe()}: {tables}")
        return 0
    if not query:
        raise UsageError(
            "no query given", f'`{pipeline.command("sql")} "SELECT ..."` (or --cuts to list the cuts)'
        )
    record, views = views_at_cut(spark, base, cut)
    note(
        f"-- sink {cfg.name}: {record.describe()}; views: "
        + ", ".join(f"{v} = {t}" for t, v in views.items())
    )
    try:
        df = spark.sql(query)
    except Exception as exc:  # a bad query is the user's input: exit 2 with Spark's own first line
        if type(exc).__name__ not in ("AnalysisException", "ParseException"):
            raise
        first = str(exc).strip().splitlines()[0][:500]
        raise UsageError(
            f"Spark SQL refused the query: {first}", "views: " + ", ".join(views.values())
        ) from None
    rows = df.limit(limit).collect()
    if as_json:
        for row in rows:
            out(json.dumps({k: _value(v) for k, v in row.asDict().items()}, ensure_ascii=False))
        return 0
    out("\t".join(df.columns))
    for row in rows:
        out("\t".join("NULL" if v is None else str(v) for v in row))
    return 0
