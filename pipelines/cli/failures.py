"""How a verb ends: its exit code, or an expected failure (CdcError) turned into a two-line
message and its documented exit code. A Python traceback means a bug; set CDC_DEBUG=1 to see one
for expected failures too."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from cdc.ground.errors import CdcError, ExitCode
from pipelines.cli.output import err, report_error


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
            sys.stdout.flush()  # a reader gone (`| head`) shows here, not at interpreter exit
        except BrokenPipeError as exc:
            if _stdout_gone():
                _quiet_exit_on_closed_stdout()
            if os.environ.get("CDC_DEBUG"):  # a socket of ours, not our reader: a real failure
                raise
            err(f"internal error: {type(exc).__name__}: {exc}")
            err("  fix: rerun with CDC_DEBUG=1 for a traceback and report it")
            sys.exit(int(ExitCode.RUNTIME))
        except CdcError as exc:
            if os.environ.get("CDC_DEBUG"):
                raise
            exc = _driver_gone(exc) or exc  # a failure that only echoes a dead driver JVM says why it died
            report_error(exc.problem, exc.fix, int(exc.exit_code))
            sys.exit(int(exc.exit_code))
        except KeyboardInterrupt:
            err("interrupted")
            sys.exit(int(ExitCode.INTERRUPTED))
        except click.exceptions.Exit:
            raise
        except click.ClickException:
            raise
        except Exception as exc:  # a bug or an unforeseen failure: say so, keep secrets out
            if os.environ.get("CDC_DEBUG"):
                raise
            gone = _driver_gone(exc)
            if gone is not None:
                report_error(gone.problem, gone.fix, int(gone.exit_code))
                sys.exit(int(gone.exit_code))
            err(f"internal error: {type(exc).__name__}: {exc}")
            err("  fix: rerun with CDC_DEBUG=1 for a traceback and report it")
            sys.exit(int(ExitCode.RUNTIME))
        if isinstance(result, int):
            sys.exit(result)
        return result

    return wrapper


def _driver_gone(exc: Exception) -> CdcError | None:
    """The error of a Spark driver JVM this process launched that has exited (out of heap...),
    unless `exc` says so already (the apply's own, which also says what the followers keep)."""
    from pipelines.spark import DriverExited, exited_driver_error

    if isinstance(exc, DriverExited):
        return None
    try:
        return exited_driver_error()
    except Exception:  # never let the check hide the failure being reported
        return None


def _stdout_gone() -> bool:
    """Is stdout a pipe (or socket) whose reader has gone away? (poll reports an error on it)"""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _fd, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def _quiet_exit_on_closed_stdout() -> None:
    """Behave like a Unix tool whose reader went away (`cdc log read ... | head -1`): no message,
    and the exit status a shell shows for a process ended by SIGPIPE (128 + 13)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # Python's final flush of stdout would fail again
    sys.exit(128 + 13)
