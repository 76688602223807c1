"""Expected failures and their exit codes (docs/concepts.md, exit codes).

Every expected failure is a CdcError carrying what is wrong and what to do about it;
the CLI prints both and exits with the class's code, never with a traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    DIFFERENCE = 1  # cdc verify found the follower differs from the source; cdc wait timed out
    USAGE = 2  # bad command line or bad pipeline file
    SOURCE = 3  # the source database cannot be used as configured
    RUNTIME = 4  # anything else that went wrong while working
    FORMAT = (
        5  # data on disk written by a newer cdc, in a format this one cannot read (cdc/ground/formats.py)
    )
    INTERRUPTED = 130


class CdcError(Exception):
    """An expected failure: `problem` says what is wrong, `fix` what to do."""

    exit_code: ExitCode = ExitCode.RUNTIME

    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return self.problem if not self.fix else f"{self.problem}\n  fix: {self.fix}"

    def __reduce__(
        self,
    ) -> tuple[
        type[CdcError], tuple[str, str | None]
    ]:  # keeps `fix` when the error crosses a process boundary (worker pools)
        return type(self), (self.problem, self.fix)


class UsageError(CdcError):
    exit_code = ExitCode.USAGE


class PipelineFileError(UsageError):
    """The pipeline file is malformed or does not validate."""


class SourceError(CdcError):
    """The source database is unreachable or not usable (wal_level, rights, keys...)."""

    exit_code = ExitCode.SOURCE


class LogError(CdcError):
    """The log cannot serve a request (missing offsets, corrupt state...)."""


class SinkError(CdcError):
    """A follower cannot be written or read."""


class EngineSettingError(CdcError):
    """A follower's engine is set up so it would lose the follower's data (a Redis that may evict
    keys): exit 3, like a source that is not usable as configured."""

    exit_code = ExitCode.SOURCE


class WaitTimeout(CdcError):
    """`cdc wait`: a follower had not applied the position when the timeout passed (exit 1: not a
    failure of the tool, the answer "not yet")."""

    exit_code = ExitCode.DIFFERENCE


class ServiceError(CdcError):
    """A local dev service (PostgreSQL, Kafka, Redis, OpenSearch) could not be started or stopped."""
