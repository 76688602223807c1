"""Delta Lake follower: one Delta table per source table at <path>/<schema>/<table>."""

from sinks.delta.sink import DeltaSink

__all__ = ["DeltaSink"]
