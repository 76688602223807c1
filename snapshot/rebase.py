"""Re-basing a table for a running `cdc stream`: `cdc snapshot --tables` of that one table,
in a thread next to the stream (detection and the reasons: cdc/rebase.py).

The snapshot is the same as a user's `cdc snapshot --tables` while streaming: a temporary
slot exports a snapshot whose consistent point separates "in the snapshot" from "in the
stream", the snapshot becomes the table's new base in the log, and the stream's events newer
than it follow it; followers notice the new base and rebuild the table from it.
"""

from __future__ import annotations

import logging
import shlex
import threading
import time

from cdc.ground.config import Pipeline
from cdc.ground.errors import CdcError
from cdc.ground.logsetup import prefixed
from cdc.ground.lsn import format_lsn
from cdc.ground.tables import TableName
from cdc.rebase import save_state

logger = logging.getLogger(__name__)


class ThreadRebaser:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self._threads: dict[TableName, threading.Thread] = {}

    def busy(self, table: TableName) -> bool:
        thread = self._threads.get(table)
        return thread is not None and thread.is_alive()

    def start(self, table: TableName, reason: str) -> None:
        if self.busy(table):
            return
        thread = threading.Thread(target=self._run, args=(table,), name=f"cdc re-base {table}", daemon=True)
        self._threads[table] = thread
        thread.start()

    def wait(self) -> None:
        for thread in list(self._threads.values()):
            thread.join()

    def _run(self, table: TableName) -> None:
        from snapshot.runner import run_snapshot

        state_dir = self.pipeline.state_path
        started = time.monotonic()
        try:
            with prefixed(f"re-base {table}: "):
                result = run_snapshot(
                    self.pipeline,
                    only=[str(table)],
                    progress=False,
                    mode="exported",  # chunks would wait for this very stream, which a --until stream stops
                )
        except Exception as exc:  # reported, and left for the next stream or the user
            problem = exc.problem if isinstance(exc, CdcError) else f"{type(exc).__name__}: {exc}"
            snap = self.pipeline.command("snapshot", "--tables", shlex.quote(str(table)))
            fix = f"run `{snap}` (a restarted `{self.pipeline.command('stream')}` also tries again)"
            save_state(state_dir, table, state="failed", error=problem, fix=fix)
            logger.warning(
                f"re-base of {table} failed: {problem}; followers may be stale until it is done\n  fix: {fix}"
            )
            return
        rows = result.rows.get(table, 0)  # the runner marked the re-base done in the state file
        logger.info(
            f"re-base {table}: done: {rows:,} rows at {format_lsn(result.consistent_point)} in "
            f"{time.monotonic() - started:.1f}s; followers rebuild the table from it at their next apply"
        )
