"""Ends an apply that no longer moves (`spark.stall_timeout_s`; docs/run-continuously.md, "A stalled apply").

A Spark driver can break without failing: the crash campaign saw Spark's scheduler threads die on
"Out of space in CodeCache", after which every job waited forever. The followers fell behind and
`cdc run` looked alive. While a cut is being applied this thread checks every few seconds that
something moves: a Spark task finished, a job or stage started or ended, or a step of the apply
began or ended (pipelines/stages.py), or a wait asked for went on (`--lock-wait`). When nothing has for the timeout it says so and ends the
process with exit 4, so that a supervisor (systemd, Kubernetes, an Airflow retry) starts it
again; the cut is still pending and is re-applied exactly (docs/guarantees.md).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cdc.ground.errors import ExitCode
from pipelines import stages

OUR_PACKAGES = ("pipelines", "sinks", "cdc", "snapshot")


class StallGuard:
    def __init__(
        self,
        spark: Any,
        timeout_s: float,
        report: Callable[[str, str, int], None],
        before_exit: Callable[[], object] = lambda: None,
        every_s: float = 2.0,
    ):
        self.spark, self.timeout_s, self.report, self.before_exit = spark, timeout_s, report, before_exit
        self.every_s = every_s
        self._depth = 0  # run_once calls in progress (the tables' threads share one cut)
        self._lock = threading.Lock()
        self._last: tuple | None = None
        self._moved = time.monotonic()
        self._what = ""
        self._thread = threading.Thread(target=self._watch, name="cdc-stall-guard", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def watching(self, what: str) -> Iterator[None]:
        """Watch the block (one cut's apply) for progress."""
        with self._lock:
            self._depth += 1
            self._what = what
            self._moved = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1

    def still_s(self) -> float:
        """Seconds since the watched apply last moved (0 when no cut is being applied): /healthz."""
        with self._lock:
            return time.monotonic() - self._moved if self._depth else 0.0

    def _progress(self) -> tuple:
        """What moves while a cut is applied; a broken JVM (the probe raises) moves nothing."""
        mark: tuple = (stages.steps(),)
        try:
            jobs = tuple(sorted(self.spark.sparkContext.statusTracker().getActiveJobsIds()))
            done = 0
            for sid, info in stages.active_stages(self.spark):
                done += info.numCompletedTasks + info.numFailedTasks
                mark += (sid,)
            return (*mark, jobs, done)
        except Exception:
            return mark

    def _watch(self) -> None:
        while True:
            time.sleep(self.every_s)
            with self._lock:
                if self._depth == 0:
                    self._last = None
                    continue
            now = self._progress()
            with self._lock:
                if now != self._last:
                    self._last, self._moved = now, time.monotonic()
                    continue
                still = time.monotonic() - self._moved
                what = self._what
            if still >= self.timeout_s:
                self._give_up(what, still)

    def _where(self) -> str:
        """Where it stands: Spark's running stages and the apply's innermost frame of each thread."""
        parts = []
        try:
            for sid, info in stages.active_stages(self.spark):
                parts.append(
                    f"Spark stage {sid} ({info.name}): {info.numCompletedTasks}/{info.numTasks} tasks done, "
                    f"{info.numActiveTasks} running"
                )
        except Exception as exc:
            parts.append(f"Spark does not answer ({type(exc).__name__})")
        me = threading.get_ident()
        for ident, frame in sys._current_frames().items():
            ours = None
            for entry in traceback.extract_stack(frame):
                if (
                    any(f"/{pkg}/" in entry.filename for pkg in OUR_PACKAGES)
                    and "/stall.py" not in entry.filename
                ):
                    ours = entry
            if ident != me and ours is not None:
                parts.append(f"at {'/'.join(Path(ours.filename).parts[-2:])}:{ours.lineno} ({ours.name})")
        return "; ".join(parts) or "no Spark stage running"

    def _give_up(self, what: str, still: float) -> None:
        self.report(
            f"the apply has not moved for {still:.0f}s while {what} (no Spark task finished, no job or step began "
            f"or ended; {self._where()}): Spark's driver may be broken (see its messages above); stopping so that "
            "a supervisor starts it again (the cut is re-applied exactly)",
            "if it happens again, look above for the JVM's errors (out of memory, CodeCache full) and give the "
            "driver what it lacks in spark.conf; raise spark.stall_timeout_s if single Spark tasks legitimately "
            "run longer",
            int(ExitCode.RUNTIME),
        )
        sys.stdout.flush()
        sys.stderr.flush()
        with contextlib.suppress(Exception):
            self.before_exit()
        os._exit(int(ExitCode.RUNTIME))  # the main thread is blocked in a Spark call that will not return
