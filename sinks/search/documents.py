"""What a search follower stores per source row, shared by both engines (tantivy, OpenSearch).

**One document per key.** The document id is the key: the single key column's value as text
(`42`, `alice`, `2024-01-01`), or the JSON array of the key values for a composite key
(`[7,"x"]`); an id longer than 512 bytes (OpenSearch's limit) becomes `#sha256:<hex>`. The
document holds every source column as a JSON value (json_values.py); what is *searchable* is
decided per column by its field type (fields.py).

**Position -> version.** A document carries one integer that orders like the position
(commit LSN, index in the transaction) of the change that wrote it:

    version = 2 * lsn + (1 if seq > 0 else 0)

Collapsing `seq` to one bit is safe because two changes of the same key never compare with
the same LSN and different seq > 0: within one batch a key appears once (the net change), and
a transaction (one commit LSN) never spans batches, so two versions of one key from different
batches have different commit LSNs. The only same-LSN pair that can meet is a snapshot row
at (consistent point, 0) and a stream change committed at that LSN, (cp, k > 0): 2cp < 2cp + 1
keeps the stream change newer. A replayed change has the same version (not newer: ignored),
an older one a smaller version. LSNs are below 2^62 in practice, so the version fits a signed
64-bit integer (OpenSearch's external version, tantivy's i64 field).

**Truncate.** A truncate at position p deletes every document with version < version(p) and
the follower remembers version(p): later writes older than that are dropped, so a late
write cannot bring back a truncated row. A table starting over from a new snapshot (bootstrap)
is a truncate at (snapshot LSN, 0).

Where the rest lives: the field types per column in fields.py, the JSON values a document holds
(and back, for `cdc verify`) in json_values.py, a batch as the rows the executors write in rows.py.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

import orjson

from sinks.changes import Batch

MAX_ID_BYTES = 512


def version(lsn: int, seq: int) -> int:
    """The position (lsn, seq) as one orderable integer (see the module docstring)."""
    return 2 * lsn + (1 if seq > 0 else 0)


def truncate_version(batch: Batch) -> int | None:
    """Version below which the batch empties the table (new base or truncate), or None."""
    found = []
    if batch.bootstrap and batch.snapshot_lsn is not None:
        found.append(version(batch.snapshot_lsn, 0))
    if batch.truncate_position is not None:
        found.append(version(*batch.truncate_position))
    return max(found) if found else None


# ---- document ids and display --------------------------------------------------------------------
def renamed_row(row: dict, renames: dict[str, tuple[str, ...]]) -> bool:
    """Rename a stored row's members after source column renames (new name -> older names); True if any was."""
    changed = False
    for new, olds in renames.items():
        old = next((o for o in olds if o in row), None) if new not in row else None
        if old is not None:
            row[new] = row.pop(old)
            changed = True
    return changed


def pending_renames(schema_json: dict, renames: dict[str, tuple[str, ...]]) -> bool:
    """Whether the index was written with a column under a name it has since lost."""
    names = {c[0] for c in schema_json.get("columns", [])}
    return any(new not in names and any(o in names for o in olds) for new, olds in renames.items())


def doc_id(key_values: list[Any]) -> str:
    """The document id of a key, from its JSON values."""
    if len(key_values) == 1 and isinstance(key_values[0], str):
        text = key_values[0]
    elif len(key_values) == 1:
        text = orjson.dumps(key_values[0]).decode()
    else:
        text = orjson.dumps(key_values).decode()
    if len(text.encode()) > MAX_ID_BYTES:
        return "#sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text


def show_key(names: Iterable[str], values: Iterable[Any]) -> str:
    return ", ".join(f"{n}={v!r}" for n, v in zip(names, values, strict=True))


def render_row(doc: dict, columns: list[str], skip: Iterable[str] = (), width: int = 160) -> str:
    """A short one-line rendering of a document for `cdc search`."""
    skipped = set(skip)
    parts = []
    for name in columns:
        if name in skipped or name not in doc:
            continue
        value = doc[name]
        text = value if isinstance(value, str) else orjson.dumps(value).decode()
        if len(text) > 60:
            text = text[:57] + "..."
        parts.append(f"{name}={text}")
    line = " | ".join(parts)
    return line if len(line) <= width else line[: width - 3] + "..."


# ---- errors --------------------------------------------------------------------------------------
_PY_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception)): (.+)$", re.M)


def spark_failure(exc: BaseException) -> str:
    """A one-line reason from an exception Spark raised for a failed task (no Java/Py4J stack)."""
    text = str(exc)
    found = _PY_ERROR.findall(text)
    if found:
        kind, message = found[-1]
        return f"{kind}: {message.strip()}"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:300]
