"""Delta Lake follower: one Delta table per source table at <path>/<schema>/<table>."""

from __future__ import annotations

from typing import Any

__all__ = ["DeltaSink"]


def __getattr__(name: str) -> Any:
    # imported on first use: readers without a JVM (sinks/delta/cuts.py, `cdc sql`) skip pyspark
    if name == "DeltaSink":
        from sinks.delta.sink import DeltaSink

        return DeltaSink
    raise AttributeError(name)
