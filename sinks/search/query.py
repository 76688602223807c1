"""`cdc search PIPELINE TABLE QUERY [--sink NAME] [--limit N]`: the top hits of a query in a
search follower's index of one table, so a user can see the index working.

The query uses the engine's own syntax: tantivy's query parser (`alice`, `name:alice`,
`qty:[1 TO 5]`, `"two words"`, `a AND NOT b`; bare words search the text and keyword fields)
or OpenSearch's `query_string` (the same forms; bare words search every field). Output: one
header line (sink, engine, live documents, how many match: `top 10 of 37 hit(s)` when --limit
cut the list), then one line per hit with its rank, score,
key and a short rendering of the row.

No Spark: this reads the index directly (tantivy) or asks the cluster (OpenSearch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from cdc.ground.config import Pipeline, SinkConfig, sink_tables
from cdc.ground.errors import SinkError, UsageError
from cdc.ground.tables import TableName
from sinks.search.documents import render_row, show_key

if TYPE_CHECKING:
    from sinks.search.sink import SearchSink


def _table(cfg: SinkConfig, text: str) -> TableName:
    try:
        table = TableName.parse(text)
    except ValueError as exc:
        raise UsageError(
            f"bad table name {text!r}: {exc}", "give it as schema.table, e.g. public.customers"
        ) from None
    if not sink_tables(cfg, [table]):
        raise UsageError(
            f"sink {cfg.name} does not follow {table} (its tables: {', '.join(cfg.settings.tables or []) or 'none'})",
            "name one of the sink's tables",
        )
    return table


def _open(pipeline: Pipeline, cfg: SinkConfig) -> SearchSink:
    from sinks.search.engines import search_sink

    return search_sink(cfg, pipeline, None)  # no Spark needed to query


def run_search(
    pipeline: Pipeline, table: str, query: str, sink_name: str | None, limit: int
) -> Iterator[str]:
    cfg = pipeline.sink_of_kind("search", sink_name, "search: {engine: tantivy, tables: [...]}")
    name = _table(cfg, table)
    if not query.strip():
        raise UsageError(
            "the query is empty", 'give words to look for, e.g. cdc search shop.yml public.customers "alice"'
        )
    sink = _open(pipeline, cfg)
    schema = sink.stored_schema(name)
    if schema is None:
        raise SinkError(f"sink {cfg.name} has no index for {name} yet", "run `cdc apply` first")
    total, matched, hits = sink.search(name, query, limit)
    where = f"sink {cfg.name} ({sink.engine}), {name}"
    if total == 0:
        yield f"{where}: the index is empty (no documents), so nothing can match {query!r}"
        return
    # --limit caps the hits shown, not the matches: say how many matched when the engine knows
    if matched is None:
        count = f"top {len(hits)} hit(s) (how many match in all is not known)"
    elif matched > len(hits):
        count = f"top {len(hits)} of {matched:,} hit(s)"
    else:
        count = f"{matched:,} hit(s)"
    yield f"{where}: {count} for {query!r} among {total:,} document(s)"
    columns = schema.column_names
    key = list(schema.key)
    for rank, (score, doc) in enumerate(hits, 1):
        shown_key = show_key(key, [doc.get(k) for k in key])
        yield f"{rank:>3}. {score:8.3f}  {shown_key}  {render_row(doc, columns, skip=key)}"
