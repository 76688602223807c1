"""Driver-side management of an OpenSearch follower's indexes: a table's index name, its field
mappings, and its generations. The name is an alias of the concrete index `<name>-g<generation>`:
a field whose type must change, a renamed column or a new one with a constant DEFAULT makes the
next generation (created, the documents copied in with `_reindex` keeping their versions, then
the alias moved and the old one deleted). When and why: docs/follower-search.md.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

from cdc.ground.errors import SinkError
from cdc.ground.tables import TableName
from sinks.changes import Batch
from sinks.search.fields import FieldSpec
from sinks.search.opensearch_bulk import error_text

if TYPE_CHECKING:
    from opensearchpy import OpenSearch

    from sinks.search.settings import SearchSettings

# Reindexing into the next generation: after source column renames each document's member moves
# to the column's new name; a new column with a constant DEFAULT gets it in the documents written
# before it existed (as the source's rows have it).
REINDEX_SCRIPT = """
for (def e : params.renames) {
  if (!ctx._source.containsKey(e.to)) {
    for (def o : e.from) {
      if (ctx._source.containsKey(o)) { ctx._source[e.to] = ctx._source.remove(o); break; }
    }
  }
}
for (def d : params.fills) {
  if (!ctx._source.containsKey(d.column)) { ctx._source[d.column] = d.value; }
}
"""
META_FIELDS = {"_cdc_version": {"type": "long"}, "_cdc_lsn": {"type": "long"}, "_cdc_seq": {"type": "long"}}
_BAD_INDEX_CHARS = re.compile(r'[\\/*?"<>|\s,#:]')


def index_name(prefix: str, table: TableName) -> str:
    raw = f"{prefix}.{table.schema}.{table.name}"
    name = _BAD_INDEX_CHARS.sub("_", raw.lower())
    if name[0] in "-_+.":
        name = "x" + name
    if name != raw or len(name.encode()) > 255:
        suffix = "-" + hashlib.sha1(raw.encode()).hexdigest()[:8]
        name = name.encode()[: 255 - len(suffix)].decode(errors="ignore") + suffix
    return name


def field_mapping(spec: FieldSpec) -> dict[str, Any]:
    t = spec.type
    if t == "text":
        return {"type": "text"}
    if t == "keyword":
        return {
            "type": "keyword",
            "ignore_above": 8191,
        }  # longer values: kept, not indexed (Lucene's term limit)
    if t == "stored":
        return {"type": "object", "enabled": False}
    if t in ("binary", "boolean"):
        return {"type": t}
    mapping: dict[str, Any] = {"type": t}
    if t == "date":
        mapping["format"] = "strict_date_optional_time||epoch_millis"
    if spec.derived:
        mapping["ignore_malformed"] = True  # NaN, dates after 9999: kept in the document, not indexed
    return mapping


def mapped_type(properties: dict, column: str) -> str | None:
    """The type a column's field has in an index mapping (dotted names are object paths)."""
    node: dict | None = {"properties": properties}
    for part in column.split("."):
        if node is None:
            return None
        node = node.get("properties", {}).get(part)
    if node is None:
        return None
    return node.get("type", "object")


def index_state(client: OpenSearch, alias: str) -> tuple[str, dict, dict] | None:
    """(concrete index, properties, _meta.cdc) behind a table's alias, None if there is none."""
    if not client.indices.exists(index=alias):
        return None
    ((concrete, body),) = client.indices.get_mapping(index=alias).items()
    mapping = body["mappings"]
    return concrete, mapping.get("properties", {}), dict(mapping.get("_meta", {}).get("cdc", {}))


def create_generation(
    client: OpenSearch,
    settings: SearchSettings,
    alias: str,
    batch: Batch,
    specs: list[FieldSpec],
    meta: dict,
    keep: dict | None = None,
) -> str:
    """A new generation of a table's index (not yet behind the alias when one exists); `keep`:
    fields of the old generation the source no longer has (dropped columns), kept mapped."""
    generation = int(meta.get("generation", 0)) + 1
    concrete = f"{alias}-g{generation}"
    index_settings: dict[str, Any] = {
        "number_of_shards": settings.shards or 1,
        "gc_deletes": settings.gc_deletes,
    }
    if settings.replicas is not None:
        index_settings["number_of_replicas"] = settings.replicas
    properties = (keep or {}) | {s.column: field_mapping(s) for s in specs} | META_FIELDS
    meta = (
        {"truncate_version": 0}
        | meta
        | {"table": str(batch.table), "schema": batch.schema.to_json(), "generation": generation}
    )
    body: dict[str, Any] = {
        "settings": {"index": index_settings},
        "mappings": {"dynamic": "strict", "_meta": {"cdc": meta}, "properties": properties},
    }
    if client.indices.exists(index=concrete):  # left by a rebuild that died half-way
        client.indices.delete(index=concrete)
    if not client.indices.exists(index=alias):
        body["aliases"] = {alias: {}}
    client.indices.create(index=concrete, body=body)
    return concrete


def switch_generation(
    client: OpenSearch,
    timeout_s: float,
    alias: str,
    old: str,
    new: str,
    batch: Batch,
    copy: bool,
    fills: dict[str, Any],
) -> None:
    """Copy the documents of `old` into `new` (keeping their versions; members renamed, `fills`
    given to documents that lack them), then move the alias."""
    if copy:
        body: dict[str, Any] = {
            "source": {"index": old},
            "dest": {"index": new, "version_type": "external"},
            "conflicts": "proceed",
        }
        if batch.renames or fills:
            body["script"] = {
                "lang": "painless",
                "source": REINDEX_SCRIPT,
                "params": {
                    "renames": [{"to": to, "from": list(olds)} for to, olds in batch.renames.items()],
                    "fills": [{"column": c, "value": v} for c, v in fills.items()],
                },
            }
        done = client.reindex(
            body=body,
            refresh=True,
            request_timeout=max(3600.0, timeout_s),
        )
        failures = [f for f in done.get("failures", []) if f.get("status") != 409]
        if failures:
            client.indices.delete(index=new)
            first = failures[0]
            raise SinkError(
                f"{batch.table}: OpenSearch rejected the document with id {first.get('id')!r} while rebuilding the "
                f"index with the new field types ({len(failures)} failure(s)): {error_text(first.get('cause'))}",
                "choose field types that fit the stored values (`fields:` in the sink's settings); the old index stays in use",
            )
    client.indices.update_aliases(
        body={
            "actions": [
                {"remove": {"index": old, "alias": alias}},
                {"add": {"index": new, "alias": alias}},
            ]
        }
    )
    client.indices.delete(index=old)
