"""A table's batch and net changes with the columns named as its Delta table stores them
(sinks/delta/names.py): the sink's plan, MERGE, SCD2 and rewrites all work on stored names, so
the translation from source names happens once, here."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.tables import spark_ident as q
from sinks.changes import Batch, NetChanges
from sinks.changes import cached_property as cached
from sinks.delta.names import ColumnNames


class DeltaBatch:
    def __init__(self, batch: Batch, names: ColumnNames) -> None:
        self.source = batch
        self.names = names
        self.table = batch.table
        self.bootstrap = batch.bootstrap
        self.snapshot_lsn = batch.snapshot_lsn
        self._source_of = {names.stored(c.name): c.name for c in batch.schema.columns}

    @property
    def truncate_position(self) -> tuple[int, int] | None:
        return self.source.truncate_position

    @property
    def truncates(self) -> list[tuple[int, int, int | None]]:
        return self.source.truncates

    @cached
    def spark_schema(self) -> T.StructType:
        return T.StructType(
            [
                T.StructField(self.names.stored(f.name), f.dataType, True, self.names.metadata(f.name))
                for f in self.source.spark_schema.fields
            ]
        )

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(self.names.stored(k) for k in self.source.key_columns)

    @cached
    def renames(self) -> dict[str, tuple[str, ...]]:
        stored = self.names.stored
        return {stored(new): tuple(stored(o) for o in old) for new, old in self.source.renames.items()}

    @cached
    def defaults(self) -> dict[str, tuple[int, str]]:
        return {self.names.stored(c): v for c, v in self.source.defaults.items()}

    @property
    def retired(self) -> frozenset[str]:
        return frozenset(self.names.stored(c) for c in self.source.retired)

    def source_name(self, stored: str) -> str:
        return self._source_of.get(stored, stored)

    def default_value(self, column: str):
        return self.source.default_value(self._source_of[column])

    def metadata(self, stored: str) -> dict[str, str]:
        """The metadata a column of this stored name gets (its comment when encoded)."""
        source = self._source_of.get(stored)
        return self.names.metadata(source) if source is not None else {}

    def changes(self, changes: NetChanges) -> NetChanges:
        """The net changes with the source columns under their stored names."""
        if all(s == c for s, c in self._source_of.items()):
            return changes
        by_source = {c: s for s, c in self._source_of.items()}

        def renamed() -> DataFrame:
            df = changes.df
            return df.select(
                *(F.col(q(c)).alias(by_source[c]) if c in by_source else F.col(q(c)) for c in df.columns)
            )

        unchanged = {by_source.get(c, c): flag for c, flag in changes.unchanged.items()}
        arrow = changes.arrow
        if arrow is not None:
            arrow = arrow.rename_columns([by_source.get(c, c) for c in arrow.column_names])
        frame = renamed if arrow is not None else renamed()  # a writer taking `arrow` needs no plan
        return NetChanges(frame, unchanged, arrow=arrow)  # the job releases the cached original
