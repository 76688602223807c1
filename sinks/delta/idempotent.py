"""The session confs one follower write runs under (DESIGN.md §7).

* txnAppId/txnVersion: Delta's idempotent writes. The commit records (follower, cut id), and
  Delta skips a write whose cut it has already committed: a cut applied again after a crash
  between MERGE and checkpoint changes nothing.
* merge.materializeSource=none (SCD1 MERGE only): by default Delta copies a MERGE source that
  is not a plain Delta scan before its two passes (find touched files, rewrite them), in case
  a re-read differs. The SCD1 source never does: it is computed from the batch's persisted
  events alone, and a re-read of a lost block reads the same fixed offset range of the log.
  The copy cost more than the MERGE itself (a 10k-key batch into 100k rows: 7-11 s with it,
  1-2 s without, on 2 cores). SCD2 keeps the copy: its source is read from the target table,
  which its first MERGE changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyspark.sql import SparkSession

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"


@contextlib.contextmanager
def source_not_copied(spark: SparkSession) -> Iterator[None]:
    """MERGEs inside read their (persisted, deterministic) source directly."""
    conf = spark.conf
    previous = conf.get(MATERIALIZE_SOURCE, None)
    conf.set(MATERIALIZE_SOURCE, "none")
    try:
        yield
    finally:
        if previous is None:
            conf.unset(MATERIALIZE_SOURCE)
        else:
            conf.set(MATERIALIZE_SOURCE, previous)


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
