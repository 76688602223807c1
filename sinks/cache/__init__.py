"""Redis cache follower: one Redis value per row, position-guarded by a server-side script
(see sinks/cache/sink.py for the design, settings.py for the `redis:` settings of a sink)."""

from __future__ import annotations

from typing import Any

__all__ = ["RedisSink"]


def __getattr__(name: str) -> Any:
    # imported on first use: reading a pipeline file (settings.py) loads no Spark
    if name == "RedisSink":
        from sinks.cache.sink import RedisSink

        return RedisSink
    raise AttributeError(name)
