"""The lines the tool prints, through the standard library's logging (docs/development.md, "Logging").

Every module logs to its own logger, `logger = logging.getLogger(__name__)` (not `log`: that is
the change log here): `logger.info` for what it is doing (progress, results), `logger.warning` for
what the user must act on, `logger.debug` for detail nobody sees by default. Nothing is shown until the
CLI calls `configure()`: then the loggers of the tool's packages (cdc, snapshot, sinks, pipelines)
print INFO and up on stdout, in one of two forms (docs/monitoring.md):

* text (default): the message as is; a warning starts with `warning: `, an error with `error: `;
* json (`--log-format json`, or CDC_LOG_FORMAT=json): one JSON object per line,

      {"time": "2026-11-25T03:40:00.123Z", "level": "info", "pipeline": "shop",
       "event": "sink lake: applied cut 7 (0/1A2B3C8) in 2.1s: ...", "fields": {}}

  `event` is the line the text form prints; `fields` holds what a machine wants without parsing it
  (an error's `fix` and `exit_code`, a stage's `stage`, `seconds` and `status`; a module may add
  its own with `extra={"fields": {...}}`).

Passwords are masked in both (cdc/ground/secrets.py). Library use (tests, Spark executors, a
host of its own) prints nothing: the records go to the handlers the host sets up (pytest's caplog).
Two context managers shape the lines of the code run inside them, in this thread (and in the
threads started with `carried()`): `prefixed()` puts a prefix before each line (`catch-up: ` on the
stream a snapshot runs to catch up), `to_stderr()` sends them to stderr (notes printed while a verb
loads its pipeline file); a record logged with `extra=STDERR` goes there too. The format is set once per process and passed to child processes through
CDC_LOG_FORMAT (`child_env`).
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ParamSpec, TextIO, TypeVar

from cdc.ground.secrets import redact

FORMATS = ("text", "json")
PACKAGES = ("cdc", "snapshot", "sinks", "pipelines")  # the loggers the CLI shows
_json = False
_pipeline: str | None = None
_prefix: contextvars.ContextVar[str] = contextvars.ContextVar("cdc_log_prefix", default="")
_stderr: contextvars.ContextVar[bool] = contextvars.ContextVar("cdc_log_stderr", default=False)
_LEADS = {logging.WARNING: "warning: ", logging.ERROR: "error: ", logging.CRITICAL: "error: "}
# `logger.warning(..., extra=STDERR)`: a record the CLI prints on stderr wherever it is logged from
# (a server's notes beside its answers, an alarm of the log writer)
STDERR = {"stderr": True}

P = ParamSpec("P")
R = TypeVar("R")


def configure(fmt: str | None) -> None:
    """Show the tool's log lines on stdout from now on; `fmt`: "text" or "json" (None: CDC_LOG_FORMAT,
    default text). Called again, it only changes the format."""
    global _json
    _json = (fmt or os.environ.get("CDC_LOG_FORMAT") or "text").lower() == "json"
    install()


def install() -> None:
    """The CLI's handler on the tool's package loggers, at INFO (idempotent; the format stays)."""
    for name in PACKAGES:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        if not any(isinstance(h, CliHandler) for h in logger.handlers):
            logger.addHandler(CliHandler())


def shown() -> str | None:
    """The form this process shows its log lines in ("text" or "json"), None when it shows none: what
    a child process it starts (multiprocessing) passes to `configure` to print the same way."""
    if not any(isinstance(h, CliHandler) for h in logging.getLogger(PACKAGES[0]).handlers):
        return None
    return "json" if _json else "text"


def child_env() -> dict[str, str]:
    """The environment of a child `cdc` process (cdc run's stream): it prints the same way."""
    return {**os.environ, "CDC_LOG_FORMAT": "json" if _json else "text"}


def set_pipeline(name: str | None) -> None:
    global _pipeline
    _pipeline = name


def is_json() -> bool:
    return _json


def line(event: str, level: str = "info", **fields: Any) -> str:
    """One JSON record (the json form's line)."""
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
    """Print one line in the configured format (text: the event as is); stdout by default."""
    out = stream or sys.stdout
    print(line(event, level, **fields) if _json else event, file=out, flush=True)


def text(record: logging.LogRecord) -> str:
    """The line the text form prints for `record` (prefix and `warning: ` included, not yet redacted)."""
    return _prefix.get() + _LEADS.get(record.levelno, "") + record.getMessage()


class CliHandler(logging.Handler):
    """Prints each record as the CLI shows it, on the stream of the moment (click's test runner
    swaps sys.stdout): text through click.echo (as the CLI's own lines), JSON through `emit`. A
    stream that fails (the reader of `cdc status | head` gone) raises at the logging call, as a
    print would: pipelines/cli/failures.py turns that into exit 141."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event = redact(text(record))
        except Exception:  # a record that cannot be formatted: logging's report, the verb goes on
            self.handleError(record)
            return
        stderr = _stderr.get() or bool(getattr(record, "stderr", False))
        if _json:
            fields = getattr(record, "fields", None) or {}
            emit(event, sys.stderr if stderr else sys.stdout, record.levelname.lower(), **fields)
        else:
            import click

            click.echo(event, err=stderr)


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(text(record))


_listening: dict[str, tuple[int, int | None]] = {}  # logger -> (blocks of collected(), level to restore)
_listening_lock = threading.Lock()


@contextmanager
def collected(*names: str) -> Iterator[list[str]]:
    """The lines logged while the block runs (from any thread), as the text form prints them but
    unredacted: for tests, and code that reports what the code it calls said. `names`: the loggers
    to listen to (default: the tool's packages), at INFO while any such block runs."""
    lines: list[str] = []
    handler = _Lines(lines)
    loggers = [logging.getLogger(n) for n in names or PACKAGES]
    with _listening_lock:
        for lg in loggers:
            blocks, restore = _listening.get(lg.name, (0, None))
            if blocks == 0 and lg.getEffectiveLevel() > logging.INFO:
                restore = lg.level
                lg.setLevel(logging.INFO)
            _listening[lg.name] = (blocks + 1, restore)
            lg.addHandler(handler)
    try:
        yield lines
    finally:
        with _listening_lock:
            for lg in loggers:
                lg.removeHandler(handler)
                blocks, restore = _listening.pop(lg.name)
                if blocks > 1:
                    _listening[lg.name] = (blocks - 1, restore)
                elif restore is not None:
                    lg.setLevel(restore)


@contextmanager
def prefixed(prefix: str) -> Iterator[None]:
    """Each line logged inside the block (this thread) starts with `prefix` (after any outer one)."""
    token = _prefix.set(_prefix.get() + prefix)
    try:
        yield
    finally:
        _prefix.reset(token)


@contextmanager
def to_stderr() -> Iterator[None]:
    """The CLI prints the lines logged inside the block (this thread) on stderr instead of stdout."""
    token = _stderr.set(True)
    try:
        yield
    finally:
        _stderr.reset(token)


def carried(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` to run in another thread with this one's prefix and stream (a context per call: one
    context cannot be entered by two threads at once)."""
    context = contextvars.copy_context()

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return context.copy().run(fn, *args, **kwargs)

    return run
