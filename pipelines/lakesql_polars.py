"""`cdc sql` over an Iceberg follower without a JVM: Polars SQL over every follower table scanned
lazily at its snapshot of one recorded cut (`pl.scan_iceberg(table, snapshot_id=...)`, the tables
opened with pyiceberg; sinks/iceberg/cuts.py).

Polars' SQL is PostgreSQL-like, but names are case-sensitive as written (no folding of unquoted
names). Each table answers to `schema.table` and to its bare name (pipelines/lakenames.py), and a
table of `public` to its plain name too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pipelines.lakenames import EngineRefused, bare_names, first_line
from sinks.delta.cuts import CutRecord
from sinks.iceberg.cuts import NO_SNAPSHOT, identifier

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog


class PolarsRefused(EngineRefused):
    """Polars refused the query (pipelines/lakenames.py EngineRefused)."""


def polars_names(tables: list[str]) -> dict[str, list[str]]:
    """{schema.table: the names Polars registers it under}."""
    out: dict[str, list[str]] = {}
    for t, bare in bare_names(tables).items():
        schema, _, name = t.partition(".")
        names = [t, bare]
        if schema == "public" and name != bare and name not in bare_names(tables).values():
            names.append(name)
        out[t] = list(dict.fromkeys(names))
    return out


@contextmanager
def _pyiceberg_planner() -> Iterator[None]:
    # Polars plans Iceberg scans with pyiceberg unless told otherwise; its native planner needs a
    # plugin this project does not install
    had = os.environ.get("POLARS_ICEBERG_PLANNER")
    os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")
    try:
        yield
    finally:
        if had is None:
            os.environ.pop("POLARS_ICEBERG_PLANNER", None)


def query_at_cut(
    catalog: Catalog, record: CutRecord, query: str, limit: int
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(column names, at most `limit` rows as Python values) of `query` over the cut's tables."""
    import polars as pl

    with _pyiceberg_planner():
        ctx = pl.SQLContext()
        try:
            for table, names in polars_names(sorted(record.versions)).items():
                loaded = catalog.load_table(identifier(record, table))
                snapshot = record.versions[table]
                if snapshot == NO_SNAPSHOT:
                    frame = pl.DataFrame(loaded.schema().as_arrow().empty_table()).lazy()
                else:
                    frame = pl.scan_iceberg(loaded, snapshot_id=snapshot)
                for name in names:
                    ctx.register(name, frame)
        except Exception as exc:
            raise PolarsRefused(f"pyiceberg cannot open the tables: {first_line(exc)}") from None
        try:
            result = ctx.execute(query).limit(limit).collect()
        except Exception as exc:  # planning and execution errors alike
            message = first_line(exc)
            missing = "relation '" in message and "not found" in message
            raise PolarsRefused(message, missing_table=missing) from None
    return list(result.columns), list(result.iter_rows())
