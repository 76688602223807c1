"""Helpers shared by integration tests: pipeline files, running `cdc`, reading state back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import yaml
from psycopg2 import sql as pgsql

from cdc.ground import logsetup
from cdc.log.base import LogRecord
from cdc.log.local import LocalLog
from cdc.pgoutput import UNCHANGED
from cdc.session import libpq_options, run_sql

REPO = Path(__file__).resolve().parents[1]


def write_pipeline(
    directory: Path,
    dsn: str,
    tables: Sequence[str],
    name: str = "test",
    postgres: dict[str, Any] | None = None,
    **extra: Any,
) -> Path:
    """A pipeline file in `directory` (state under directory/.cdc/<name>) with `postgres` as further
    source.postgres settings and `extra` as further top-level keys; returns its path."""
    doc: dict[str, Any] = {
        "name": name,
        "source": {"postgres": {"dsn": dsn, "tables": list(tables), **(postgres or {})}},
    }
    doc.update(extra)
    path = directory / f"{name}.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def edit_pipeline(path: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    """Rewrite the pipeline file at `path` after `edit` changed its document in place."""
    doc = yaml.safe_load(path.read_text())
    edit(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


@dataclass
class CdcRun:
    code: int
    out: str
    err: str


def cdc(
    *args: str | os.PathLike[str],
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
) -> CdcRun:
    """Run the real `cdc` console entry in a subprocess (exit codes and output as a user sees them)."""
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd or REPO,
        check=False,
    )
    return CdcRun(done.returncode, done.stdout, done.stderr)


def cdc_here(*args: str | os.PathLike[str]) -> CdcRun:
    """`cdc ARGS` in this process (click's runner): exit code and output as `cdc` prints them, with
    Spark verbs on the test session's SparkSession instead of a JVM started per call. What only a
    process of its own shows (signals, what the JVM prints to stderr) needs `cdc`."""
    from click.testing import CliRunner

    from pipelines.cli import cli

    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    return CdcRun(result.exit_code, result.stdout, result.stderr)


def cdc_popen(
    *args: str | os.PathLike[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd or REPO,
    )


def stop_process(proc: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    """SIGTERM a cdc process (if still running) and collect its output; killed when it does not stop
    within `timeout` (its exit code then says so to a caller that checks it)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def wait_for(
    what: str,
    check: Callable[[], Any],
    proc: subprocess.Popen | None = None,
    timeout: float = 120,
    interval: float = 0.2,
) -> Any:
    """Poll `check()` until it is truthy and return its value; fail early if `proc` exited meanwhile
    (with its output). The timeout only ends a hung wait: nothing asserts how long the wait took."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process exited {proc.returncode} while waiting for {what}:\n{out}\n{err}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(interval)


sql = run_sql  # statements in autocommit mode; the last one's rows (if any)


def flush_wal(dsn: str) -> None:
    """Make every commit so far durable in the WAL. The test server runs synchronous_commit=off, so a
    commit can return before its WAL is written; `--until current` takes the server's *write*
    position as "current" and would stop short of such commits (see tests/integration/test_capture.py::
    test_until_current_includes_async_commits). One synchronous commit that wrote WAL flushes everything before it (a
    transaction that only took an xid commits asynchronously whatever synchronous_commit says)."""
    sql(dsn, "SET synchronous_commit = on", "CREATE TEMP TABLE cdc_test_flush(x int)")


def source_rows(dsn: str, table: str, key: Sequence[str]) -> dict[tuple, dict[str, str | None]]:
    """The table as {key text tuple: {column: PostgreSQL text value}} (canonical session settings)."""
    conn = psycopg2.connect(dsn, options=libpq_options())
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table} LIMIT 0")
            cols = [d.name for d in cur.description]
            # format('%s', x) is the type's output function (what COPY and pgoutput print); NULL stays NULL.
            select = pgsql.SQL(", ").join(
                pgsql.SQL("CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END").format(
                    c=pgsql.Identifier(c)
                )
                for c in cols
            )
            cur.execute(pgsql.SQL("SELECT {} FROM {}").format(select, pgsql.SQL(table)))
            out = {}
            for row in cur.fetchall():
                rec = dict(zip(cols, row, strict=True))
                out[tuple(rec[k] for k in key)] = rec
            return out
    finally:
        conn.close()


def materialize(log_path: Path, table: str | None = None) -> dict[str, dict[tuple, dict[str, Any]]]:
    """A reference follower in plain Python: replay the log (from each table's base to the latest
    cut) by position and return the resulting rows as {table: {key texts: {column: text}}}.
    Unchanged-TOAST values keep the previous value, exactly as followers must."""
    from cdc.keys import key_texts

    log = LocalLog(log_path, readonly=True)
    try:
        cut = log.latest_cut()
        result: dict[str, dict[tuple, dict[str, Any]]] = {}
        if cut is None:
            return result
        for name, rng in cut.tables.items():
            if table is not None and str(name) != table:
                continue
            records = sorted(log.read(name, rng.base - 1, rng.end), key=lambda r: (r.lsn, r.seq))
            rows: dict[tuple, dict[str, Any]] = {}
            for rec in records:
                _apply(rows, rec, key_texts)
            unknown = [(key, c) for key, row in rows.items() for c, v in row.items() if v is _UNKNOWN]
            assert not unknown, (
                f"{name}: unchanged TOAST value with no previous value in the log: {unknown[:5]}"
            )
            latest = log.schema(name)
            for row in rows.values():  # rows written before a column existed hold its fast default
                for col in latest.columns:
                    row.setdefault(col.name, col.missing)
            result[str(name)] = rows
        return result
    finally:
        log.close()


# An update keeping a TOAST value of a row the log does not hold from the table's base on. A chunked
# snapshot's log can hold one (snapshot/reconcile.py): the key's row was deleted before its chunk
# was read, or a whole event inside the chunk's window superseded the chunk's row. A later event
# of the key then always follows it, so no row may still hold this when the replay ends.
_UNKNOWN = object()


def _apply(rows: dict[tuple, dict[str, Any]], rec: LogRecord, key_texts) -> None:
    if rec.op == "t":
        rows.clear()
        return
    key = tuple(key_texts(rec.key))
    if rec.op == "d":
        rows.pop(key, None)
        return
    names = rec.schema.column_names
    old = rows.get(key, {})
    new = {}
    for name, value in zip(names, rec.values, strict=True):
        if value is UNCHANGED:
            value = old.get(name, _UNKNOWN)
        new[name] = value
    rows[key] = new


def apply_once(pipeline_file: Path, spark, sink: str | None = None) -> list:
    """`cdc apply --once` in-process on the test session's SparkSession; raises on a sink failure."""
    from pipelines.apply.job import ApplyJob
    from sinks.registry import load_pipeline

    job = ApplyJob(load_pipeline(pipeline_file), spark)
    runs = job.run_once(sink)
    for run in runs:
        if run.error is not None:
            raise run.error
    return runs


def apply_crashing(pipeline_file: Path, spark, point: str, sink: str | None = None) -> None:
    """`cdc apply --once` in-process, stopped at crash point `point` (pipelines/faults.py with
    CDC_FAULT_RAISE): what is on disk then is what a SIGKILL at that point leaves, without a JVM
    start per crash. Exact for points the job reaches on one thread (apply:after-merge; and
    apply:between-tables with apply_parallelism 1); tests of the kill itself run `cdc apply`."""
    from pipelines.faults import CrashPointReached

    saved = {k: os.environ.get(k) for k in ("CDC_FAULT", "CDC_FAULT_RAISE")}
    os.environ.update(CDC_FAULT=point, CDC_FAULT_RAISE="1")
    try:
        apply_once(pipeline_file, spark, sink)
    except CrashPointReached:
        return
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    raise AssertionError(f"the apply finished without reaching crash point {point}")


def verify(pipeline_file: Path, spark, sink: str | None = None) -> tuple[int, str]:
    """`cdc verify` in-process: (exit code, printed report)."""
    from pipelines.verify import run_verify
    from sinks.registry import load_pipeline

    with logsetup.collected() as lines:
        code = run_verify(load_pipeline(pipeline_file), spark, sink, 0)
    return code, "\n".join(lines)


def stream_in_process(pipeline_file: Path):
    """`cdc stream --until current` in-process, without flush_wal (stream_changes flushes first;
    tests.fixtures.capture.stream_until_current runs the `cdc stream` command); returns the StreamStats."""
    from cdc.reader import run_stream
    from sinks.registry import load_pipeline

    return run_stream(load_pipeline(pipeline_file), until="current")


def stream_changes(pipeline_file: Path, dsn: str):
    """Every change committed to `dsn` so far into the log: flush_wal, then stream_in_process."""
    flush_wal(dsn)
    return stream_in_process(pipeline_file)
