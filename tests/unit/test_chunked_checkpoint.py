"""Chunked snapshots' local pieces (snapshot/chunked.py): the checkpoint file and the segment's last line."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from snapshot.chunked import Checkpoint, ChunkMark, checkpoint_path, last_line

pytestmark = pytest.mark.unit


def test_checkpoint_round_trips_owner_only(tmp_path: Path):
    from cdc.ground.tables import TableName

    path = checkpoint_path(tmp_path / "state", TableName("public", "t"))
    cp = Checkpoint(path, "public.t", snapshot_id=7, first_low=100)
    cp.chunks.append(ChunkMark(0, 100, 150, 12, 50, ["50"]))
    cp.chunks.append(ChunkMark(1, 160, 170, 14, 0, None, reconciled=True))
    cp.complete = True
    cp.save()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    back = Checkpoint.load(path)
    assert back == cp
    assert back.rows == 50 and back.last_key == ["50"]  # an empty last chunk keeps the key before it


def test_missing_or_torn_checkpoint_is_none(tmp_path: Path):
    assert Checkpoint.load(tmp_path / "nope.json") is None
    (tmp_path / "torn.json").write_text('{"table": ')
    assert Checkpoint.load(tmp_path / "torn.json") is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", None),
        (b"1\ta\n", b"1\ta"),
        (b"1\ta\n2\tb\n", b"2\tb"),
        (b"x" * 70000 + b"\n" + b"y" * 70000 + b"\n", b"y" * 70000),
    ],
)
def test_last_line(tmp_path: Path, body: bytes, expected: bytes | None):
    path = tmp_path / "c.copy"
    path.write_bytes(body)
    assert last_line(path) == expected
