"""The wall clock as the log, the topics and the state files record it: whole milliseconds since the epoch."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the Unix epoch (wall clock: `ts_ms`, `at_ms` and the like; not for measuring durations)."""
    return int(time.time() * 1000)
