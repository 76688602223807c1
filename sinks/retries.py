"""Retrying a commit that lost an optimistic-concurrency race (Delta: sinks/delta/conflicts.py,
Iceberg: sinks/iceberg/conflicts.py): each engine says which errors are conflicts, the wait and
the number of attempts are the same for both."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

T = TypeVar("T")


def retry_when(is_conflict: Callable[[BaseException], bool], fn: Callable[[], T], attempts: int = 10) -> T:
    """fn() again (after a short random wait) while it fails with an error `is_conflict` accepts."""
    for attempt in Retrying(
        retry=retry_if_exception(is_conflict),
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.2, max=5),
        reraise=True,
    ):
        with attempt:
            return fn()
    raise AssertionError("unreachable")  # Retrying re-raises the last error
