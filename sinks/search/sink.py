"""The search follower (DESIGN.md §7): one index per table, one document per key, every write
guarded by the change's position, so late, repeated or replayed writes change nothing.

`search_sink(config, pipeline, spark)` (sinks/search/engines.py) gives the engine's sink
(`engine:` in the settings): `tantivy` (embedded, sinks/search/tantivy_engine.py) or `opensearch`
(sinks/search/opensearch_engine.py). What both store and how a position becomes a version is
in sinks/search/documents.py.

Per batch, as every sink: `prepare` checks every table's field types (and, for OpenSearch,
that the cluster answers and each index can take the batch) before anything is written;
`apply` writes one table's net changes from Spark executors (the rows never go through the
driver; the driver only sees per-partition counts and the first rejected row); `current`
reads the documents back, in executors too, as the source's columns for `cdc verify`.

A failure (engine unreachable, a rejected document) raises SinkError naming the table (and the
key for a rejected document). The apply job then leaves the follower's checkpoint on the
pending cut: the next run applies that cut again, which the version guard makes safe for the
documents that were already written.

Idempotence comes from the versions alone, not from remembering cut ids: cut ids start over
when a log is rebuilt (`cdc teardown`, then `cdc snapshot`), and a "skip cut ids already seen"
guard would then silently skip every batch of the new log; versions are LSNs, which only grow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cdc.ground.errors import SinkError
from cdc.ground.tables import TableName
from cdc.log.base import TableSchema
from sinks.base import ApplyStats, Sink
from sinks.changes import Batch, NetChanges
from sinks.search.documents import spark_failure, truncate_version
from sinks.search.fields import FieldSpec, field_specs
from sinks.search.json_values import documents_frame
from sinks.search.rows import RowLayout, default_values, write_frame

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame


@dataclass
class SearchStats(ApplyStats):
    stale: int = 0  # changes not newer than what the index holds (replays, late writes): ignored
    tasks: int = 0  # how many executor tasks reported

    def line(self) -> str:
        text = super().line()
        return text + (
            f" ({self.stale:,} not newer than the index, ignored)" if self.stale and not self.skipped else ""
        )


# What an executor reports per partition: (inserted, updated, deleted, stale, problem, fix).
PartitionResult = tuple[int, int, int, int, str | None, str | None]


def ok_result(inserted: int = 0, updated: int = 0, deleted: int = 0, stale: int = 0) -> PartitionResult:
    return (inserted, updated, deleted, stale, None, None)


def error_result(
    problem: str, fix: str | None, counts: tuple[int, int, int, int] = (0, 0, 0, 0)
) -> PartitionResult:
    return (*counts, problem, fix)


@dataclass
class WriteJob:
    """One table's batch as an engine writes it."""

    batch: Batch
    frame: DataFrame
    layout: RowLayout
    truncate: int | None  # the batch's truncate version (sinks/search/documents.py), None: no truncate
    specs: list[FieldSpec]
    rejected_fix: str  # the fix of a row the index rejects (SearchSink.rejected_fix; executors lack the file)
    defaults: dict[str, Any]  # column -> its fast default as documents hold it (rows.default_values)


