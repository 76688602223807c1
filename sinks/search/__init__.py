"""Search follower: a tantivy index (embedded) or an OpenSearch index per table.

See sinks/search/sink.py (the sink), documents.py (what is stored, position -> version; its
fields in fields.py, its JSON values in json_values.py, a batch as executor rows in rows.py),
tantivy_engine.py and opensearch_engine.py (the engines; OpenSearch's executor-side writes in
opensearch_bulk.py, its index generations in opensearch_index.py), query.py (`cdc search`) and
settings.py (the `search:` settings of a sink).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SearchSink"]


def __getattr__(name: str) -> Any:
    # imported on first use: reading a pipeline file (settings.py) loads no Spark
    if name == "SearchSink":
        from sinks.search.sink import SearchSink

        return SearchSink
    raise AttributeError(name)
