"""Delta's idempotent writes for followers (DESIGN.md §7): the commit records (follower, cut
id) through the txnAppId/txnVersion session confs, and Delta skips a write whose cut it has
already committed, so a cut applied again after a crash between MERGE and checkpoint changes
nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyspark.sql import SparkSession

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


@contextlib.contextmanager
def follower_write(spark: SparkSession, app_id: str, cut_id: int) -> Iterator[None]:
    """The write commits as (app_id, cut_id) and is skipped if Delta already holds that cut."""
    conf = spark.conf
    conf.set(TXN_APP_ID, app_id)
    conf.set(TXN_VERSION, str(cut_id))
    try:
        yield
    finally:
        conf.unset(TXN_APP_ID)
        conf.unset(TXN_VERSION)
