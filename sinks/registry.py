"""Follower kinds by name: `kind:` in a `sinks:` entry -> the class in sinks/<kind>/.

Sink classes (or a factory, where the class depends on settings) are named by import path and imported on first use, so importing the registry loads no
sink (nor its engine client), and sinks/base.py never imports a concrete sink (no cycle).
A new follower kind is one folder under sinks/ plus one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import TYPE_CHECKING

from cdc.ground.errors import UsageError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc.ground.config import Pipeline, SinkConfig
    from sinks.base import Sink

SINK_CLASSES: dict[str, str] = {
    "delta": "sinks.delta.sink:DeltaSink",
    "redis": "sinks.cache.sink:RedisSink",
    "search": "sinks.search.engines:search_sink",  # the class depends on `engine:`
    "iceberg": "sinks.iceberg.sink:IcebergSink",
}


def sink_factory(kind: str) -> Callable[..., Sink]:
    try:
        module, name = SINK_CLASSES[kind].split(":")
    except KeyError:
        known = ", ".join(sorted(SINK_CLASSES))
        raise UsageError(f"unknown follower kind {kind}", f"use one of: {known}") from None
    return getattr(import_module(module), name)


def make_sink(config: SinkConfig, pipeline: Pipeline, spark: SparkSession) -> Sink:
    """The follower for a `sinks:` entry."""
    return sink_factory(config.kind)(config, pipeline, spark)
