"""The search follower of a `sinks:` entry: the engine's sink class, chosen by `engine:`.

Kept apart from sink.py (the base both engines extend) so that the base never imports the
engines: the engines import the base, and only this module imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sinks.search.settings import SearchSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc.ground.config import Pipeline, SinkConfig
    from sinks.search.sink import SearchSink


def search_sink(config: SinkConfig, pipeline: Pipeline, spark: SparkSession | None) -> SearchSink:
    settings = config.settings
    if not isinstance(settings, SearchSettings):  # the registry sends only `search:` entries here
        raise TypeError(f"sink {config.name} is not a search sink")
    if settings.engine == "opensearch":
        from sinks.search.opensearch_engine import OpenSearchSink

        return OpenSearchSink(config, pipeline, spark)
    from sinks.search.tantivy_engine import TantivySink

    return TantivySink(config, pipeline, spark)
