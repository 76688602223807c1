"""`engine: opensearch`: one OpenSearch index per table, written with the bulk API from Spark
executors; OpenSearch itself rejects stale writes (external versioning).

* **Index** `<index_prefix>.<schema>.<table>` (lower case; characters an index name cannot hold
  become `_`, and then a short hash of the real name is appended so two tables never share an
  index). That name is an alias of the concrete index `<name>-g<generation>`, so the index can
  be rebuilt with other field types and switched atomically (see Schema changes). Settings: `number_of_shards` (`shards`, default 1), `number_of_replicas`
  (`replicas`, default the cluster's), `index.gc_deletes` (`gc_deletes`, default 7d; see
  below). Mapping: `dynamic: strict`, one field per source column with the field type of
  sinks/search/documents.py, plus `_cdc_version`, `_cdc_lsn`, `_cdc_seq` (long). The index
  `_meta.cdc` holds the source schema the index was written with (for `cdc verify` and
  `cdc search`) and the table's truncate version.
* **Writes**: document id = the key, `version` = the change's version with
  `version_type: external`. OpenSearch applies a write only if its version is greater than the
  stored one (deletes included), so a replayed or late change gets 409, which is expected and
  counted as "not newer" (ignored). A delete leaves a tombstone with its version that
  OpenSearch remembers for `index.gc_deletes` (OpenSearch's default is 60 s; we set 7d): a
  write older than the delete arriving within that time is rejected; after it, it could bring
  the document back, so keep `gc_deletes` above the longest delay a replay can have.
  Any other rejected document (400 mapping conflict, 413, ...) stops the batch: the error
  names the table, the key and OpenSearch's reason; the checkpoint stays on the pending cut.
  Bulk items rejected with 429 (queue full) are retried with backoff.
* **Truncate / new base**: the table's truncate version is first recorded in the index
  `_meta`, then `delete_by_query` removes every document with `_cdc_version` below it (after a
  refresh, so nothing written earlier is missed). Executors drop changes older than the
  recorded truncate version, which the versions alone could not do (the tombstones
  delete_by_query leaves carry the deleted document's older version). Both steps are repeated
  when the same batch is applied again, so a crash between them is harmless.
* **Unchanged TOAST values**: OpenSearch cannot do a partial update with an external version,
  so for rows with unchanged columns the executor first fetches the stored documents (one
  `mget` per bulk chunk, only for those rows) and copies the stored values of the unchanged
  columns into the new document, which is then written with its version like any other.
  Only one apply runs per follower at a time, so the document cannot change in between (and if
  the stored document is newer, the write is rejected by its version anyway).
* After a table's writes the index is refreshed, so `cdc search` and `cdc verify` see them.
* **Schema changes**: a new source column becomes a new field (put mapping); one with a
  constant DEFAULT makes the next generation (below), whose copied documents get the default
  where they lack the member (written before the column existed, as the source's rows have
  it: a query on the field finds them). A field whose
  type must change (the source column's type changed, or `fields:` was edited, e.g. after a
  rejected document) cannot be remapped in place: `prepare` creates the next generation with
  the new mapping, copies the documents into it with `_reindex` keeping their versions
  (`version_type: external`), moves the alias and deletes the old generation, all before the
  batch is written (a table starting over from a new base gets an empty generation instead).
  A reindex forgets the old generation's delete tombstones: only the truncate version and the
  documents' own versions guard the new one. A document the new mapping rejects stops the
  batch, named by key; the old generation stays in use. A renamed source column also makes
  the next generation: `_reindex` renames the member with a script (REINDEX_SCRIPT). Fields of
  dropped columns stay mapped in every later generation (documents keep them).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from cdc.ground.errors import EngineSettingError, SinkError
from cdc.ground.executor_secrets import ExecutorSecretMissing
from cdc.ground.secrets import redact_with
from cdc.ground.tables import TableName
from cdc.log.base import TableSchema
from sinks.changes import TableBatch
from sinks.executor_env import missing_error, provide
from sinks.search.documents import FieldSpec, Row, RowLayout, encoders, pending_renames
from sinks.search.opensearch_client import ClientSettings, make_client
from sinks.search.sink import PartitionResult, SearchSink, SearchStats, WriteJob, error_result, ok_result
from sinks.shaping import follower_name

if TYPE_CHECKING:
    from opensearchpy import OpenSearch
    from pyspark import RDD

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
_RETRY_429 = 6
_COUNTED = {
    "created": 0,
    "updated": 1,
    "deleted": 2,
}  # bulk item result -> counts index (inserted, updated, deleted)
FIX_UNREACHABLE = (
    "start OpenSearch (`cdc dev up opensearch` for a local one) or correct `hosts` in the pipeline file; "
    "the follower keeps its checkpoint and the next `cdc apply` resumes from it"
)


# ---- names and mappings ----------------------------------------------------------------------------
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


def _mapped_type(properties: dict, column: str) -> str | None:
    """The type a column's field has in an index mapping (dotted names are object paths)."""
    node: dict | None = {"properties": properties}
    for part in column.split("."):
        if node is None:
            return None
        node = node.get("properties", {}).get(part)
    if node is None:
        return None
    return node.get("type", "object")


