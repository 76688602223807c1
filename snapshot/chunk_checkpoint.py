"""A chunked snapshot's checkpoint (snapshot/chunked.py): the chunks of a table already in the log,
each with its watermarks and upper key bound, in <state_dir>/chunked/<schema>.<table>.json, so a
killed snapshot resumes at the first chunk not committed."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cdc.ground.private import private_dir, private_open
from cdc.ground.tables import TableName


@dataclass
class ChunkMark:
    number: int
    low: int  # LSN of the low watermark message
    high: int  # LSN of the high watermark message
    after: int  # the table's last log offset before the low watermark: window events come after it
    rows: int
    # the chunk's upper key bound (key values as text; checkpoints written before chunks were key
    # ranges hold the chunk's last row); None: the open-ended last chunk, or an empty one
    last: list[str | None] | None
    reconciled: bool = False
    final: bool = False  # the table's last chunk: every row has been read


@dataclass
class Checkpoint:
    """A chunked snapshot in progress, in <state_dir>/chunked/<schema>.<table>.json."""

    path: Path
    table: str
    snapshot_id: int
    first_low: int
    chunks: list[ChunkMark] = field(default_factory=list)
    complete: bool = False  # the table's last chunk is in: every row has been read

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        chunks = [ChunkMark(**c) for c in data.pop("chunks")]
        return cls(path=path, chunks=chunks, **data)

    def save(self) -> None:
        private_dir(self.path.parent)
        body = asdict(self)
        body.pop("path")
        tmp = self.path.with_suffix(".tmp")
        with private_open(tmp, "w") as f:
            f.write(json.dumps(body, indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks)

    @property
    def last_key(self) -> list[str | None] | None:
        keys = [c.last for c in self.chunks if c.last is not None]
        return keys[-1] if keys else None


def checkpoint_path(state_dir: Path, table: TableName) -> Path:
    return Path(state_dir) / "chunked" / f"{table.schema}.{table.name}.json"


def discard_checkpoint(state_dir: Path, table: TableName) -> None:
    checkpoint_path(state_dir, table).unlink(missing_ok=True)
