"""Each follower's own position in the log, one small JSON file per sink.

A checkpoint names the last cut a sink applied completely, with the table ranges it read.
`pending` is the cut a run started applying: after a crash the next run applies exactly that
cut again (sinks are idempotent per cut), so a checkpoint and a follower never disagree.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cdc.ground.errors import LogError
from cdc.ground.formats import STATE, VERSION, check_version
from cdc.ground.private import private_dir, private_open


@dataclass
class Checkpoint:
    sink: str
    cut_id: int = 0
    lsn: int = 0
    ts_ms: int = 0
    tables: dict[str, list[int]] = field(default_factory=dict)  # str(TableName) -> [base, end offset applied]
    pending: dict[str, Any] | None = None  # {"cut_id", "lsn", "tables": {...}} being applied
    markers: bool = False  # the follower carries a marker per table (sinks/marker.py) since this was set
    # str(TableName) -> the cut whose data commit last wrote the table: what a Delta or Iceberg
    # follower's position (the cut id its commits carry, sinks/marker.py) is compared with; a table
    # missing here (written before this was kept) is checked by its marker's own end
    written: dict[str, int] = field(default_factory=dict)
    # the last time the follower was found to have lost data (status shows it)
    lost: dict[str, Any] | None = None
    clear: bool = False  # `cdc reset --rebuild`: the next apply clears the follower's tables first
    # str(TableName) -> the sink's table_options it was applied with (sinks/shaping.py shape_record);
    # None in checkpoints written before shapes were recorded (taken as they are, no rebuild)
    shapes: dict[str, str] | None = None

    @property
    def path_name(self) -> str:
        return f"{self.sink}.json"


def checkpoint_dir(state_path: Path) -> Path:
    return state_path / "checkpoints"


class CheckpointError(LogError):
    """A checkpoint file cannot be read (truncated, emptied, edited by hand): exit 4."""


def checkpoint_path(state_path: Path, sink: str) -> Path:
    return checkpoint_dir(state_path) / f"{sink}.json"


def load_checkpoint(state_path: Path, sink: str, pipeline_file: str = "PIPELINE") -> Checkpoint:
    path = checkpoint_path(state_path, sink)
    try:
        data = read_record(path, "sink", sink)
        return Checkpoint(sink) if data is None else Checkpoint(**data)
    except (OSError, ValueError, TypeError) as exc:
        # save_checkpoint never leaves half a file: this one was damaged outside the tool
        raise CheckpointError(
            f"sink {sink}: its checkpoint {path} cannot be read ({type(exc).__name__}: {str(exc)[:120]})",
            f"rebuild the follower from the log's base: `cdc reset {shlex.quote(pipeline_file)} --sink {sink} --rebuild --yes` "
            "(replaces the checkpoint; the next apply rebuilds every table of this follower)",
        ) from None


def save_checkpoint(state_path: Path, checkpoint: Checkpoint) -> None:
    """Atomic replace + fsync: a crash leaves the old or the new checkpoint, never half of one."""
    directory = checkpoint_dir(state_path)
    write_record(directory, directory / checkpoint.path_name, asdict(checkpoint))


# Every state record carries the state format it was written in and the release that wrote it
# (cdc/ground/formats.py).
STATE_KEY, WRITER_KEY = "format", "cdc_version"


def read_record(path: Path, field: str, owner: str) -> dict | None:
    """A state file's JSON object (None: there is none); ValueError when it is not `owner`'s record
    (its `field` says whose it is), OSError/ValueError when it cannot be read."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get(field) != owner:
        raise ValueError(f"not the record of {owner}")
    # FormatTooNew when a newer cdc wrote it
    check_version(STATE, data.pop(STATE_KEY, None), f"state file {path}", data.pop(WRITER_KEY, None))
    return data


def write_record(directory: Path, final: Path, data: dict) -> None:
    """Owner-only, atomic replace + fsync of file and directory: a crash leaves the old or the new
    record, never half of one (checkpoints, the view stage's state files)."""
    private_dir(directory)
    tmp = final.with_suffix(".tmp")
    with private_open(tmp, "w") as f:
        json.dump({STATE_KEY: STATE.version, WRITER_KEY: VERSION, **data}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fd = os.open(directory, os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