class SearchSink(Sink):
    kind = "search"
    engine = ""
    parallel_tables = (
        False  # not yet shown safe for every engine (tantivy's index writers): one table at a time
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._default_values: dict[tuple, dict[str, Any]] = {}  # see _defaults

    def describe(self) -> str:
        return f"{self.name} (search, {self.engine})"

    def rejected_fix(self) -> str:
        """The fix of a row the index rejected (a value its configured field type cannot take).
        Applying the batch again would meet the same event, and `cdc snapshot --tables` would make
        every follower rebuild the table: only this follower is rebuilt, from the log's newest rows."""
        reset = self.pipeline.command("reset", "--sink", self.name, "--rebuild", "--yes")
        apply = self.pipeline.command("apply", "--once", "--sink", self.name)
        return (
            "fix the cause (make the column's field type fit its values, `fields:` in the sink's settings, "
            "or correct the row at the source and stream that change into the log), then rebuild only this "
            f"follower: `{reset}`, then `{apply}`; until then it stays on this batch (nothing of it is recorded as applied)"
        )

    # ---- field types -----------------------------------------------------------------------------
    def configured_fields(self, table: TableName) -> dict[str, str]:
        for key, columns in self.settings.fields.items():
            if TableName.parse(key) == table:
                return dict(columns)
        return {}

    def specs(self, schema: TableSchema, table: TableName) -> list[FieldSpec]:
        return field_specs(schema, self.configured_fields(table), str(table))

    # ---- the Sink interface ----------------------------------------------------------------------
    def prepare(self, batches: Sequence[Batch]) -> None:
        specs = {b.table: self.specs(b.schema, b.table) for b in batches}  # every check before any change
        self._prepare(batches, specs)

    def apply(self, batch: Batch, changes: NetChanges, cut_id: int) -> ApplyStats:
        frame, layout = write_frame(self.spark, batch, changes)
        specs = self.specs(batch.schema, batch.table)
        return self._write(
            WriteJob(
                batch,
                frame,
                layout,
                truncate_version(batch),
                specs,
                self.rejected_fix(),
                self._defaults(batch),
            )
        )

    def _defaults(self, batch: Batch) -> dict[str, Any]:
        """default_values, computed once per table and set of defaults (one Spark job each time)."""
        key = (
            str(batch.table),
            tuple(
                sorted(
                    (n, str(d), batch.spark_schema[n].simpleString())
                    for n, d in batch.defaults.items()
                    if n in batch.spark_schema.names
                )
            ),
        )
        if key not in self._default_values:
            self._default_values[key] = default_values(self.spark, batch)
        return self._default_values[key]

    def current(self, table: TableName, batch_schema: Batch | None = None) -> DataFrame | None:
        schema = self.stored_schema(table)
        if schema is None:
            return None
        return documents_frame(self.spark, self.documents(table), schema)

    # ---- engines ---------------------------------------------------------------------------------
    def _prepare(self, batches: Sequence[Batch], specs: dict[TableName, list[FieldSpec]]) -> None:
        raise NotImplementedError

    def _write(self, job: WriteJob) -> SearchStats:
        raise NotImplementedError

    def stored_schema(self, table: TableName) -> TableSchema | None:
        """The source schema the index was last written with (None: no index for the table)."""
        raise NotImplementedError

    def documents(self, table: TableName) -> RDD:
        """The live documents as JSON objects (source column -> JSON value), read in executors."""
        raise NotImplementedError

    def search(
        self, table: TableName, query: str, limit: int
    ) -> tuple[int, int | None, list[tuple[float, dict[str, Any]]]]:
        """(live documents in the index, documents matching the query (None: not known), [(score,
        document)] of the top `limit` hits)."""
        raise NotImplementedError

    # ---- shared ----------------------------------------------------------------------------------
    @staticmethod
    def collect(table: str, rdd: RDD, what: str) -> SearchStats:
        """Run the executors' writes; sum their counts; raise the first problem one reported."""
        try:
            results: list[PartitionResult] = rdd.collect()
        except Exception as exc:  # a task died outside our handlers: one readable line, no Java stack
            raise SinkError(
                f"{table}: writing to {what} failed: {spark_failure(exc)}",
                "fix the cause and run `cdc apply` again; the follower resumes from its checkpoint",
            ) from None
        stats = SearchStats(table)
        problems = []
        stats.tasks = len(results)
        for inserted, updated, deleted, stale, problem, fix in results:
            stats.inserted += inserted
            stats.updated += updated
            stats.deleted += deleted
            stats.stale += stale
            if problem is not None:
                problems.append((problem, fix))
        if problems:
            problem, fix = problems[0]
            if len(problems) > 1:
                problem += f" (and {len(problems) - 1} more failing partition(s))"
            raise SinkError(problem, fix)
        return stats
