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

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

T = TypeVar("T")

# Delta's conflict exceptions, by class name (Scala and the Python wrappers) or error class.
_CONFLICT = re.compile(
    r"DELTA_CONCURRENT_|DELTA_METADATA_CHANGED|DELTA_PROTOCOL_CHANGED"
    r"|Concurrent(Append|DeleteRead|DeleteDelete|Write|Transaction)Exception"
    r"|MetadataChangedException|ProtocolChangedException|DeltaConcurrentModificationException"
)


def is_conflict(exc: BaseException) -> bool:
    return bool(_CONFLICT.search(type(exc).__name__) or _CONFLICT.search(str(exc)[:2000]))


def retry_conflicts(fn: Callable[[], T], attempts: int = 10) -> T:
    """fn() again (after a short random wait) while it fails on a Delta commit conflict."""
    for attempt in Retrying(
        retry=retry_if_exception(is_conflict),
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.2, max=5),
        reraise=True,
    ):
        with attempt:
            return fn()
    raise AssertionError("unreachable")  # Retrying re-raises the last error
