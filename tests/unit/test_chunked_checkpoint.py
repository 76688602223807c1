"""Chunked snapshots' local pieces (snapshot/chunk_checkpoint.py): the checkpoint file."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from snapshot.chunk_checkpoint import Checkpoint, ChunkMark, checkpoint_path

pytestmark = pytest.mark.unit


def test_checkpoint_round_trips_owner_only(tmp_path: Path):
    from cdc.ground.tables import TableName

    path = checkpoint_path(tmp_path / "state", TableName("public", "t"))
    cp = Checkpoint(path, "public.t", snapshot_id=7, first_low=100)
    cp.chunks.append(ChunkMark(0, 100, 150, 12, 50, ["50"]))
    cp.chunks.append(ChunkMark(1, 160, 170, 14, 0, None, reconciled=True, final=True))
    cp.complete = True
    cp.save()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    back = Checkpoint.load(path)
    assert back == cp
    assert back.rows == 50 and back.last_key == ["50"]  # an open-ended last chunk keeps the key before it


def test_checkpoint_written_before_final_loads(tmp_path: Path):
    """A checkpoint of a snapshot begun before chunks were key ranges (no `final`) resumes after
    its last chunk's last row."""
    path = tmp_path / "public.t.json"
    path.write_text(
        '{"table": "public.t", "snapshot_id": 3, "first_low": 9, "complete": false, "chunks":'
        ' [{"number": 0, "low": 9, "high": 12, "after": 0, "rows": 50, "last": ["57"], "reconciled": true}]}'
    )
    back = Checkpoint.load(path)
    assert back is not None and back.last_key == ["57"] and not back.complete and not back.chunks[0].final


def test_missing_or_torn_checkpoint_is_none(tmp_path: Path):
    assert Checkpoint.load(tmp_path / "nope.json") is None
    (tmp_path / "torn.json").write_text('{"table": ')
    assert Checkpoint.load(tmp_path / "torn.json") is None
