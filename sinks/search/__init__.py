"""Search follower: a tantivy index (embedded) or an OpenSearch index per table.

See sinks/search/sink.py (the sink), documents.py (what is stored, position -> version),
tantivy_engine.py and opensearch_engine.py (the engines; OpenSearch's executor-side writes in
opensearch_bulk.py, its index generations in opensearch_index.py) and query.py (`cdc search`).
"""

from sinks.search.sink import SearchSink

__all__ = ["SearchSink"]
