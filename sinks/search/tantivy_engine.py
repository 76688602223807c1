"""`engine: tantivy` (the embedded default): a tantivy index directory per table, written by one
writer per index, in one Spark task per table.

* **Layout**: `<path>/<schema>/<table>/` (default path `<state_dir>/search`; names as for
  Delta tables) holds `cdc.json` (the index generation, the source schema the index was
  written with, the fields) and the index itself in `g<generation>/`.
* **Fields**: `_cdc_id` (the document id, raw/untokenized: deletes and lookups by term),
  `_cdc_version` (i64, indexed + fast), `_cdc_kind` (1 row, 2 tombstone, 3 truncate marker),
  `_cdc_row` (stored bytes: the row as JSON, for display and `cdc verify`), and one indexed,
  unstored field per column with the field type of sinks/search/fields.py: text ->
  tokenized text (default tokenizer), keyword -> raw text, numbers -> i64/f64, boolean, date
  (tantivy dates span 1677-2262; others are kept in `_cdc_row` only), binary/stored ->
  nothing. A field is named like its column when that is a plain identifier (letters, digits,
  `_`, not starting with a digit or `_cdc_`), else `col<N>` (N = the column's ordinal), so
  queries read `name:alice`, `qty:[1 TO 5]`.
* **One writer**: tantivy allows one IndexWriter per index (a lock file). The net change is
  computed in parallel as for any sink, then repartitioned to one partition, and that one task
  opens the writer, applies every change of the table and commits once: a table's batch is in
  the index entirely or not at all. The rows never go through the driver.
* **Positions**: before replacing a key, the task looks it up (term query on `_cdc_id`, the
  version from the fast field); the change is written only if its version is greater. A
  deleted key keeps a *tombstone* document (kind 2, no row) so a late older write cannot bring
  it back; tombstones are never shown by queries, counts or `cdc verify`. They are removed by
  the next truncate below them.
* **Truncate / new base**: `delete_documents_by_query(_cdc_version < v)` and a marker document
  (kind 3) holding v, in the same commit as the batch's writes; changes older than the marker's
  version are dropped from then on.
* **Unchanged TOAST values**: the lookup has the stored document; its `_cdc_row` gives the
  values of the unchanged columns.
* **Schema changes**: a tantivy schema is fixed, so when the fields differ from the index's
  (a new column, another field type) the task builds the next generation from the stored
  documents (rows, tombstones, marker) with the new fields, switches `cdc.json` to it and
  removes the old one, then applies the batch. A renamed source column does the same, with
  each stored row's member renamed (`renamed_row`).
* The task commits and waits for tantivy's merge threads, so segments stay merged.

Here the sink; the fields and documents are tantivy_documents.py's, the index directory and its
generations tantivy_index.py's, the write and read tasks tantivy_tasks.py's.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from cdc.ground.errors import SinkError, UsageError
from cdc.ground.tables import TableName
from cdc.log.base import TableSchema
from sinks.changes import Batch
from sinks.delta.paths import table_path
from sinks.search.documents import version
from sinks.search.fields import FieldSpec
from sinks.search.sink import SearchSink, SearchStats, WriteJob
from sinks.search.tantivy_documents import ROW, _stored, tantivy_fields
from sinks.search.tantivy_index import open_index, read_sidecar
from sinks.search.tantivy_tasks import IndexPlan, read_documents, write_partition
from sinks.shaping import follower_name

if TYPE_CHECKING:
    from pyspark import RDD


MARKER_FILE = "cdc_follower.json"  # the follower's marker (sinks/marker.py)


# ---- the sink ------------------------------------------------------------------------------------
class TantivySink(SearchSink):
    engine = "tantivy"

    @property
    def base(self) -> Path:
        return (
            self.pipeline.path(self.settings.path)
            if self.settings.path
            else self.pipeline.state_path / "search"
        )

    def table_dir(self, table: TableName) -> Path:
        return table_path(self.base, table, follower_name(self.config, table))

    def describe(self) -> str:
        return f"{self.name} (search, tantivy at {self.base})"

    def _prepare(self, batches: Sequence[Batch], specs: dict[TableName, list[FieldSpec]]) -> None:
        for batch in batches:
            if not batch.bootstrap and open_index(self.table_dir(batch.table)) is None:
                raise SinkError(
                    f"{batch.table}: the tantivy index at {self.table_dir(batch.table)} does not exist, "
                    "but this follower has applied the table before",
                    f"rebuild this follower from the log's base: `{self.pipeline.command('reset', '--sink', self.name, '--rebuild', '--yes')}`",
                )

    def _write(self, job: WriteJob) -> SearchStats:
        batch, frame = job.batch, job.frame
        directory = self.table_dir(batch.table)
        plan = IndexPlan(
            str(directory),
            batch.schema.to_json(),
            tuple(tantivy_fields(job.specs, {f.name: f.dataType for f in batch.spark_schema.fields})),
            job.layout,
            job.truncate,
            dict(batch.renames),
            version(batch.snapshot_lsn, 0) if batch.bootstrap and batch.snapshot_lsn is not None else None,
            job.rejected_fix,
            job.defaults,
        )
        what = f"the tantivy index at {directory}"
        write = partial(write_partition, plan)
        # One task, one writer: the net change is computed in parallel, then its rows (one per key)
        # are shuffled into a single partition, whose task writes and commits the index.
        stats = self.collect(str(batch.table), frame.repartition(1).rdd.mapPartitions(write), what)
        if (
            stats.tasks == 0
        ):  # Spark ran no task (nothing to read): run it anyway, for a truncate or new fields
            stats = self.collect(
                str(batch.table), self.spark.sparkContext.parallelize([], 1).mapPartitions(write), what
            )
        return stats

    # ---- marker (sinks/marker.py): a file next to the generations, which it outlives -------------
    markers = True
    reads_without_spark = True  # a client of the engine, no session (sinks/base.py)

    def has_table(self, table: TableName) -> bool:
        return open_index(self.table_dir(table)) is not None

    def clear_table(self, table: TableName) -> None:
        shutil.rmtree(self.table_dir(table), ignore_errors=True)

    def read_marker(self, table: TableName) -> str | None:
        try:
            return (self.table_dir(table) / MARKER_FILE).read_text()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write_marker(self, table: TableName, text: str) -> None:
        directory = self.table_dir(table)
        tmp = directory / (MARKER_FILE + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / MARKER_FILE)

    def stored_schema(self, table: TableName) -> TableSchema | None:
        meta = read_sidecar(self.table_dir(table))
        return None if meta is None else TableSchema.from_json(meta["schema"])

    def documents(self, table: TableName) -> RDD:
        return self.spark.sparkContext.parallelize([str(self.table_dir(table))], 1).flatMap(read_documents)

    def search(
        self, table: TableName, query: str, limit: int
    ) -> tuple[int, int | None, list[tuple[float, dict[str, Any]]]]:
        import tantivy

        opened = open_index(self.table_dir(table))
        if opened is None:
            raise SinkError(
                f"sink {self.name} has no index for {table} yet ({self.table_dir(table)})",
                "run `cdc apply` first",
            )
        index, meta = opened
        searcher = index.searcher()
        live = tantivy.Query.term_query(index.schema, "_cdc_kind", ROW)
        # tantivy's stubs leave out SearchResult.count (there with count=True)
        total = searcher.search(live, 1, count=True).count if searcher.num_docs else 0  # type: ignore[attr-defined]
        if total == 0:
            return 0, 0, []
        defaults = [name for _c, name, kind, *_ in meta["fields"] if kind in ("text", "keyword")]
        try:
            parsed = index.parse_query(query, default_field_names=defaults)
        except ValueError as exc:
            names = ", ".join(
                name for _c, name, kind, *_ in meta["fields"] if kind not in ("binary", "stored")
            )
            raise UsageError(
                f"invalid query {query!r}: {exc}", f"tantivy query syntax; fields: {names}"
            ) from None
        both = tantivy.Query.boolean_query([(tantivy.Occur.Must, parsed), (tantivy.Occur.Must, live)])
        found = searcher.search(both, limit, count=True)  # count: every match, not only the top `limit`
        hits = found.hits
        return (
            total,
            found.count,  # type: ignore[attr-defined]  # as above
            [(score, orjson.loads(_stored(searcher.doc(addr), "_cdc_row"))) for score, addr in hits],
        )
