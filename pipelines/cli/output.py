"""A verb's problems on stderr (`error:` and `fix:` lines), as text or JSON lines, secrets redacted;
its answers and progress are log records the CLI prints on stdout (cdc/ground/logsetup.py)."""

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


def report_error(problem: str, fix: str | None, code: int) -> None:
    """`error:` and `  fix:` lines; in JSON one record with the fix and exit code as fields."""
    if logsetup.is_json():
        logsetup.emit(redact(problem), sys.stderr, "error", fix=redact(fix) if fix else None, exit_code=code)
        return
    err(f"error: {problem}")
    if fix:
        err(f"  fix: {fix}")
