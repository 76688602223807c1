"""The `cdc` command line (docs/reference/cli.md): the `cli` group and `main`, the console entry.

Thin on purpose: each verb parses its arguments, calls the module that does the work, and leaves
failures to pipelines/cli/failures.py. The verbs live in one module per group: capture.py (the
source side), followers.py (apply and check the followers), reading.py (status, sql, search,
serve), state.py (the log and state_dir) and tools.py (demo, package, dev services).
"""

from __future__ import annotations

import contextlib
import os
import sys

import click

from cdc.ground import logsetup
from cdc.ground.formats import VERSION, version_line
from pipelines.cli import capture, followers, reading, state, tools


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(VERSION, prog_name="cdc", message=version_line())
def cli() -> None:
    """Change-data-capture from PostgreSQL into a compacted log, applied by Spark to followers.

    Exit codes: 0 ok, 1 follower differs from source (verify), 2 bad usage or pipeline file,
    3 source not usable (wal_level, rights, slots, keys...), 4 runtime failure, 5 data on disk
    written by a newer cdc in a format this one cannot read (`cdc --version`), 130 interrupted
    (a continuous command stopped by Ctrl-C/SIGTERM exits 0), 141 the reader of the output went away.
    """
    logsetup.install()  # the modules' log lines on stdout (--log-format picks their form)


for _command in (
    capture.validate, capture.snapshot, capture.stream, capture.run, capture.migrate, capture.ddl,
    followers.apply, followers.verify, followers.wait, followers.reset, followers.maintain,
    reading.status, reading.sql, reading.search, reading.serve,
    state.log, state.upgrade, state.teardown,
    tools.demo, tools.package, tools.dev,
):  # fmt: skip
    cli.add_command(_command)


# Arrow-based readers (delta-rs, DataFusion, pyarrow) keep native thread pools whose C++
# destructors can abort the interpreter's shutdown (SIGABRT, "terminate called without an
# active exception") after a verb has printed its answer. Without a JVM to stop, run the
# atexit hooks and leave without the native teardown; the exit code is the verb's own. A verb
# that only imported pyspark (its types, as `cdc status` does through a sink's module) has no JVM.
_NATIVE_POOLS = ("deltalake", "datafusion", "pyarrow", "polars", "pyiceberg")


def main() -> None:
    try:
        cli(prog_name="cdc")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    if _jvm_launched() or not any(m in sys.modules for m in _NATIVE_POOLS):
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
            stream.flush()
    os._exit(code)


def _jvm_launched() -> bool:
    """This process started a Spark driver JVM (its stop and class archive run at a normal exit)."""
    if "pyspark" not in sys.modules:
        return False
    from pyspark import SparkContext

    return SparkContext._gateway is not None
