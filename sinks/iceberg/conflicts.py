"""Iceberg's optimistic concurrency between `cdc apply` and `cdc maintain` (docs/follower-iceberg.md, upkeep).

Neither holds a lock: each commit is checked against what was committed since its snapshot.
Iceberg retries a commit whose base moved by itself (`commit.retry.num-retries`) when nothing it
read was changed; one that really conflicts (a MERGE's position deletes name a data file a
compaction replaced, a compaction's files got new deletes) fails without writing anything and is
simply tried again from a fresh read: apply's writes are idempotent per cut (the snapshot's
`pgcdc.cut`, sinks/iceberg/commit.py), maintenance changes no row. A SQLite catalog busy with
another process's commit is the same kind of wait.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from sinks.retries import retry_when

T = TypeVar("T")

_CONFLICT = re.compile(
    r"CommitFailedException"
    r"|ValidationException: (Found (new )?conflicting|Cannot commit, (found new|missing data files)"
    r"|Missing required files)"
    r"|SQLITE_BUSY|database is locked"
)


def is_conflict(exc: BaseException) -> bool:
    return bool(_CONFLICT.search(type(exc).__name__) or _CONFLICT.search(str(exc)[:4000]))


def retry_conflicts(fn: Callable[[], T], attempts: int = 10) -> T:
    """fn() again (after a short random wait) while it fails on an Iceberg commit conflict."""
    return retry_when(is_conflict, fn, attempts)
