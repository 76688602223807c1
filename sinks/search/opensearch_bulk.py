"""What a search sink's Spark executors run against OpenSearch: a batch's rows written with the bulk
API (each document with its external version, so OpenSearch itself rejects a stale write; items
refused with 429 retried with backoff; unchanged TOAST columns fetched first), and the scroll reads
of `cdc verify`. Also the wording of OpenSearch failures the driver shares. The driver's side is
opensearch_index.py (index names, mappings, generations) and opensearch_engine.py (the sink); how
it behaves for an operator: README, "OpenSearch followers".
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from cdc.ground.executor_secrets import ExecutorSecretMissing
from cdc.ground.secrets import redact_with
from sinks.search.opensearch_client import ClientSettings, make_client
from sinks.search.rows import Row, RowLayout, encoders
from sinks.search.sink import PartitionResult, error_result, ok_result

if TYPE_CHECKING:
    from opensearchpy import OpenSearch

_RETRY_429 = 6
FIX_UNREACHABLE = (
    "start OpenSearch (`cdc dev up opensearch` for a local one) or correct `hosts` in the pipeline file; "
    "the follower keeps its checkpoint and the next `cdc apply` resumes from it"
)


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


def failure_reason(exc: BaseException) -> str:
    """Why a connection failed, in a few words (the OS error, or a timeout)."""
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\] ([^')\]]+)", text)
    if m:
        return m.group(1).strip()
    if "timed out" in text.lower() or type(exc).__name__ == "ConnectionTimeout":
        return "timed out"
    return type(exc).__name__


def error_text(error: Any) -> str:
    """OpenSearch's error object of a refused request or document as one line."""
    if isinstance(error, dict):
        text = f"{error.get('type', 'error')}: {error.get('reason', '')}".strip()
        cause = error.get("caused_by")
        if isinstance(cause, dict) and cause.get("reason"):
            text += f" (caused by {cause.get('type')}: {cause.get('reason')})"
        return text
    return str(error)


@dataclass
class BulkCounts:
    """A task's documents by outcome (the counts of its PartitionResult)."""

    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    stale: int = 0  # not newer than the stored version, or older than the table's last truncate

    def accepted(self, result: str | None) -> None:
        """A document OpenSearch took, by its bulk item's `result` (a "noop" changed nothing)."""
        if result == "created":
            self.inserted += 1
        elif result == "updated":
            self.updated += 1
        elif result == "deleted":
            self.deleted += 1

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.inserted, self.updated, self.deleted, self.stale)


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
        if row.values is None:  # a delete
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
        values = row.values
        assert values is not None  # a delete has no unchanged columns
        for column in row.unchanged:
            if source is None:
                values[column] = None  # nothing to keep: as a fresh insert would be
            elif column in source:
                values[column] = source[column]
            else:
                del values[column]  # the document never had it: keep it absent


def _send(client: OpenSearch, plan: BulkPlan, rows: list[Row], counts: BulkCounts) -> tuple[str, str] | None:
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
                counts.accepted(res.get("result"))
            elif status == 404 and action == "delete":
                pass  # deleting a key the index never had: the tombstone still records the version
            elif status == 409:
                counts.stale += 1  # not newer than the stored version: a replay or a late write
            elif status == 429:
                retry.append(row)
            else:
                return (
                    f"{plan.layout.table}: OpenSearch rejected the document for key {row.show_key(plan.layout)} "
                    f"(index {plan.index}, HTTP {status}): {error_text(res.get('error'))}",
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

    counts = BulkCounts()
    try:
        client = make_client(plan.client)
        codecs = encoders(plan.layout)
        chunk: list[Row] = []
        for raw in rows:
            row = Row(plan.layout, codecs, raw)
            if row.version < plan.truncate:
                counts.stale += 1
                continue
            chunk.append(row)
            if len(chunk) >= plan.bulk_actions:
                problem = _send(client, plan, chunk, counts)
                chunk = []
                if problem:
                    return iter([error_result(*problem, counts.as_tuple())])
        if chunk:
            problem = _send(client, plan, chunk, counts)
            if problem:
                return iter([error_result(*problem, counts.as_tuple())])
    except ExecutorSecretMissing as exc:  # the driver makes it exit 3 naming the variable
        return iter([error_result(str(exc), None, counts.as_tuple())])
    except OsConnectionError as exc:
        return iter(
            [
                error_result(
                    f"OpenSearch at {show_hosts(plan.client.hosts)} is unreachable ({failure_reason(exc)})",
                    FIX_UNREACHABLE,
                    counts.as_tuple(),
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
                    counts.as_tuple(),
                )
            ]
        )
    return iter([ok_result(*counts.as_tuple())])


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
