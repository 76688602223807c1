"""What `cdc teardown` deletes under state_dir (pipelines/teardown_data.py): everything of the
pipeline's, except a follower's own directory kept there; a log outside state_dir too."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pipelines.teardown_data import left_in_place, remove_captured
from sinks.registry import load_pipeline
from tests.harness import write_pipeline

pytestmark = pytest.mark.unit


def test_everything_but_the_followers_directories_goes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sinks = [
        {"name": "lake", "delta": {"path": "st/lake"}},
        {
            "name": "idx",
            "search": {"engine": "tantivy", "tables": ["public.t"]},
        },  # default path: <state_dir>/search
    ]
    file = write_pipeline(
        tmp_path,
        "postgresql://x@127.0.0.1:1/x",
        ["public.t"],
        state_dir="st",
        sinks=sinks,
        log={"local": {"path": "elsewhere"}},
    )
    pipeline = load_pipeline(file)
    state = tmp_path / "st"
    for rel in (
        "lake/public/t/part-0.parquet",
        "search/public/t/seg",
        "checkpoints/lake.json",
        "views/base/x",
        "spark/code.zip",
        "verify-1/rows",
        "locks/apply.lake.lock",
    ):
        (state / rel).parent.mkdir(parents=True, exist_ok=True)
        (state / rel).write_bytes(b"row")
    (tmp_path / "elsewhere" / "segments").mkdir(parents=True)
    (tmp_path / "elsewhere" / "log.db").write_bytes(b"row")
    caplog.set_level(logging.INFO, logger="pipelines.teardown_data")

    remove_captured(pipeline)
    said = caplog.messages
    left = sorted(
        str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and p.name != "test.yml"
    )
    assert left == ["st/lake/public/t/part-0.parquet", "st/search/public/t/seg"], left
    assert f"deleted the log at {(tmp_path / 'elsewhere').resolve()}" in said[0], said
    assert "checkpoints/" in said[1] and "views/" in said[1] and "verify-1/" in said[1], said
    assert left_in_place(pipeline) == (
        f"followers' data was left in place: lake at {(state / 'lake').resolve()}; idx at {(state / 'search').resolve()}"
    )


def test_a_state_dir_holding_the_pipeline_file_keeps_what_cdc_did_not_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    file = write_pipeline(tmp_path, "postgresql://x@127.0.0.1:1/x", ["public.t"], state_dir=".", sinks=[])
    pipeline = load_pipeline(file)
    for rel in (
        "log/log.db",
        "log/segments/t1/s1/c00000.copy",
        "checkpoints/lake.json",
        "rebase.json",
        "verify-ab/rows",
        "notes.txt",
        "mine/data",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"row")
    caplog.set_level(logging.INFO, logger="pipelines.teardown_data")

    remove_captured(pipeline)
    said = caplog.messages
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["mine/data", "notes.txt", "test.yml"], left
    assert (
        said[-1]
        == f"left under {tmp_path.resolve()}, which also holds the pipeline file, what cdc did not write: mine, notes.txt, test.yml"
    ), said
