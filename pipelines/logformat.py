"""How the CLI's lines look: human text (default) or JSON lines for log shippers (docs/monitoring.md).

`--log-format json` (or CDC_LOG_FORMAT=json) on the long-running verbs turns every line the CLI
prints (results on stdout; stage lines, errors and their fixes on stderr) into one JSON object:

    {"time": "2026-11-25T03:40:00.123Z", "level": "info", "pipeline": "shop",
     "event": "sink lake: applied cut 7 (0/1A2B3C8) in 2.1s: ...", "fields": {}}

`event` is the message the text format prints; `fields` holds what a machine wants without parsing
it (an error's `fix` and `exit_code`, a stage's `stage`, `seconds` and `status`). The format is set
once per process and passed to child processes through CDC_LOG_FORMAT (`child_env`).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

FORMATS = ("text", "json")
_json = False
_pipeline: str | None = None


def configure(fmt: str | None) -> None:
    """`fmt`: "text" or "json" (None: CDC_LOG_FORMAT, default text)."""
    global _json
    _json = (fmt or os.environ.get("CDC_LOG_FORMAT") or "text").lower() == "json"


def child_env() -> dict[str, str]:
    """The environment of a child `cdc` process (cdc run's stream): it prints the same way."""
    return {**os.environ, "CDC_LOG_FORMAT": "json" if _json else "text"}


def set_pipeline(name: str) -> None:
    global _pipeline
    _pipeline = name


def is_json() -> bool:
    return _json


def line(event: str, level: str = "info", **fields: Any) -> str:
    now = datetime.now(UTC)
    record = {
        "time": now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z",
        "level": level,
        "pipeline": _pipeline,
        "event": event,
        "fields": fields,
    }
    return json.dumps(record, default=str, ensure_ascii=False)


def emit(event: str, stream: TextIO | None = None, level: str = "info", **fields: Any) -> None:
    """Print one line in the configured format (text: the message as is)."""
    out = stream or sys.stdout
    print(line(event, level, **fields) if _json else event, file=out, flush=True)