def show_hosts(hosts: Iterable[str]) -> str:
    """Node URLs without credentials."""
    shown = []
    for host in hosts:
        parts = urlsplit(host if "//" in host else f"//{host}")
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        shown.append(urlunsplit((parts.scheme, netloc, parts.path, "", "")) if parts.scheme else netloc)
    return ", ".join(shown)


def _reason(exc: BaseException) -> str:
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\] ([^')\]]+)", text)
    if m:
        return m.group(1).strip()
    if "timed out" in text.lower() or type(exc).__name__ == "ConnectionTimeout":
        return "timed out"
    return type(exc).__name__


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        text = f"{error.get('type', 'error')}: {error.get('reason', '')}".strip()
        cause = error.get("caused_by")
        if isinstance(cause, dict) and cause.get("reason"):
            text += f" (caused by {cause.get('type')}: {cause.get('reason')})"
        return text
    return str(error)


# ---- executors ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BulkPlan:
    client: ClientSettings  # hosts, timeout and the sign-in/TLS settings (opensearch_client.py)
    index: str
    layout: RowLayout
    truncate: int  # changes below this version are older than the table's last truncate: dropped
    bulk_actions: int
    rejected_fix: str = ""  # SearchSink.rejected_fix(), built on the driver (it has the pipeline file)


def _body(plan: BulkPlan, rows: list[Row]) -> bytes:
    lines = []
    for row in rows:
        meta = {"_index": plan.index, "_id": row.id, "version": row.version, "version_type": "external"}
        if row.op == "d":
            lines.append(orjson.dumps({"delete": meta}))
        else:
            doc = dict(row.values)
            doc["_cdc_version"], doc["_cdc_lsn"], doc["_cdc_seq"] = row.version, row.lsn, row.seq
            lines.append(orjson.dumps({"index": meta}))
            lines.append(orjson.dumps(doc))
    return b"\n".join(lines) + b"\n"


def _keep_unchanged(client: OpenSearch, plan: BulkPlan, rows: list[Row]) -> None:
    """Unchanged TOAST columns take the value the index holds for the key."""
    flagged = [r for r in rows if r.unchanged]
    if not flagged:
        return
    resp = client.mget(index=plan.index, body={"ids": [r.id for r in flagged]})
    stored = {d["_id"]: d.get("_source", {}) for d in resp["docs"] if d.get("found")}
    for row in flagged:
        source = stored.get(row.id)
        for column in row.unchanged:
            if source is None:
                row.values[column] = None  # nothing to keep: as a fresh insert would be
            elif column in source:
                row.values[column] = source[column]
            else:
                del row.values[column]  # the document never had it: keep it absent


def _send(client: OpenSearch, plan: BulkPlan, rows: list[Row], counts: list[int]) -> tuple[str, str] | None:
    _keep_unchanged(client, plan, rows)
    pending = rows
    for attempt in range(_RETRY_429):
        resp = client.bulk(
            body=_body(plan, pending), filter_path="items.*.status,items.*.result,items.*.error"
        )
        retry = []
        for row, item in zip(pending, resp["items"], strict=True):
            ((action, res),) = item.items()
            status = res.get("status", 0)
            if status in (200, 201):
                slot = _COUNTED.get(res.get("result"))
                if slot is not None:
                    counts[slot] += 1
            elif status == 404 and action == "delete":
                pass  # deleting a key the index never had: the tombstone still records the version
            elif status == 409:
                counts[3] += 1  # not newer than the stored version: a replay or a late write
            elif status == 429:
                retry.append(row)
            else:
                return (
                    f"{plan.layout.table}: OpenSearch rejected the document for key {row.show_key(plan.layout)} "
                    f"(index {plan.index}, HTTP {status}): {_error_text(res.get('error'))}",
                    plan.rejected_fix,
                )
        if not retry:
            return None
        pending = retry
        time.sleep(0.5 * 2**attempt)
    return (
        f"{plan.layout.table}: OpenSearch kept refusing bulk writes with 429 (too many requests) to index {plan.index}",
        "give the cluster more capacity or lower `bulk_actions`; the next `cdc apply` applies the batch again",
    )


def bulk_partition(plan: BulkPlan, rows: Iterable[tuple]) -> Iterator[PartitionResult]:
    """One executor task: its rows of the batch into OpenSearch, in bulk requests."""
    from opensearchpy.exceptions import ConnectionError as OsConnectionError

    counts = [0, 0, 0, 0]  # inserted, updated, deleted, stale
    try:
        client = make_client(plan.client)
        codecs = encoders(plan.layout)
        chunk: list[Row] = []
        for raw in rows:
            row = Row(plan.layout, codecs, raw)
            if row.version < plan.truncate:
                counts[3] += 1
                continue
            chunk.append(row)
            if len(chunk) >= plan.bulk_actions:
                problem = _send(client, plan, chunk, counts)
                chunk = []
                if problem:
                    return iter([error_result(*problem, tuple(counts))])
        if chunk:
            problem = _send(client, plan, chunk, counts)
            if problem:
                return iter([error_result(*problem, tuple(counts))])
    except ExecutorSecretMissing as exc:  # the driver makes it exit 3 naming the variable
        return iter([error_result(str(exc), None, tuple(counts))])
    except OsConnectionError as exc:
        return iter(
            [
                error_result(
                    f"OpenSearch at {show_hosts(plan.client.hosts)} is unreachable ({_reason(exc)})",
                    FIX_UNREACHABLE,
                    tuple(counts),
                )
            ]
        )
    except Exception as exc:
        return iter(
            [
                error_result(
                    f"{plan.layout.table}: writing to OpenSearch index {plan.index} failed: {type(exc).__name__}: "
                    + redact_with(str(exc), plan.client.secrets),
                    "the next `cdc apply` applies the batch again",
                    tuple(counts),
                )
            ]
        )
    return iter([ok_result(*counts)])


def read_slice(cs: ClientSettings, index: str, slices: int, slice_id: int) -> Iterator[dict]:
    """One executor task: one slice of the index's documents (scroll), as their `_source`."""
    client = make_client(cs)
    body: dict[str, Any] = {"size": 1000, "sort": ["_doc"], "query": {"match_all": {}}}
    if slices > 1:
        body["slice"] = {"id": slice_id, "max": slices}
    resp = client.search(index=index, body=body, scroll="5m")
    scroll_id = resp.get("_scroll_id")
    try:
        while resp["hits"]["hits"]:
            for hit in resp["hits"]["hits"]:
                yield hit["_source"]
            resp = client.scroll(body={"scroll_id": scroll_id, "scroll": "5m"})
            scroll_id = resp.get("_scroll_id", scroll_id)
    finally:
        if scroll_id:
            with contextlib.suppress(Exception):  # the scroll expires by itself
                client.clear_scroll(body={"scroll_id": [scroll_id]})


# ---- the sink ----------------------------------------------------------------------------------------
class OpenSearchSink(SearchSink):
    engine = "opensearch"

    @property
    def hosts(self) -> list[str]:
        return list(self.settings.hosts or [])

    @property
    def prefix(self) -> str:
        return self.settings.index_prefix or self.pipeline.name

    def index_of(self, table: TableName) -> str:
        # table_options rename: the name itself (checked as a valid lower-case index name), no prefix
        return follower_name(self.config, table) or index_name(self.prefix, table)

    def describe(self) -> str:
        return f"{self.name} (search, opensearch at {show_hosts(self.hosts)})"

    @property
    def client_settings(self) -> ClientSettings:
        return ClientSettings.of(self.settings, self.name)

    def client(self) -> OpenSearch:
        return make_client(self.client_settings)

    @contextmanager
    def calls(self, what: str) -> Iterator[None]:
        """OpenSearch client failures as SinkError: unreachable, or refused with its reason."""
        from opensearchpy.exceptions import ConnectionError as OsConnectionError
        from opensearchpy.exceptions import SSLError as OsSSLError
        from opensearchpy.exceptions import TransportError

        try:
            yield
        except OsSSLError as exc:
            raise self._tls_error(exc) from None
        except OsConnectionError as exc:
            raise SinkError(
                f"OpenSearch at {show_hosts(self.hosts)} is unreachable ({_reason(exc)})", FIX_UNREACHABLE
            ) from None
        except TransportError as exc:
            if exc.status_code in (401, 403):
                raise self._auth_error(exc.status_code, what) from None
            raise SinkError(
                f"OpenSearch at {show_hosts(self.hosts)} refused {what}: HTTP {exc.status_code} {_error_text(exc.info.get('error') if isinstance(exc.info, dict) else exc.info)}",
                "check the cluster's health and the user's rights; the next `cdc apply` resumes from the checkpoint",
            ) from None

    def _tls_error(self, exc: BaseException) -> EngineSettingError:
        """A refused TLS handshake (exit 3), naming the setting at fault; never a secret."""
        where, cs = f"sinks[{self.name}].search", self.client_settings
        text = str(exc)
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            why = re.search(r"certificate verify failed: ([^(')\]]+)", text)
            mismatch = "mismatch" in text.lower()
            return EngineSettingError(
                f"OpenSearch at {show_hosts(self.hosts)}: the node's TLS certificate was refused "
                f"({why.group(1).strip() if why else 'certificate verify failed'}); {where}.ca_file is "
                f"{cs.ca_file or 'not set (the system CAs)'}",
                f"set {where}.ca_file to the CA that signed the nodes' certificates"
                + (", or list the hosts by the name their certificates carry" if mismatch else ""),
            )
        return EngineSettingError(
            f"OpenSearch at {show_hosts(self.hosts)}: the TLS handshake failed ({_reason(exc) if 'Errno' in text else text[:200]})",
            f"check the hosts' scheme (https) and {where}.client_cert/client_key (a node that requires a client "
            f"certificate refuses the handshake without one), ca_file and verify_certs",
        )

    def _auth_error(self, status: int, what: str) -> EngineSettingError:
        """401 (sign-in refused) or 403 (signed in, not allowed) as exit 3, naming the settings."""
        where, cs = f"sinks[{self.name}].search", self.client_settings
        if cs.username is not None:
            who = f"{where}.username {cs.username!r}"
            check = f"{where}.username and {where}.password (its ${{ENV}} variable)"
        elif cs.sigv4_region:
            who = f"the AWS identity of {where}.aws_sigv4 (region {cs.sigv4_region}, service {cs.sigv4_service})"
            check = f"the AWS credentials and {where}.aws_sigv4's region and service"
        elif cs.client_cert:
            who = f"the client certificate {where}.client_cert"
            check = f"{where}.client_cert/client_key and how the cluster maps certificates to users"
        else:
            who = "an anonymous client (no username, client certificate or aws_sigv4 set)"
            check = f"{where}.username/password, client_cert/client_key or aws_sigv4"
        if cs.sigv4_region and cs.username is None:  # Amazon answers a bad signature with 403 too
            return EngineSettingError(
                f"OpenSearch at {show_hosts(self.hosts)} refused the SigV4-signed request of {who} for {what} "
                f"(HTTP {status}): credentials that do not match, another region or service, or an identity the "
                "domain's access policy does not allow",
                f"check {check}, and the domain's access policy (or the collection's data access policy)",
            )
        if status == 401:
            return EngineSettingError(
                f"OpenSearch at {show_hosts(self.hosts)} refused the sign-in of {who} (HTTP 401): wrong password, "
                "no such user, or credentials of another cluster",
                f"check {check}",
            )
        return EngineSettingError(
            f"OpenSearch at {show_hosts(self.hosts)} does not allow {who} {what} (HTTP 403)",
            "give that user a role with the index rights docs/security.md lists for the search sink "
            f"(indices {self.prefix}.*: create, write, read, manage aliases; cluster: monitor), or check {check}",
        )

    def _meta(self, client: OpenSearch, alias: str) -> tuple[str, dict, dict] | None:
        """(concrete index, properties, _meta.cdc) behind a table's alias, None if there is none."""
        if not client.indices.exists(index=alias):
            return None
        ((concrete, body),) = client.indices.get_mapping(index=alias).items()
        mapping = body["mappings"]
        return concrete, mapping.get("properties", {}), dict(mapping.get("_meta", {}).get("cdc", {}))

    # ---- marker (sinks/marker.py): `_meta.cdc.follower` of the table's index ---------------------
    markers = True
    reads_without_spark = True  # a client of the engine, no session (sinks/base.py)

    def has_table(self, table: TableName) -> bool:
        with self.calls("the index check"):
            return self._meta(self.client(), self.index_of(table)) is not None

    def clear_table(self, table: TableName) -> None:
        client, alias = self.client(), self.index_of(table)
        with self.calls("an index change"):
            if client.indices.exists(index=alias):
                client.indices.delete(index=list(client.indices.get_alias(index=alias)))

    def read_marker(self, table: TableName) -> str | None:
        with self.calls("the index check"):
            state = self._meta(self.client(), self.index_of(table))
        return None if state is None else state[2].get("follower")

    def write_marker(self, table: TableName, text: str) -> None:
        client, alias = self.client(), self.index_of(table)
        with self.calls("an index change"):
            state = self._meta(client, alias)
            if state is not None and state[2].get("follower") != text:
                client.indices.put_mapping(
                    index=alias, body={"_meta": {"cdc": state[2] | {"follower": text}}}
                )

    def _create(
        self,
        client: OpenSearch,
        alias: str,
        batch: TableBatch,
        specs: list[FieldSpec],
        meta: dict,
        keep: dict | None = None,
    ) -> str:
        """A new generation of a table's index (not yet behind the alias when one exists); `keep`:
        fields of the old generation the source no longer has (dropped columns), kept mapped."""
        generation = int(meta.get("generation", 0)) + 1
        concrete = f"{alias}-g{generation}"
        settings: dict[str, Any] = {
            "number_of_shards": self.settings.shards or 1,
            "gc_deletes": self.settings.gc_deletes,
        }
        if self.settings.replicas is not None:
            settings["number_of_replicas"] = self.settings.replicas
        properties = (keep or {}) | {s.column: field_mapping(s) for s in specs} | META_FIELDS
        meta = (
            {"truncate_version": 0}
            | meta
            | {"table": str(batch.table), "schema": batch.schema.to_json(), "generation": generation}
        )
        body: dict[str, Any] = {
            "settings": {"index": settings},
            "mappings": {"dynamic": "strict", "_meta": {"cdc": meta}, "properties": properties},
        }
        if client.indices.exists(index=concrete):  # left by a rebuild that died half-way
            client.indices.delete(index=concrete)
        if not client.indices.exists(index=alias):
            body["aliases"] = {alias: {}}
        client.indices.create(index=concrete, body=body)
        return concrete

    def _switch(
        self,
        client: OpenSearch,
        alias: str,
        old: str,
        new: str,
        batch: TableBatch,
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
                request_timeout=max(3600.0, self.settings.timeout_s),
            )
            failures = [f for f in done.get("failures", []) if f.get("status") != 409]
            if failures:
                client.indices.delete(index=new)
                first = failures[0]
                raise SinkError(
                    f"{batch.table}: OpenSearch rejected the document with id {first.get('id')!r} while rebuilding the "
                    f"index with the new field types ({len(failures)} failure(s)): {_error_text(first.get('cause'))}",
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

    # ---- prepare ---------------------------------------------------------------------------------
    def _fills(self, batch: TableBatch, new_columns: list[str]) -> dict[str, Any]:
        """The constant DEFAULTs of columns the index does not map yet, as documents hold them."""
        if not any(c in batch.defaults for c in new_columns):
            return {}  # no Spark job
        return {c: v for c, v in self._defaults(batch).items() if c in new_columns}

    def _prepare(self, batches: list[TableBatch], specs: dict[TableName, list[FieldSpec]]) -> None:
        client = self.client()
        actions = []
        with self.calls("the index check"):
            client.info()
            for batch in batches:
                alias = self.index_of(batch.table)
                wanted = {s.column: field_mapping(s) for s in specs[batch.table]}
                state = self._meta(client, alias)
                if state is None:
                    if not batch.bootstrap:
                        raise SinkError(
                            f"{batch.table}: OpenSearch index {alias} does not exist, but this follower has applied the table before",
                            f"rebuild this follower from the log's base: `{self.pipeline.command('reset', '--sink', self.name, '--rebuild', '--yes')}`",
                        )
                    actions.append(("create", batch, alias, None))
                    continue
                concrete, properties, meta = state
                changed = any(
                    (have := _mapped_type(properties, c)) is not None and have != m["type"]
                    for c, m in wanted.items()
                )
                fills = self._fills(batch, [c for c in wanted if _mapped_type(properties, c) is None])
                # A renamed source column, or a new one with a constant DEFAULT: a new generation, its
                # documents copied with the member renamed or the default given.
                if changed or fills or pending_renames(meta.get("schema", {}), batch.renames):
                    # Documents keep the members of dropped columns (the mapping is strict).
                    gone = {o for olds in batch.renames.values() for o in olds}
                    keep = {
                        c: m
                        for c, m in properties.items()
                        if c not in wanted and c not in META_FIELDS and c not in gone
                    }
                    actions.append(("rebuild", batch, alias, (concrete, meta, keep, fills)))
                    continue
                added = {c: m for c, m in wanted.items() if _mapped_type(properties, c) is None}
                actions.append(("update", batch, alias, (concrete, meta, added)))
        with self.calls("an index change"):
            for action, batch, alias, extra in actions:
                if action == "create":
                    self._create(client, alias, batch, specs[batch.table], {})
                elif action == "rebuild":
                    concrete, meta, keep, fills = extra
                    new = self._create(client, alias, batch, specs[batch.table], meta, keep)
                    self._switch(client, alias, concrete, new, batch, not batch.bootstrap, fills)
                else:
                    concrete, meta, added = extra
                    meta = meta | {"table": str(batch.table), "schema": batch.schema.to_json()}
                    client.indices.put_mapping(
                        index=alias, body={"_meta": {"cdc": meta}, "properties": added}
                    )
                    current = client.indices.get_settings(index=concrete, name="index.gc_deletes")
                    if (
                        current.get(concrete, {}).get("settings", {}).get("index", {}).get("gc_deletes")
                        != self.settings.gc_deletes
                    ):
                        client.indices.put_settings(
                            index=concrete, body={"index": {"gc_deletes": self.settings.gc_deletes}}
                        )

    # ---- apply -----------------------------------------------------------------------------------
    def _write(self, job: WriteJob) -> SearchStats:
        batch, truncate = job.batch, job.truncate
        client = self.client()
        index = self.index_of(batch.table)
        with self.calls(f"the truncate of {index}"):
            state = self._meta(client, index)
            if state is None:
                raise SinkError(
                    f"{batch.table}: OpenSearch index {index} disappeared during the apply",
                    "run `cdc apply` again",
                )
            meta = state[2]
            recorded = int(meta.get("truncate_version", 0))
            if truncate is not None and truncate >= recorded:
                if truncate > recorded:
                    meta["truncate_version"] = recorded = (
                        truncate  # first remember it: older writes are dropped from now on
                    )
                    client.indices.put_mapping(index=index, body={"_meta": {"cdc": meta}})
                client.indices.refresh(index=index)
                done = client.delete_by_query(
                    index=index,
                    body={"query": {"range": {"_cdc_version": {"lt": truncate}}}},
                    conflicts="proceed",
                    refresh=True,
                    slices="auto",
                    request_timeout=max(3600.0, self.settings.timeout_s),
                )
                if done.get("failures"):
                    raise SinkError(
                        f"{batch.table}: emptying OpenSearch index {index} for a truncate failed: {_error_text(done['failures'][0])}",
                        "the next `cdc apply` tries again",
                    )
        plan = BulkPlan(
            self.client_settings,
            index,
            job.layout,
            recorded,
            self.settings.bulk_actions,
            job.rejected_fix,
        )
        provide(self.spark, plan.client.refs)  # the tasks carry the passwords' variable names only
        try:
            stats = self.collect(
                str(batch.table),
                job.frame.rdd.mapPartitions(partial(bulk_partition, plan)),
                f"OpenSearch index {index}",
            )
        except SinkError as exc:
            raise missing_error(exc.problem, self.name) or exc from None
        with self.calls(f"the refresh of {index}"):
            client.indices.refresh(index=index)
        return stats

    # ---- reads -----------------------------------------------------------------------------------
    def stored_schema(self, table: TableName) -> TableSchema | None:
        with self.calls("reading the index mapping"):
            state = self._meta(self.client(), self.index_of(table))
        if state is None or "schema" not in state[2]:
            return None
        return TableSchema.from_json(state[2]["schema"])

    def documents(self, table: TableName) -> RDD:
        index = self.index_of(table)
        with self.calls("a refresh"):
            self.client().indices.refresh(index=index)
        slices = max(2, self.spark.sparkContext.defaultParallelism)
        cs = self.client_settings
        provide(self.spark, cs.refs)
        read = partial(read_slice, cs, index, slices)
        return self.spark.sparkContext.parallelize(range(slices), slices).flatMap(read)

    def search(
        self, table: TableName, query: str, limit: int
    ) -> tuple[int, int | None, list[tuple[float, dict[str, Any]]]]:
        from opensearchpy.exceptions import RequestError

        client = self.client()
        index = self.index_of(table)
        with self.calls("the search"):
            if not client.indices.exists(index=index):
                raise SinkError(
                    f"sink {self.name} has no index for {table} yet (index {index})", "run `cdc apply` first"
                )
            total = client.count(index=index)["count"]
            if total == 0:
                return 0, 0, []
            try:
                resp = client.search(
                    index=index,
                    body={
                        "query": {"query_string": {"query": query, "lenient": True}},
                        "size": limit,
                        "track_total_hits": True,  # the exact number of matches, not "10,000 or more"
                        "_source": {"excludes": ["_cdc_*"]},
                    },
                )
            except RequestError as exc:
                from cdc.ground.errors import UsageError

                raise UsageError(
                    f"invalid query {query!r}: {_error_text(exc.info.get('error') if isinstance(exc.info, dict) else exc.info)}"
                ) from None
        matched = resp["hits"].get("total")
        exact = isinstance(matched, dict) and matched.get("relation") == "eq"
        return (
            total,
            matched["value"] if exact else None,
            [(hit["_score"] or 0.0, hit["_source"]) for hit in resp["hits"]["hits"]],
        )
