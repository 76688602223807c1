"""Redis cache follower: one Redis value per row, position-guarded by a server-side script
(see sinks/cache/sink.py for the design)."""

from sinks.cache.sink import RedisSink

__all__ = ["RedisSink"]
