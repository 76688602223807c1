"""The net changes of a cut as a view the sink's SQL can name (MERGE INTO ... USING <view>)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from cdc.ground.tables import spark_ident as q

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@contextmanager
def source_view(df: DataFrame) -> Iterator[str]:
    """`df` as a global temporary view, named for the block (one name per call: the tables of a cut
    may be applied side by side). Global, because a batch's DataFrame belongs to the session it was
    read in and the sink's statement runs in its own (another one when tables are applied side by
    side, pipelines/apply/parallel.py): a session's temporary view is not seen by the others."""
    name = f"cdc_iceberg_{uuid.uuid4().hex}"
    session = df.sparkSession
    database = session.conf.get("spark.sql.globalTempDatabase", "global_temp") or "global_temp"
    df.createOrReplaceGlobalTempView(name)
    try:
        yield f"{q(database)}.{q(name)}"
    finally:
        session.catalog.dropGlobalTempView(name)
