"""Each follower's last error and since when it fails (`cdc status`, the metrics).

One small JSON file per sink under `<state_dir>/errors/` (owner-only, written like a checkpoint):
{"sink", "problem", "fix", "since_ms" (first failure of the current run of failures), "last_ms",
"count"}. An apply round of the sink that ends without error removes it, so a file present means
"failing now"; `cdc status` and `pgcdc_follower_failing_since_timestamp_seconds` show it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdc.ground.clock import now_ms
from cdc.ground.errors import CdcError
from pipelines.checkpoints import read_record, write_record


def _path(state_path: Path, sink: str) -> Path:
    return state_path / "errors" / f"{sink}.json"


def last_error(state_path: Path, sink: str) -> dict[str, Any] | None:
    """The sink's current error record (None: its last round ended well, or it never failed)."""
    try:
        return read_record(_path(state_path, sink), "sink", sink)
    except (OSError, ValueError):
        return None  # a damaged file says nothing; the next round rewrites or removes it


def record_error(state_path: Path, sink: str, error: CdcError) -> None:
    now = now_ms()
    before = last_error(state_path, sink) or {}
    record = {
        "sink": sink,
        "problem": error.problem,
        "fix": error.fix,
        "since_ms": before.get("since_ms", now),  # failing since the first error of this streak
        "last_ms": now,
        "count": int(before.get("count", 0)) + 1,
    }
    path = _path(state_path, sink)
    write_record(path.parent, path, record)


def clear_error(state_path: Path, sink: str) -> None:
    _path(state_path, sink).unlink(missing_ok=True)
