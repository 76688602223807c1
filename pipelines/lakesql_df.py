"""`cdc sql` without a JVM: DataFusion (delta-rs's `QueryBuilder`, the `deltalake` package) over
every follower table at its Delta version of one recorded cut (sinks/delta/cuts.py).

DataFusion's SQL is PostgreSQL-like: unquoted names fold to lower case, "double quotes" keep case
and spaces, `1/2` is integer division. Its reader also follows Delta column mapping (delta-rs's
Arrow reader does not), so a renamed column reads right here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipelines.lakenames import EngineRefused, datafusion_names, first_line, quoted, schemas_of
from sinks.delta.cuts import CutRecord, table_dir
from sinks.delta.names import source_name


class DataFusionRefused(EngineRefused):
    """DataFusion refused the query (pipelines/lakenames.py EngineRefused); a table it misses, Spark would miss too."""


def _reraise_ours(exc: BaseException) -> None:
    """Ctrl-C and exits pass; pyo3 raises a Rust panic as PanicException, a BaseException."""
    if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
        raise exc


QUERY_CONFIG = {
    "datafusion.execution.target_partitions": "2",  # small reads, a shared machine
    # Spark wrote timestamps as Parquet INT96 until 2026-12 (pipelines/spark.py): read as
    # nanoseconds, a value outside 1677-2262 wrapped around silently (year 9999 read as 1816)
    "datafusion.execution.parquet.coerce_int96": "us",
}


def source_header(columns: list[str], fields: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """The output's column names with a table column stored encoded (`unit_x0020_price`, a name
    plain Delta cannot hold) given back under its source name (`unit price`), as its comment says.
    `fields`: stored name -> metadata of the tables' columns."""
    return [source_name(c, fields[c]) if c in fields else c for c in columns]


def query_at_cut(
    base: str | Path, record: CutRecord, query: str, limit: int
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(column names, at most `limit` rows as Python values) of `query` over the cut's tables."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    qb = QueryBuilder(QUERY_CONFIG)
    try:
        for schema in schemas_of(record.versions):
            if schema != "public":  # DataFusion's default schema exists already
                qb.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted(schema)}")
        names: Mapping[str, list[str]] = datafusion_names(record.versions)
        fields: dict[str, Mapping[str, Any] | None] = {}
        for table, version in sorted(record.versions.items()):
            dt = DeltaTable(table_dir(base, record, table), version=version)
            for name in names[table]:
                qb.register(name, dt)
            for f in dt.schema().fields:
                if source_name(f.name, f.metadata) != f.name:
                    fields[f.name] = f.metadata
    except BaseException as exc:  # deltalake's own errors (a table feature it cannot read), a Rust panic
        _reraise_ours(exc)
        raise DataFusionRefused(f"delta-rs cannot open the tables: {first_line(exc)}") from None
    try:
        reader = pa.RecordBatchReader.from_stream(qb.execute(query))
        columns = source_header(list(reader.schema.names), fields)
        rows: list[tuple[Any, ...]] = []
        for batch in reader:  # stop reading once `limit` rows are here
            # by position, not to_pylist()'s dicts: two output columns may share a name
            rows.extend(zip(*(c.to_pylist() for c in batch.columns), strict=True))
            if len(rows) >= limit:
                return columns, rows[:limit]
        return columns, rows
    except BaseException as exc:  # planning and execution errors alike (a Rust panic too)
        _reraise_ours(exc)
        message = first_line(exc)
        missing = "table '" in message and "' not found" in message
        raise DataFusionRefused(message, missing_table=missing) from None
