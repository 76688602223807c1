"""The lines a verb prints: answers on stdout, problems on stderr, as text or JSON lines
(cdc/ground/logsetup.py), secrets redacted."""

from __future__ import annotations

import sys

import click

from cdc.ground import logsetup
from cdc.ground.secrets import redact


def err(message: str) -> None:
    if logsetup.is_json():
        logsetup.emit(redact(message), sys.stderr, level="error")
        return
    click.echo(redact(message), err=True)


def say(message: str) -> None:
    if logsetup.is_json():
        logsetup.emit(redact(message))
        return
    click.echo(redact(message))


def report_error(problem: str, fix: str | None, code: int) -> None:
    """`error:` and `  fix:` lines; in JSON one record with the fix and exit code as fields."""
    if logsetup.is_json():
        logsetup.emit(redact(problem), sys.stderr, "error", fix=redact(fix) if fix else None, exit_code=code)
        return
    err(f"error: {problem}")
    if fix:
        err(f"  fix: {fix}")
