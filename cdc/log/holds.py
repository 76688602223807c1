"""Which cuts the pipeline's followers still hold (the local log's cut retention,
docs/run-continuously.md, cut retention: it keeps every cut a follower may still ask for).

A follower's position is the cut id in its state file: a sink's checkpoint
(`<state_dir>/checkpoints/<sink>.json`, pipelines/checkpoints.py) and a derived view's state
(`<state_dir>/views/<view>.json`, pipelines/views/state.py). Like a replication slot or a Kafka
consumer group, the slowest registered follower holds every cut from its own on: the log drops
older cuts only (cdc/log/local/cuts.py). Only followers the pipeline file names count (a sink removed
from the file holds nothing); one that never applied a cut holds nothing either.

This reads the files' `cut_id` fields only, so the capture layer needs nothing of `pipelines`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

CHECKPOINTS_DIR = "checkpoints"  # pipelines/checkpoints.py checkpoint_dir
VIEWS_DIR = "views"  # pipelines/views/state.py views_dir


def _cut_ids(path: Path) -> list[int]:
    """The cut ids a state file names (its cut and a pending one); none when unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []  # missing or damaged: its own verb reports it; holding nothing keeps the log bounded
    if not isinstance(data, dict):
        return []
    ids = [data.get("cut_id")]
    pending = data.get("pending")
    if isinstance(pending, dict):
        ids.append(pending.get("cut_id"))
    return [i for i in ids if isinstance(i, int) and i > 0]


def follower_holds(state_path: Path, sinks: Iterable[str], views: Iterable[str]) -> dict[str, int]:
    """follower -> the oldest cut id it holds ("sink NAME" / "view NAME")."""
    holds: dict[str, int] = {}
    for kind, directory, names in (("sink", CHECKPOINTS_DIR, sinks), ("view", VIEWS_DIR, views)):
        for name in names:
            ids = _cut_ids(state_path / directory / f"{name}.json")
            if ids:
                holds[f"{kind} {name}"] = min(ids)
    return holds


def holds_reader(state_path: Path, sinks: list[str], views: list[str]) -> Callable[[], dict[str, int]]:
    return lambda: follower_holds(state_path, sinks, views)
