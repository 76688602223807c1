"""A Delta table's latest table properties, and the idempotent-write version an app id committed,
read from its `_delta_log` files without Spark or a JVM (`cdc status`'s self-check of a follower,
docs/recovery-and-rewind.md).

Every commit that changes the table's metadata (creation, schema evolution, the marker's
`ALTER TABLE ... SET TBLPROPERTIES`) holds a whole `metaData` action, configuration included, so
the newest one wins: the JSON commits are read newest first and the first `metaData` found is the
answer. When those commits are gone (log cleanup after a checkpoint) the newest checkpoint's
Parquet file holds it (read with pyarrow). The follower's position (`txn_version`) is the newest
`txn` action of its app id: the latest version's checksum file lists every app id's (Delta writes
it after each commit), else the commits since the newest checkpoint, else that checkpoint.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

LOG_DIR = "_delta_log"
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.\d{10}\.\d{10})?\.parquet$")


class LogUnreadable(Exception):
    """The table's log holds no readable metadata (a format this reader does not know)."""


def is_delta_table(path: str | Path) -> bool:
    """A directory with a Delta log holding at least one commit or checkpoint."""
    log = Path(path) / LOG_DIR
    try:
        return any(_COMMIT.match(p.name) or _CHECKPOINT.match(p.name) for p in log.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return False


def _listing(log: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]], int]:
    """The log's commits and checkpoint files as (version, name), oldest first, and the newest
    checkpoint's version (-1: none)."""
    names = [p.name for p in log.iterdir()]
    commits = sorted((int(m.group(1)), n) for n in names if (m := _COMMIT.match(n)))
    checkpoints = sorted((int(m.group(1)), n) for n in names if (m := _CHECKPOINT.match(n)))
    return commits, checkpoints, checkpoints[-1][0] if checkpoints else -1


def latest_version(path: str | Path) -> int | None:
    """The table's newest version (None: no table there)."""
    try:
        commits, _, newest_checkpoint = _listing(Path(path) / LOG_DIR)
    except (FileNotFoundError, NotADirectoryError):
        return None
    newest = max([v for v, _ in commits] + [newest_checkpoint])
    return None if newest < 0 else newest


def txn_version(path: str | Path, app_id: str) -> int | None:
    """The newest idempotent-write version `app_id` committed to the table (None: none)."""
    log = Path(path) / LOG_DIR
    commits, checkpoints, newest_checkpoint = _listing(log)
    latest = max([v for v, _ in commits] + [newest_checkpoint])
    checksum = log / f"{latest:020d}.crc"
    if checksum.exists():
        try:
            known = json.loads(checksum.read_text()).get("setTransactions")
        except ValueError:  # half written: the commits below still say it
            known = None
        if isinstance(known, list):
            versions = [int(t["version"]) for t in known if t.get("appId") == app_id]
            return max(versions) if versions else None
    for version, name in reversed(commits):
        if version <= newest_checkpoint:
            break
        for line in (log / name).read_text().splitlines():
            if '"txn"' in line and (txn := json.loads(line).get("txn")) and txn.get("appId") == app_id:
                return int(txn["version"])
    if not checkpoints:
        return None
    import pyarrow.parquet as pq

    versions = []
    for part in [log / n for v, n in checkpoints if v == newest_checkpoint]:
        for txn in pq.read_table(part, columns=["txn"]).column("txn").to_pylist():
            if txn is not None and txn.get("appId") == app_id:
                versions.append(int(txn["version"]))
    return max(versions) if versions else None


def table_properties(path: str | Path) -> dict[str, str]:
    """The configuration of the table's newest metaData action; LogUnreadable when none is found."""
    return dict(table_metadata(path).get("configuration") or {})


def table_schema(path: str | Path) -> dict[str, Any]:
    """The table's schema as its newest metaData action holds it: Spark's StructType JSON."""
    return json.loads(table_metadata(path)["schemaString"])


def table_metadata(path: str | Path) -> dict[str, Any]:
    """The table's newest metaData action (its configuration as a dict); LogUnreadable when none is found."""
    log = Path(path) / LOG_DIR
    commits, checkpoints, newest_checkpoint = _listing(log)
    for version, name in reversed(commits):
        if version <= newest_checkpoint:
            break  # older commits are in the checkpoint, which is read below
        found = _metadata_in_commit(log / name)
        if found is not None:
            return found
    if checkpoints:
        return _metadata_in_checkpoint([log / n for v, n in checkpoints if v == newest_checkpoint])
    raise LogUnreadable(f"{log}: no metaData action in its commits")


def _metadata_in_commit(path: Path) -> dict[str, Any] | None:
    for line in path.read_text().splitlines():
        if '"metaData"' not in line:  # most lines are add/remove actions: skip them unparsed
            continue
        action = json.loads(line)
        if "metaData" in action:
            return dict(action["metaData"])
    return None


def _metadata_in_checkpoint(parts: list[Path]) -> dict[str, Any]:
    import pyarrow.parquet as pq

    for part in parts:
        table = pq.read_table(part, columns=["metaData"])
        for meta in table.column("metaData").to_pylist():
            if meta is not None:
                conf = meta.get("configuration") or []
                return {**meta, "configuration": dict(conf)}  # a map column reads as (key, value) pairs
    raise LogUnreadable(f"{parts[0].parent}: no metaData action in its checkpoint")
