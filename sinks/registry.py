"""Follower kinds by name: `kind:` in a `sinks:` entry -> its settings model and its sink.

Each kind is one folder under sinks/ (its settings in settings.py, its sink beside them) and one
line in SINK_KINDS, as dlt keeps a destination's spec beside its factory. The settings models
make the pipeline file's model here (pipeline files are read with load_pipeline/parse_pipeline
below: cdc/ground cannot import the kinds). Sink classes (or a factory, where the class depends on
settings) are named by import path and imported on first use, so importing the registry loads no
sink (nor its engine client, nor Spark), and sinks/base.py never imports a concrete sink (no cycle).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cdc.ground.pipeline_file as pipeline_file
from cdc.ground.config import pipeline_model
from cdc.ground.errors import UsageError
from cdc.ground.settings import SinkSettings
from sinks.cache.settings import RedisSettings
from sinks.delta.settings import DeltaSettings
from sinks.iceberg.settings import IcebergSettings
from sinks.search.settings import SearchSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc.ground.config import Pipeline, SinkConfig
    from sinks.base import Sink


@dataclass(frozen=True)
class SinkKind:
    settings: type[SinkSettings]  # the mapping under the kind's key
    sink: str  # "module:name" of its Sink class, or of a factory where the class depends on settings
    description: str  # its row in the pipeline file reference


# In the order the pipeline file reference lists them and "give exactly one sink kind" names them.
SINK_KINDS: dict[str, SinkKind] = {
    "delta": SinkKind(
        DeltaSettings, "sinks.delta.sink:DeltaSink", "a Delta Lake follower (give exactly one sink kind)"
    ),
    "iceberg": SinkKind(IcebergSettings, "sinks.iceberg.sink:IcebergSink", "an Iceberg follower"),
    "search": SinkKind(
        SearchSettings, "sinks.search.engines:search_sink", "a search index follower (tantivy or OpenSearch)"
    ),
    "redis": SinkKind(RedisSettings, "sinks.cache.sink:RedisSink", "a Redis cache follower"),
}

# The pipeline file's model with these kinds (module attributes by these names: pickle finds them).
PipelineModel = pipeline_model({k: (s.settings, s.description) for k, s in SINK_KINDS.items()}, __name__)
SinkConfigModel = PipelineModel.sink_config


def load_pipeline(path: str | os.PathLike[str]) -> Pipeline:
    """The pipeline file at `path`, validated (PipelineFileError, exit 2, naming what is wrong)."""
    return pipeline_file.load_pipeline(path, model=PipelineModel)


def parse_pipeline(data: Any, source: str = "<pipeline>", base_dir: Path | None = None) -> Pipeline:
    """A pipeline file's parsed YAML, validated as load_pipeline does."""
    return pipeline_file.parse_pipeline(data, source, base_dir, model=PipelineModel)


def sink_factory(kind: str) -> Callable[..., Sink]:
    try:
        module, name = SINK_KINDS[kind].sink.split(":")
    except KeyError:
        known = ", ".join(sorted(SINK_KINDS))
        raise UsageError(f"unknown follower kind {kind}", f"use one of: {known}") from None
    return getattr(import_module(module), name)


def make_sink(config: SinkConfig, pipeline: Pipeline, spark: SparkSession) -> Sink:
    """The follower for a `sinks:` entry."""
    return sink_factory(config.kind)(config, pipeline, spark)
