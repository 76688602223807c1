"""A derived view checked by Spark against the captured tables' schemas, on empty data: its output
columns, or a UsageError naming the view and what Spark could not resolve (a dropped column, a typo,
a type error). Used by `cdc validate` (no source rows are read) and the view stage."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName
from cdc.log.base import TableSchema
from cdc.schema import schema_types
from pipelines.views.namecheck import check_names
from pipelines.views.plan import ViewPlan
from sinks.sparktypes import spark_type

_serial = itertools.count()


def struct_of(schema: TableSchema) -> T.StructType:
    """The Spark schema of a captured table as every follower types it (sinks/sparktypes.py)."""
    types = schema_types(schema)
    return T.StructType(
        [T.StructField(c.name, spark_type(types[c.type_oid], c), True) for c in schema.columns]
    )


def view_schema(
    spark: SparkSession, plan: ViewPlan, schemas: Mapping[TableName, T.StructType]
) -> T.StructType:
    """The view's output columns: its SQL analysed by Spark over empty tables of the given schemas.
    Raises UsageError (exit 2) naming the view when Spark refuses it, a key column is not output,
    a column is output twice or has no usable name."""
    names: dict[TableName, str] = {}
    try:
        for table in plan.tables:
            if table not in schemas:
                raise UsageError(
                    f"view {plan.name}: no schema of {table} is known", "snapshot the table first"
                )
            names[table] = f"_cdc_check_{plan.name}_{next(_serial)}"
            spark.createDataFrame([], schemas[table]).createOrReplaceTempView(names[table])
        try:
            schema = spark.sql(plan.render(names)).schema
        except AnalysisException as exc:
            text = str(exc).strip()
            for table, name in names.items():
                text = text.replace(f"`{name}`", str(table)).replace(name, str(table))
            first = text.splitlines()[0] if text else type(exc).__name__
            raise UsageError(
                f"view {plan.name}: Spark cannot run its SQL: {first}",
                "correct the view's SQL (columns as the captured tables have them now; `cdc validate` checks it)",
            ) from None
    finally:
        for name in names.values():
            spark.catalog.dropTempView(name)
    check_columns(plan, schema)
    return schema


def check_columns(plan: ViewPlan, schema: T.StructType) -> None:
    check_names(plan, [f.name for f in schema.fields])
