"""Small facts about a Delta table read straight from its `_delta_log` JSON commits, without a
Spark job: the view stage asks them of every base and out table every cut, and each Spark job
costs a fixed ~0.1-0.5 s whatever the size of the cut (README "Derived views", Cost of a cut).

Every answer has a safe fallback: None means "cannot tell from the JSON commits" (a commit file
cleaned up by log retention, a table that is not there) and the caller asks Spark instead.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_COMMIT = re.compile(r"^(\d{20})\.json$")
_DATA_ACTIONS = ("add", "remove", "cdc")


def _log(path: str | Path) -> Path:
    return Path(path) / "_delta_log"


def latest_version(path: str | Path) -> int | None:
    """The table's latest committed version (None: no Delta table there)."""
    try:
        names = [m.group(1) for n in _log(path).iterdir() if (m := _COMMIT.match(n.name))]
    except (FileNotFoundError, NotADirectoryError):
        return None
    return int(max(names)) if names else None


def _actions(path: str | Path, version: int) -> list[dict[str, Any]] | None:
    try:
        text = (_log(path) / f"{version:020d}.json").read_text()
    except FileNotFoundError:
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def data_changed(path: str | Path, v0: int, v1: int) -> bool | None:
    """Did any commit in (v0, v1] add, remove or change rows? False for commits that only changed
    table properties (the base follower's markers); None when a commit file is gone."""
    for version in range(v0 + 1, v1 + 1):
        actions = _actions(path, version)
        if actions is None:
            return None
        for action in actions:
            for kind in _DATA_ACTIONS:
                if kind in action and action[kind].get("dataChange", True):
                    return True
    return False


def first_metadata(path: str | Path) -> dict[str, Any] | None:
    """Version 0's metaData action (its `id` is the table's for life; None: no version 0 file)."""
    actions = _actions(path, 0)
    if actions is None:
        return None
    return next((a["metaData"] for a in actions if "metaData" in a), None)


def latest_metadata(path: str | Path, depth: int = 64) -> dict[str, Any] | None:
    """The newest metaData action, searching back at most `depth` commits from the latest (None:
    not in those JSON commits, e.g. only in a checkpoint)."""
    last = latest_version(path)
    if last is None:
        return None
    for version in range(last, max(last - depth, -1), -1):
        actions = _actions(path, version)
        if actions is None:
            return None
        for action in actions:
            if "metaData" in action:
                return action["metaData"]
    return None
