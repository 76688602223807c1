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
SOURCE_NOT_COPIED = {
    "spark.databricks.delta.merge.materializeSource": "none",
    "spark.databricks.delta.merge.failSourceCachedAfterMaterialization": "false",
}


@contextlib.contextmanager
def source_not_copied(spark: SparkSession) -> Iterator[None]:
    """MERGEs inside read their (persisted, deterministic) source directly. Delta then also
    refuses a source holding a cached relation, because a cached *Delta* scan does not pin its
    table version; ours holds only the batch's log read (never a Delta table), so that check
    is turned off with it."""
    conf = spark.conf
    previous = {key: conf.get(key, None) for key in SOURCE_NOT_COPIED}
    for key, value in SOURCE_NOT_COPIED.items():
        conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                conf.unset(key)
            else:
                conf.set(key, value)


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
