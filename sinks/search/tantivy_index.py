"""A tantivy follower's index directory per table: the `cdc.json` sidecar (the generation, the source
schema, the fields), opening the current generation, and an index writable with given fields, rebuilt
into the next generation from the stored documents when the fields differ or a column was renamed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from sinks.search.documents import pending_renames, renamed_row
from sinks.search.tantivy_documents import ROW, DocumentMaker, Field, RowRejected, _stored, build_schema

if TYPE_CHECKING:
    import tantivy


SIDECAR = "cdc.json"
WRITER_HEAP = 128_000_000


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
