"""The driver's JVM through py4j, for what PySpark has no Python API for (Delta's and Iceberg's
Java classes, a thread's active session)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def driver_jvm(spark: SparkSession) -> Any:
    """`spark`'s py4j view of the driver JVM (untyped: Java classes by attribute). PySpark types it
    optional, None before a SparkContext starts; a session's context holds it until stopped."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise RuntimeError("the SparkContext has stopped: its JVM is gone")
    return jvm
