"""What the tantivy follower runs in Spark tasks: one task per table writes the batch (each key looked
up, written only when its version is newer, tombstones and the truncate marker kept, one commit), and
the stored documents read back for `cdc verify`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from sinks.search.rows import Row, RowLayout, encoders
from sinks.search.sink import PartitionResult, error_result, ok_result
from sinks.search.tantivy_documents import MARKER, ROW, TOMBSTONE, DocumentMaker, Field, RowRejected, _stored
from sinks.search.tantivy_index import WRITER_HEAP, open_index, writable_index

if TYPE_CHECKING:
    import tantivy

MARKER_ID = "\x00truncate"  # no document id starts with NUL


# ---- the write task ------------------------------------------------------------------------------
@dataclass(frozen=True)
class IndexPlan:
    directory: str
    schema_json: dict
    fields: tuple[Field, ...]
    layout: RowLayout
    truncate: int | None
    renames: dict[str, tuple[str, ...]] = field(default_factory=dict)  # Batch.renames
    base: int | None = None  # version of a new base: older documents are not carried into a rebuild
    rejected_fix: str = ""  # SearchSink.rejected_fix(), built on the driver (it has the pipeline file)
    defaults: dict[str, Any] = field(default_factory=dict)  # WriteJob.defaults, given to rows in a rebuild


def _lookup(searcher: tantivy.Searcher, schema: tantivy.Schema, doc_id: str):
    """(version, kind, address) of the stored document of a key, or None."""
    return _lookup_many(searcher, schema, [doc_id])[0]


def _lookup_many(searcher: tantivy.Searcher, schema: tantivy.Schema, ids: list[str]) -> list:
    """Per id: (version, kind, address) of its stored document, or None (fast fields read per chunk)."""
    import tantivy

    term = tantivy.Query.term_query
    addrs = []
    for doc_id in ids:
        hits = searcher.search(term(schema, "_cdc_id", doc_id), 1, count=False).hits
        addrs.append(hits[0][1] if hits else None)
    present = [a for a in addrs if a is not None]
    if not present:
        return [None] * len(ids)
    versions = iter(searcher.fast_field_values("_cdc_version", present))
    kinds = iter(searcher.fast_field_values("_cdc_kind", present))
    return [None if a is None else (next(versions), next(kinds), a) for a in addrs]


def _chunks(rows: Iterable[tuple], size: int) -> Iterator[list[tuple]]:
    chunk = []
    for raw in rows:
        chunk.append(raw)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _apply(plan: IndexPlan, rows: Iterable[tuple]) -> PartitionResult:
    import tantivy

    layout = plan.layout
    fields = list(plan.fields)
    index = writable_index(
        Path(plan.directory), layout.table, plan.schema_json, fields, plan.renames, plan.base, plan.defaults
    )
    index.reload()
    schema = index.schema
    make = DocumentMaker(fields, schema)
    searcher = index.searcher()
    empty = searcher.num_docs == 0
    marker = None if empty else _lookup(searcher, schema, MARKER_ID)
    recorded = marker[0] if marker else 0
    writer = index.writer(WRITER_HEAP)
    try:
        truncate = plan.truncate if plan.truncate is not None and plan.truncate >= recorded else None
        truncating = truncate is not None
        if truncate is not None:
            below = tantivy.Query.range_query(
                schema, "_cdc_version", tantivy.FieldType.Integer, None, truncate, include_upper=False
            )
            writer.delete_documents_by_query(below)
            if truncate > recorded:
                writer.delete_documents_by_term("_cdc_id", MARKER_ID)
                writer.add_document(make(MARKER_ID, truncate, MARKER))
                recorded = truncate
        inserted = updated = deleted = stale = 0
        codecs = encoders(layout)
        for chunk in _chunks(rows, 1024):
            batch = []
            for raw in chunk:
                row = Row(layout, codecs, raw)
                if row.version < recorded:
                    stale += 1
                else:
                    batch.append(row)
            stored_docs = (
                [None] * len(batch) if empty else _lookup_many(searcher, schema, [r.id for r in batch])
            )
            for row, found in zip(batch, stored_docs, strict=True):
                if found is not None and truncating and found[0] < recorded:
                    found = None  # deleted by this batch's truncate
                if found is not None and found[0] >= row.version:
                    stale += 1
                    continue
                live = found is not None and found[1] == ROW
                if found is not None:
                    writer.delete_documents_by_term("_cdc_id", row.id)
                if row.values is None:  # a delete
                    writer.add_document(make(row.id, row.version, TOMBSTONE))
                    deleted += live
                    continue
                if row.unchanged:
                    stored = orjson.loads(_stored(searcher.doc(found[2]), "_cdc_row")) if live else None
                    for column in row.unchanged:
                        if stored is None:
                            row.values[column] = None
                        elif column in stored:
                            row.values[column] = stored[column]
                        else:
                            del row.values[column]
                try:
                    writer.add_document(make(row.id, row.version, ROW, row.values))
                except RowRejected as exc:
                    raise RowRejected(f"key {row.show_key(layout)}: {exc}") from None
                inserted += not live
                updated += live
        writer.commit()
    except BaseException:
        writer.rollback()
        raise
    writer.wait_merging_threads()
    return ok_result(inserted, updated, deleted, stale)


def write_partition(plan: IndexPlan, rows: Iterable[tuple]) -> Iterator[PartitionResult]:
    """The one task writing a table's batch into its index."""
    table = plan.layout.table
    try:
        return iter([_apply(plan, rows)])
    except RowRejected as exc:
        problem = f"{table}: the tantivy index rejected the row, {exc}"
        fix = plan.rejected_fix
    except ValueError as exc:
        if "LockBusy" in str(exc) or "lock" in str(exc).lower():
            problem = (
                f"{table}: the tantivy index at {plan.directory} is being written by another process ({exc})"
            )
            fix = "let the other `cdc apply` of this sink finish (only one may run), then run it again"
        else:
            problem = f"{table}: writing the tantivy index at {plan.directory} failed: {exc}"
            fix = "the next `cdc apply` applies the batch again"
    except Exception as exc:
        problem = (
            f"{table}: writing the tantivy index at {plan.directory} failed: {type(exc).__name__}: {exc}"
        )
        fix = "the next `cdc apply` applies the batch again"
    return iter([error_result(problem, fix)])


def read_documents(directory: str) -> Iterator[dict]:
    """The live rows of a table's index (executor side)."""
    import tantivy

    opened = open_index(Path(directory))
    if opened is None:
        return
    index, _meta = opened
    searcher = index.searcher()
    if not searcher.num_docs:
        return
    rows = tantivy.Query.term_query(index.schema, "_cdc_kind", ROW)
    for _score, addr in searcher.search(rows, searcher.num_docs, count=False).hits:
        yield orjson.loads(_stored(searcher.doc(addr), "_cdc_row"))
