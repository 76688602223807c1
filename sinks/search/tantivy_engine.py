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
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql import types as T

from cdc.ground.errors import SinkError, UsageError
from cdc.ground.tables import TableName
from cdc.log.base import TableSchema
from sinks.changes import Batch
from sinks.delta.paths import table_path
from sinks.search.documents import pending_renames, renamed_row, version
from sinks.search.fields import FieldSpec
from sinks.search.rows import Row, RowLayout, encoders
from sinks.search.sink import PartitionResult, SearchSink, SearchStats, WriteJob, error_result, ok_result
from sinks.shaping import follower_name

if TYPE_CHECKING:
    import tantivy
    from pyspark import RDD

SIDECAR = "cdc.json"
ROW, TOMBSTONE, MARKER = 1, 2, 3
MARKER_ID = "\x00truncate"  # no document id starts with NUL
WRITER_HEAP = 128_000_000
MAX_KEYWORD = 8191
_PLAIN_FIELD = re.compile(r"[^\W\d]\w*\Z")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

# (column, tantivy field name, field type, derived, plain): `plain` = the column's JSON values are
# already what the field takes (derived text of a string column, integers, booleans): no conversion.
Field = tuple[str, str, str, bool, bool]
_PLAIN_TYPES: dict[str, tuple[type[T.DataType], ...]] = {"text": (T.StringType,), "boolean": (T.BooleanType,)}
_PLAIN_TYPES |= dict.fromkeys(
    ("long", "integer", "short"), (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
)


def tantivy_fields(specs: list[FieldSpec], dtypes: dict[str, T.DataType]) -> list[Field]:
    used = {"_cdc_id", "_cdc_version", "_cdc_kind", "_cdc_row"}
    fields = []
    for i, spec in enumerate(specs):
        name = (
            spec.column
            if _PLAIN_FIELD.match(spec.column) and not spec.column.startswith("_cdc_")
            else f"col{i + 1}"
        )
        while name in used:
            name += "_"
        used.add(name)
        plain = spec.derived and isinstance(dtypes.get(spec.column), _PLAIN_TYPES.get(spec.type, ()))
        fields.append((spec.column, name, spec.type, spec.derived, plain))
    return fields


def build_schema(fields: list[Field]) -> tantivy.Schema:
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_text_field("_cdc_id", stored=True, tokenizer_name="raw")
    sb.add_integer_field("_cdc_version", stored=True, indexed=True, fast=True)
    sb.add_integer_field("_cdc_kind", stored=True, indexed=True, fast=True)
    sb.add_bytes_field("_cdc_row", stored=True, indexed=False)
    for _column, name, kind, _derived, _plain in fields:
        if kind == "text":
            sb.add_text_field(name, stored=False, tokenizer_name="default")
        elif kind == "keyword":
            sb.add_text_field(name, stored=False, tokenizer_name="raw")
        elif kind in ("long", "integer", "short"):
            sb.add_integer_field(name, indexed=True)
        elif kind in ("double", "float"):
            sb.add_float_field(name, indexed=True)
        elif kind == "boolean":
            sb.add_boolean_field(name, indexed=True)
        elif kind == "date":
            sb.add_date_field(name, indexed=True)
    return sb.build()


class RowRejected(Exception):
    """A value the column's (configured) field type cannot take."""


def _flat(value: list) -> Iterator[Any]:
    for v in value:
        if isinstance(v, list):
            yield from _flat(v)
        elif v is not None:
            yield v


def _text(v: Any) -> str:
    return v if type(v) is str else orjson.dumps(v).decode()


def _keyword(v: Any) -> str | None:
    text = v if type(v) is str else orjson.dumps(v).decode()
    return text if len(text) <= MAX_KEYWORD else None  # longer: kept in the row, too long for one term


def _int(v: Any) -> int:
    if type(v) is int:
        return v
    if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
        raise ValueError(f"{v!r} is not an integer")
    return int(v)


def _float(v: Any) -> float | None:
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not a number")
    number = float(v)
    return number if number - number == 0 else None  # NaN, ±inf: not indexed


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{v!r} is not a boolean")
    return v


def _date(v: Any) -> dt.datetime:
    if isinstance(v, str):
        value = dt.datetime.fromisoformat(v)  # "YYYY-MM-DD", "YYYY-MM-DDTHH:MM:SS.ffffff[Z]"
        return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
    if isinstance(v, int) and not isinstance(v, bool):
        return _EPOCH + dt.timedelta(
            milliseconds=v
        )  # epoch milliseconds, as OpenSearch reads numbers for dates
    raise ValueError(f"{v!r} is not a date")


Converter = Callable[[Any], Any]

_CONVERT: dict[str, Converter] = {
    "text": _text,
    "keyword": _keyword,
    "long": _int,
    "integer": _int,
    "short": _int,
}
_CONVERT |= {"double": _float, "float": _float, "boolean": _bool, "date": _date}


def _converter(field: Field) -> Converter | None:
    """A JSON value -> the value the field takes (None: nothing to index). None for a plain field."""
    column, _name, kind, derived, plain = field
    convert = _CONVERT[kind]
    if plain:
        return None

    def conv(v: Any) -> Any:
        try:
            return convert(v)
        except (ValueError, TypeError, OverflowError) as exc:
            if derived:
                return None  # a derived field is lenient: the value stays in the row only
            raise RowRejected(f"column {column!r} (field type {kind}): {exc}") from None

    return conv


class DocumentMaker:
    """Builds the tantivy documents of one index: one `Document.from_dict` call per document."""

    def __init__(self, fields: list[Field], schema: Any) -> None:
        import tantivy

        self.from_dict = tantivy.Document.from_dict
        self.schema = schema
        self.fields = [(f[0], f[1], _converter(f)) for f in fields if f[2] in _CONVERT]

    def __call__(
        self, doc_id: str, version: int, kind: int, row: dict | None = None, row_json: bytes | None = None
    ):
        doc: dict[str, Any] = {"_cdc_id": doc_id, "_cdc_version": version, "_cdc_kind": kind}
        if kind == ROW:
            assert row is not None
            doc["_cdc_row"] = row_json if row_json is not None else orjson.dumps(row)
            for column, name, conv in self.fields:
                value = row.get(column)
                if value is None:
                    continue
                if isinstance(value, list):
                    values = [x for v in _flat(value) if (x := v if conv is None else conv(v)) is not None]
                    if values:
                        doc[name] = values
                elif conv is None:
                    doc[name] = value
                elif (x := conv(value)) is not None:
                    doc[name] = x
        try:
            return self.from_dict(doc, self.schema)
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. an integer beyond 64 bits
            raise RowRejected(f"document {doc_id!r}: {exc}") from None


# ---- index directory -----------------------------------------------------------------------------
MARKER_FILE = "cdc_follower.json"  # the follower's marker (sinks/marker.py)


def read_sidecar(table_dir: Path) -> dict | None:
    try:
        return json.loads((table_dir / SIDECAR).read_text())
    except FileNotFoundError:
        return None


def write_sidecar(table_dir: Path, data: dict) -> None:
    tmp = table_dir / (SIDECAR + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, table_dir / SIDECAR)


def open_index(table_dir: Path) -> tuple[tantivy.Index, dict] | None:
    """The current generation of a table's index (for reading), None if there is none."""
    import tantivy

    meta = read_sidecar(table_dir)
    if meta is None:
        return None
    path = table_dir / f"g{meta['generation']}"
    if not tantivy.Index.exists(str(path)):
        return None
    return tantivy.Index.open(str(path)), meta


def _rebuild(
    old: tantivy.Index,
    path: Path,
    fields: list[Field],
    renames: dict[str, tuple[str, ...]] | None = None,
    below: int | None = None,
    fills: dict[str, Any] | None = None,
) -> tantivy.Index:
    """A new index with `fields`, holding every document of `old` (rows re-indexed from `_cdc_row`,
    members of renamed source columns under their new names) except those with a version under
    `below`, which the batch deletes anyway (a new base): a re-base that changed a column's type
    (int -> text) must not re-index the old rows into the new field type. A row written before a
    column with a fast default was added gets that value (`fills`: column -> value), as the
    source's row has it: stored and indexed, not only filled in when the sink reads it back."""
    import tantivy

    index = tantivy.Index(build_schema(fields), path=str(path))
    writer = index.writer(WRITER_HEAP)
    searcher = old.searcher()
    make = DocumentMaker(fields, index.schema)
    if searcher.num_docs:
        for _score, addr in searcher.search(tantivy.Query.all_query(), searcher.num_docs, count=False).hits:
            stored = searcher.doc(addr)
            doc_id, version, kind = (_stored(stored, f) for f in ("_cdc_id", "_cdc_version", "_cdc_kind"))
            if below is not None and version < below:
                continue
            raw = stored.get_first("_cdc_row") if kind == ROW else None
            try:
                row = orjson.loads(raw) if raw is not None else None
                if row is not None and renames and renamed_row(row, renames):
                    raw = None  # stored again from the renamed row
                if row is not None and fills and any(c not in row for c in fills):
                    row.update((c, v) for c, v in fills.items() if c not in row)
                    raw = None
                writer.add_document(make(doc_id, version, kind, row, raw))
            except RowRejected as exc:
                writer.rollback()
                raise RowRejected(f"{exc} (document {doc_id!r}, while re-indexing for new fields)") from None
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    return index


def writable_index(
    table_dir: Path,
    table: str,
    schema_json: dict,
    fields: list[Field],
    renames: dict[str, tuple[str, ...]] | None = None,
    below: int | None = None,
    fills: dict[str, Any] | None = None,
) -> tantivy.Index:
    """The index to write this batch into: created, reused, or rebuilt when the fields changed or
    a source column it holds was renamed (documents under version `below` left out, and `fills`
    given to rows that lack them, see _rebuild)."""
    import tantivy

    table_dir.mkdir(parents=True, exist_ok=True)
    meta = read_sidecar(table_dir)
    wanted = [list(f) for f in fields]
    current = None
    if meta is not None:
        path = table_dir / f"g{meta['generation']}"
        if tantivy.Index.exists(str(path)):
            current = tantivy.Index.open(str(path))
    renaming = meta is not None and bool(renames) and pending_renames(meta["schema"], renames or {})
    if current is not None and meta is not None and meta["fields"] == wanted and not renaming:
        index = current
        generation = meta["generation"]
    else:
        generation = (meta["generation"] + 1) if meta is not None else 1
        path = table_dir / f"g{generation}"
        shutil.rmtree(path, ignore_errors=True)  # a rebuild that died half-way
        path.mkdir(parents=True)
        if current is not None:
            index = _rebuild(current, path, fields, renames, below, fills)
        else:
            index = tantivy.Index(build_schema(fields), path=str(path))
    new_meta = {
        "format": 1,
        "table": table,
        "generation": generation,
        "schema": schema_json,
        "fields": wanted,
    }
    if new_meta != meta:
        write_sidecar(table_dir, new_meta)
        if meta is not None and meta["generation"] != generation:
            shutil.rmtree(table_dir / f"g{meta['generation']}", ignore_errors=True)
    return index


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


def _stored(doc: tantivy.Document, name: str) -> Any:
    """A field every document cdc writes stores (tantivy types get_first optional)."""
    value = doc.get_first(name)
    if value is None:
        raise ValueError(f"a document in the index lacks its {name} field: the index was not written by cdc")
    return value


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
