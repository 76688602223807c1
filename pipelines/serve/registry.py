"""The running `cdc serve` processes of a pipeline: one small file each under <state_dir>/serve/,
written at start and removed at exit; `cdc status` lists those whose process still runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def servers_dir(state_path: Path) -> Path:
    return state_path / "serve"


def record_server(state_path: Path, info: dict[str, Any]) -> Path:
    path = servers_dir(state_path) / f"{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": os.getpid(), **info}))
    return path


def running_servers(state_path: Path) -> list[dict[str, Any]]:
    """The servers whose process still runs (a file left by a killed one is skipped)."""
    found = []
    for path in sorted(servers_dir(state_path).glob("*.json")):
        try:
            info = json.loads(path.read_text())
            os.kill(int(info["pid"]), 0)
        except (OSError, ValueError, KeyError):
            continue
        found.append(info)
    return found
