"""`cdc verify` for followers of derived views.

The view's SQL is run by Spark over the source's rows as verify read them (one exported
snapshot at the verification point `cp`, typed like apply types them) and the result is
compared row by row, on the view's key, with what the follower holds under `views.<name>`
(its `current`), exactly as a table is (pipelines/verify_compare.py `compare`: counts and a content
hash first, then the first differing keys named).

The follower's position for a view is the cut the view stood at when it applied it (the view
state's LSN). As for tables:
* that LSN < cp: comparable only if none of the view's base tables changed between the view's
  cut and cp (the base follower's ranges in the log, and the slot for what is not streamed yet);
  else the verdict is "behind".
* that LSN >= cp: view keys a base-table change at or after cp touches are excused: the view's
  key query (pipelines/views/plan.py `keys_sql`) over each base table's changed rows (its rows at
  cp with those keys and every later version in the log), the other tables at cp plus their later
  versions: every view row that could differ. A view maintained by full recomputation has no such
  query: with changes after cp it is reported behind (verify it again when the source is quiet).
"""

from __future__ import annotations

import re

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from cdc.ground.config import Pipeline, SinkConfig, sink_views
from cdc.ground.tables import TableName
from cdc.log.base import TableSchema
from pipelines.apply.readers import ChangeReader
from pipelines.checkpoints import Checkpoint, load_checkpoint
from pipelines.views.plan import ViewPlan
from pipelines.views.sql import analyse
from pipelines.views.state import BASE_SINK, view_state
from sinks.base import Sink
from sinks.changes import typed_columns
from sinks.viewbatch import ViewBatch, as_stored, view_schema, view_table


def view_plans(
    pipeline: Pipeline, sinks: list[SinkConfig], captured: list[TableName], log
) -> dict[str, ViewPlan]:
    """The plans of the views these sinks follow (their base tables are read from the source too)."""
    names = {v for s in sinks for v in sink_views(s)}
    columns = {t: log.schema(t).column_names for t in captured}
    return {v.name: analyse(v, captured, columns) for v in pipeline.views if v.name in names}


def _temp_name(table: TableName, tag: str) -> str:
    return f"_cdc_verify_{tag}_" + re.sub(r"[^a-z0-9_]", "_", f"{table.schema}_{table.name}".lower())


def _changed_rows(
    spark: SparkSession, reader: ChangeReader, table: TableName, schema: TableSchema, point: int, upto: int
) -> DataFrame | None:
    """Every version the log has of the table's rows changed at or after `point` (None: none changed)."""
    first = reader.first_offset_from(spark, table, point, upto)
    if first is None:
        return None
    raw = reader.read_changes(spark, table, first - 1, upto, schema)
    typed = typed_columns(schema, [raw["vals"][i] for i in range(len(schema.columns))])
    return raw.filter(raw["op"] != "t").select(*(t.alias(n) for n, t, _ in typed))


class ViewCheck:
    """One sink's views compared with their SQL over the source copy."""

    def __init__(
        self, pipeline: Pipeline, spark: SparkSession, reader: ChangeReader, plans: dict[str, ViewPlan]
    ):
        self.pipeline, self.spark, self.reader, self.plans = pipeline, spark, reader, plans

    def base_checkpoint(self) -> Checkpoint:
        return load_checkpoint(self.pipeline.state_path, BASE_SINK, self.pipeline.file)

    def position(self, sink_cfg: SinkConfig, ckpt: Checkpoint) -> tuple[int | None, str | None, str | None]:
        """(the LSN the follower holds its views at, why it is behind, an error) over the sink's views."""
        lsn: int | None = None
        for name in sink_views(sink_cfg):
            state = view_state(self.pipeline, name)
            if state is not None and state.error:
                return None, None, f"view {name}: {state.error['problem']}"
            done = ckpt.tables.get(str(view_table(name)))
            if state is None or done is None:
                return None, f"view {name} has not been applied to this follower (run `cdc apply`)", None
            if [done[0], done[1]] != [state.epoch, state.version]:
                return None, f"view {name} changed since this follower applied it (run `cdc apply`)", None
            lsn = state.lsn if lsn is None else min(lsn, state.lsn)
        return lsn, None, None

    def base_tables(self, sink_cfg: SinkConfig) -> list[TableName]:
        return sorted({t for v in sink_views(sink_cfg) for t in self.plans[v].tables}, key=str)

    def _register(self, frames: dict[TableName, DataFrame], tag: str) -> dict[TableName, str]:
        names = {}
        for table, df in frames.items():
            names[table] = _temp_name(table, tag)
            df.createOrReplaceTempView(names[table])
        return names

    def excused(
        self,
        plan: ViewPlan,
        sources: dict[TableName, DataFrame],
        schemas: dict[TableName, TableSchema],
        point: int,
    ) -> tuple[DataFrame | None, bool]:
        """(view keys changes at or after `point` may touch, whether they could be told apart)."""
        base = self.base_checkpoint()
        newer: dict[TableName, DataFrame] = {}
        for table in plan.tables:
            end = base.tables.get(str(table), [0, 0])[1]
            rows = _changed_rows(self.spark, self.reader, table, schemas[table], point, end)
            if rows is not None:
                newer[table] = rows
        if not newer:
            return None, True
        if not plan.incremental:
            return None, False
        everything = self._register(
            {t: df.unionByName(newer[t]) if t in newer else df for t, df in sources.items()}, "all"
        )
        parts = []
        for table, rows in newer.items():
            key = list(schemas[table].key)
            touched = sources[table].join(rows.select(*key), key, "left_semi").unionByName(rows)
            name = _temp_name(table, "changed")
            touched.createOrReplaceTempView(name)
            parts.append(self.spark.sql(plan.keys_sql(everything, changed=table, changed_rows=name)))
        out = parts[0]
        for part in parts[1:]:
            out = out.unionByName(part)
        return out.distinct(), True

    def rows(
        self, plan: ViewPlan, sources: dict[TableName, DataFrame], columns: list[tuple[str, T.DataType]]
    ) -> DataFrame:
        """The view's rows over the source copy, held as a follower holds them."""
        names = self._register({t: sources[t] for t in plan.tables}, "cp")
        return as_stored(self.spark.sql(plan.render(names)), columns)

    def follower(
        self, sink: Sink, name: str, columns: list[tuple[str, T.DataType]], key: tuple[str, ...]
    ) -> DataFrame | None:
        like = ViewBatch(self.spark, name, "", -1, -1, False, columns, key, 0)
        return sink.current(view_table(name), like)


def view_columns(pipeline: Pipeline, name: str) -> tuple[list[tuple[str, T.DataType]], tuple[str, ...]]:
    state = view_state(pipeline, name)
    assert state is not None
    return [(n, T._parse_datatype_json_string(t)) for n, t in state.columns], tuple(state.key)


__all__ = ["ViewCheck", "view_columns", "view_plans", "view_schema"]
