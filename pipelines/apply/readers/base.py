"""What every Spark reader of a log offers the apply job and verify.

A log view (cdc/log/: the embedded log, Kafka topics, Debezium topics) is plain Python: cuts,
tables, schemas, state. Its reader reads the view's change events into a DataFrame, in
executors (the embedded log reads a range of up to 20,000 events and 8 MiB in the driver). Every reader returns the same columns (SCHEMA), so the
net-change and merge code after it does not know which log it reads.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, DataFrameReader, SparkSession
    from pyspark.sql.datasource import DataSource

    from cdc.ground.tables import TableName
    from cdc.log.base import TableSchema

# off: offset in the table's log; (lsn, seq): the event's position; op: c u d r t; key: canonical
# key bytes; vals: text values aligned with the asked schema's columns (PostgreSQL text or envelope
# JSON: the view's value_kind); unch: indexes of unchanged values; ts: commit time (µs since the epoch).
# One Spark task per this many events of a table's range, on every log: a big catch-up is read side by
# side, and no task runs so long that a stalled apply (pipelines/apply/stall.py) could be mistaken.
EVENTS_PER_PARTITION = 200_000
SCHEMA = "off long, lsn long, seq long, op string, key binary, vals array<string>, unch array<int>, ts long"


_registering = threading.Lock()


def python_source(spark: SparkSession, source: type[DataSource]) -> DataFrameReader:
    """`spark.read.format(<source's name>)`, the Python data source registered with the session
    on first use: registering one costs about a second in a fresh JVM (bench/apply_start.py), which
    a scheduled apply whose cut is read in the driver never needs."""
    name = source.name()
    with _registering:
        if not spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(name):
            spark.dataSource.register(source)
    return spark.read.format(name)


class ChangeReader(ABC):
    @abstractmethod
    def read_changes(
        self,
        spark: SparkSession,
        table: TableName,
        after: int,
        upto: int,
        schema: TableSchema | None = None,
        retired: frozenset[str] = frozenset(),
    ) -> DataFrame:
        """The table's events with after < offset <= upto (SCHEMA), values aligned with `schema`
        (default: the newest); `retired` columns a row's schema version lacks are marked unchanged."""

    def read_changes_held(
        self,
        spark: SparkSession,
        table: TableName,
        after: int,
        upto: int,
        schema: TableSchema | None = None,
        retired: frozenset[str] = frozenset(),
    ) -> tuple[DataFrame | Callable[[], DataFrame], Any]:
        """`read_changes`, and the same events as a pyarrow Table when the reader read them in the
        driver (else None): the apply may type them there (sinks/arrowtyping.py). With the events
        held, the DataFrame may be deferred: a function making it from them when first needed."""
        return self.read_changes(spark, table, after, upto, schema, retired), None

    @abstractmethod
    def count_events(
        self, spark: SparkSession, table: TableName, after: int, upto: int, below_lsn: int
    ) -> int:
        """Events in (after, upto] committed before `below_lsn` (for verify: is a follower behind?)."""

    @abstractmethod
    def first_offset_from(self, spark: SparkSession, table: TableName, lsn: int, upto: int) -> int | None:
        """The offset of the first change event (snapshot rows aside) at or after commit LSN `lsn`,
        up to offset `upto`; None when there is none."""

    def close(self) -> None:
        """Release what the reader cached in Spark (the view is closed by its owner)."""
        return None
