"""What a long verb (`cdc apply`, `cdc verify`) is doing, on stderr while it works.

Spark start-up, reading the log and each MERGE can each take tens of seconds; without this the
user sees nothing but Spark's own warnings for a minute or two. A verb turns reporting on with
`activate()`; code anywhere below marks its steps with `stage("...")`, a no-op when nothing is
active (tests and library use stay quiet).

* On a terminal: one live line (rich) with the innermost stage, its elapsed time and the tasks
  of Spark's running stages (`tasks 3/8`); each finished stage stays as a line with its time.
* Otherwise (cron, CI, a pipe): plain lines, `<stage> ...` when a stage starts, `<stage>: done
  in 4.2s` when it ends, and `<stage>: 20s, Spark tasks 3/8` every 10 s while it runs.
Results and reports stay on stdout; these lines go to stderr.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from cdc.ground import logsetup

_active: Stages | None = None
_steps = 0  # stages begun and ended, reported or not: what pipelines/apply/stall.py sees move


def steps() -> int:
    return _steps


def active_stages(spark: Any) -> list[tuple[int, Any]]:
    """(stage id, SparkStageInfo) of Spark's running stages, by id; raises if Spark does not answer."""
    tracker = spark.sparkContext.statusTracker()
    found = ((sid, tracker.getStageInfo(sid)) for sid in sorted(tracker.getActiveStageIds()))
    return [(sid, info) for sid, info in found if info is not None]


def beat() -> None:
    """Count as moving while waiting on purpose (for another apply's lock: `--lock-wait`)."""
    global _steps
    _steps += 1


class Stages:
    def __init__(self, stream: TextIO | None = None, every_s: float = 10.0, tty: bool | None = None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.tty = self.tty and not logsetup.is_json()  # JSON lines: no live line
        self.every_s = every_s
        self.spark: Any = None
        self._stack: list[tuple[str, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._status: Any = None
        self._console: Any = None
        if self.tty:
            from rich.console import Console

            self._console = Console(file=self.stream)
        self._thread = threading.Thread(target=self._tick, name="cdc-stages", daemon=True)
        self._thread.start()

    def attach(self, spark: Any) -> None:
        """Report the running Spark stages' task counts from now on."""
        self.spark = spark

    def _spark_tasks(self) -> str:
        if self.spark is None:
            return ""
        try:
            done = total = 0
            for _sid, info in active_stages(self.spark):
                done += info.numCompletedTasks
                total += info.numTasks
        except Exception:  # the session is stopping: no progress to show
            return ""
        return f"Spark tasks {done}/{total}" if total else ""

    def _line(self, text: str, **fields: Any) -> None:
        if self._console is not None:
            self._console.print(text, highlight=False, markup=False)
        else:
            logsetup.emit(text, self.stream, **fields)

    def begin(self, text: str) -> tuple[str, float]:
        entry = (text, time.monotonic())
        with self._lock:
            self._stack.append(entry)
            if self._console is not None:
                if self._status is None:
                    self._status = self._console.status(text)
                    self._status.start()
                else:
                    self._status.update(text)
            else:
                self._line(f"{text} ...", stage=text, status="started")
        return entry

    def end(self, failed: bool = False, entry: tuple[str, float] | None = None) -> None:
        """End `entry` (the stage begin returned; the innermost when None): the tables of a cut
        run in threads of their own (pipelines/apply/parallel.py), and their stages end in any order."""
        with self._lock:
            if entry is None or entry not in self._stack:
                entry = self._stack[-1]
            self._stack.remove(entry)
            text, started = entry
            took = time.monotonic() - started
            self._line(
                f"{text}: {'failed after' if failed else 'done in'} {took:.1f}s",
                stage=text,
                status="failed" if failed else "done",
                seconds=round(took, 3),
            )
            if self._status is not None:
                if self._stack:
                    self._status.update(self._stack[-1][0])
                else:
                    self._status.stop()
                    self._status = None

    def _tick(self) -> None:
        last_plain = time.monotonic()
        while not self._stop.wait(0.5):
            with self._lock:
                if not self._stack:
                    continue
                text, started = self._stack[-1]
            now = time.monotonic()
            tasks = self._spark_tasks()
            detail = f"{now - started:.0f}s" + (f", {tasks}" if tasks else "")
            with self._lock:
                if not self._stack or self._stack[-1][0] != text:
                    continue
                if self._status is not None:
                    self._status.update(f"{text} ({detail})")
                elif now - last_plain >= self.every_s:
                    last_plain = now
                    self._line(
                        f"{text}: {detail}", stage=text, status="running", seconds=round(now - started, 1)
                    )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        with self._lock:
            if self._status is not None:
                self._status.stop()
                self._status = None


def activate(stages: Stages | None) -> Stages | None:
    """Make `stages` the reporter of `stage()` calls (None turns reporting off); returns the old one."""
    global _active
    old, _active = _active, stages
    return old


def attach_spark(spark: Any) -> None:
    if _active is not None:
        _active.attach(spark)


@contextmanager
def stage(text: str) -> Iterator[None]:
    """Mark a step of the active verb; counted (steps()) whether or not one is active."""
    global _steps
    _steps += 1  # not atomic across threads: it only has to change
    reporter = _active
    try:
        if reporter is None:
            yield
            return
        entry = reporter.begin(text)
        try:
            yield
        except BaseException:
            reporter.end(failed=True, entry=entry)
            raise
        reporter.end(entry=entry)
    finally:
        _steps += 1


@contextmanager
def reporting() -> Iterator[Stages]:
    """For a CLI verb: stage lines on stderr for the block."""
    stages = Stages()
    old = activate(stages)
    try:
        yield stages
    finally:
        activate(old)
        stages.close()
