"""Each follower's own position in the log, one small JSON file per sink.

A checkpoint names the last cut a sink applied completely, with the table ranges it read.
`pending` is the cut a run started applying: after a crash the next run applies exactly that
cut again (sinks are idempotent per cut), so a checkpoint and a follower never disagree.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Checkpoint:
    sink: str
    cut_id: int = 0
    lsn: int = 0
    ts_ms: int = 0
    tables: dict[str, list[int]] = field(default_factory=dict)  # str(TableName) -> [base, end offset applied]
    pending: dict[str, Any] | None = None  # {"cut_id", "lsn", "tables": {...}} being applied

    @property
    def path_name(self) -> str:
        return f"{self.sink}.json"


def checkpoint_dir(state_path: Path) -> Path:
    return state_path / "checkpoints"


def load_checkpoint(state_path: Path, sink: str) -> Checkpoint:
    path = checkpoint_dir(state_path) / f"{sink}.json"
    if not path.exists():
        return Checkpoint(sink)
    data = json.loads(path.read_text())
    return Checkpoint(**data)


def save_checkpoint(state_path: Path, checkpoint: Checkpoint) -> None:
    """Atomic replace + fsync: a crash leaves the old or the new checkpoint, never half of one."""
    directory = checkpoint_dir(state_path)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint.path_name
    tmp = final.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(asdict(checkpoint), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fd = os.open(directory, os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
