"""The one interface every follower kind implements (one folder per kind, like dlt's destinations).

The apply job hands a sink, per batch: `prepare` with every table's batch first (check and
evolve schemas before anything is written, so a batch is never half-applied because of a
schema problem), then `apply` per table with the net changes and the batch's cut id. A sink
must be idempotent per cut id and must never let an older position overwrite a newer one.
`current` returns the follower's current rows (typed source columns) for `cdc verify`.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from cdc.ground.config import Pipeline, SinkConfig
    from cdc.ground.tables import TableName
    from sinks.changes import Batch, NetChanges


@dataclass
class ApplyStats:
    table: str
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    skipped: bool = False  # the sink had already applied this cut (replay)

    def line(self) -> str:
        if self.skipped:
            return f"{self.table}: already applied"
        return f"{self.table}: +{self.inserted:,} ~{self.updated:,} -{self.deleted:,}"


class Sink(ABC):
    kind: str = ""

    def __init__(self, config: SinkConfig, pipeline: Pipeline, spark: SparkSession):
        self.config = config
        self.name = config.name
        self.pipeline = pipeline
        self.spark = spark

    log_id: str = ""  # set by the apply job: which log the cut ids belong to

    @property
    def app_id(self) -> str:
        """Identifies this follower's writes for idempotence per cut id. It names the log too: cut
        ids start over with a new log (`cdc teardown` + `cdc snapshot`), and an old id must not
        make a new cut look applied."""
        return f"cdc:{self.pipeline.name}:{self.name}:{self.log_id}"

    def has_table(self, table: TableName) -> bool:
        """False when the follower lost a table it had (moved away, dropped by hand): the job then
        rebuilds it from the log's base. Sinks that cannot tell keep the default."""
        return True

    def check_engine(self) -> None:
        """Raise a CdcError when the engine is set up so it would lose this follower's data (checked
        before every batch); most engines have nothing to check."""
        return None

    def clear_table(self, table: TableName) -> None:
        """Remove everything the follower holds of the table (rows, its own bookkeeping, marker), so
        a rebuild starts from nothing: rows changed behind the tool's back (a position as new as
        the log's) would otherwise survive it."""
        raise NotImplementedError(f"sink kind {self.kind} cannot clear a table")

    # Markers (sinks/marker.py): a sink that keeps them sets `markers` and implements both methods.
    markers: bool = False
    # True when `has_table` and `read_marker` work on a sink made without a SparkSession (spark=None):
    # `cdc status` then checks the follower without starting a JVM (pipelines/selfcheck.py)
    reads_without_spark: bool = False

    def read_marker(self, table: TableName) -> str | None:
        """The table's marker text as the engine holds it (None: there is none)."""
        return None

    def begin_cut(self, cut_id: int) -> None:
        """Called before a cut's markers are checked and its rows written. An engine that can lose
        everything without a trace a later check would see (a Redis FLUSHALL during the apply, after
        which `write_marker` would write the markers again over the loss) puts down here what lets
        `write_marker` tell (sinks/cache/sink.py: a fence key). Most engines need nothing."""
        return None

    def write_marker(self, table: TableName, text: str) -> int | None:
        """Store the table's marker in the engine, after the batch's rows. A sink whose marker keeps
        no position (Delta, Iceberg: the data commit carries the cut, sinks/marker.py) returns the
        newest cut the table's commits carry now; the others None."""
        return None

    def cut_applied(self, cut_id: int, lsn: int, tables: list[TableName], again: bool = True) -> None:
        """Called once the cut's rows and markers are in the engine, before the checkpoint records
        the cut applied (so it may be called again for the same cut after a crash: idempotent;
        `again` is False when no earlier run had started this cut, so nothing of it can be there).
        `tables` are the follower's tables at this cut. Delta records the cut's table versions
        (sinks/delta/cuts.py); most engines have nothing to record."""
        return None

    # Whether `apply` may run for several tables of a cut at once, each table in its own thread and
    # session (pipelines/apply/parallel.py); such a sink keeps nothing per table it does not set in prepare.
    parallel_tables: bool = True

    def in_session(self, spark: SparkSession) -> Sink:
        """This sink working in another session (a worker thread's own), sharing all the rest,
        what `prepare` decided included."""
        if spark is self.spark:
            return self
        twin = copy.copy(self)
        twin.spark = spark
        return twin

    @property
    def settings(self) -> Any:
        return self.config.settings

    @property
    def wants_versions(self) -> bool:
        """True if `apply` wants every version per key (Batch.versions) rather than the net change."""
        return False

    @abstractmethod
    def prepare(self, batches: Sequence[Batch]) -> None: ...

    @abstractmethod
    def apply(self, batch: Batch, changes: NetChanges, cut_id: int) -> ApplyStats: ...

    @abstractmethod
    def current(self, table: TableName, batch_schema: Batch | None = None) -> DataFrame | None:
        """The follower's rows for a table (None when it has none yet)."""

    def describe(self) -> str:
        return f"{self.name} ({self.kind})"
