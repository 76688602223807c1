"""Delta's optimistic concurrency between `cdc apply` and `cdc maintain` (docs/run-continuously.md).

Neither holds a lock across the other: each commit checks what was committed since it read the
table, and one that conflicts (OPTIMIZE compacted files a MERGE read, a MERGE rewrote files an
OPTIMIZE compacted, a marker changed the metadata...) fails without writing anything. Such a
commit is simply tried again from a fresh read: apply's writes are idempotent per cut
(txnAppId/txnVersion), maintenance changes no data.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

from sinks.retries import retry_when

T = TypeVar("T")

# Delta's conflict exceptions, by class name (Scala and the Python wrappers) or error class.
_CONFLICT = re.compile(
    r"DELTA_CONCURRENT_|DELTA_METADATA_CHANGED|DELTA_PROTOCOL_CHANGED"
    r"|Concurrent(Append|DeleteRead|DeleteDelete|Write|Transaction)Exception"
    r"|MetadataChangedException|ProtocolChangedException|DeltaConcurrentModificationException"
    r"|CommitFailedError"  # delta-rs (sinks/delta/rswrite.py): a concurrent commit conflicted
)


def is_conflict(exc: BaseException) -> bool:
    return bool(_CONFLICT.search(type(exc).__name__) or _CONFLICT.search(str(exc)[:2000]))


def retry_conflicts(fn: Callable[[], T], attempts: int = 10) -> T:
    """fn() again (after a short random wait) while it fails on a Delta commit conflict."""
    return retry_when(is_conflict, fn, attempts)
