"""Search follower: a tantivy index (embedded) or an OpenSearch index per table.

See sinks/search/sink.py (the sink), documents.py (what is stored, position -> version),
tantivy_engine.py and opensearch_engine.py (the engines) and query.py (`cdc search`).
"""

from sinks.search.sink import SearchSink

__all__ = ["SearchSink"]
