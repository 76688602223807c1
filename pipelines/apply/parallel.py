"""The tables of a cut side by side (docs/reference/pipeline-file.md: `spark.apply_parallelism`).

Until the checkpoint, the tables of a cut are independent: the apply job runs one task per table
on a bounded pool of driver threads, each submitting its own Spark jobs (Spark schedules jobs
from several threads at once; under the FAIR scheduler, the pool named here, one per sink,
shares the executors fairly with the other sinks). Most of a small table's MERGE is driver-side
work (planning, Delta's log and commit), so tables overlap well even on a few cores.

Each thread works in its own clone of the session: Delta's idempotent-write confs
(txnAppId/txnVersion, sinks/delta/idempotent.py) are session confs, and one table's MERGE must
never commit under another thread's settings (nor a write meant to be plain, such as a truncate's
delete, commit as the cut's: Delta would then skip that table's MERGE as already applied).

Failure: the first failing task stops tasks that have not started from starting; those running
finish (a MERGE is one Delta commit, never half-written). The error raised is that of the
failing task earliest in the given order, the one a sequential run raises: tasks start in order,
so every task before a failed one has started and is waited for. The caller writes its
checkpoint only after this returns, so a failure or a crash leaves the cut pending, and the next
run applies exactly that cut again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from cdc.ground.logsetup import carried
from sinks.jvm import driver_jvm

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")
R = TypeVar("R")

POOL_PROPERTY = "spark.scheduler.pool"
MAX_AUTO = 16  # the automatic default's ceiling: threads wait on the JVM, but each holds a batch in flight


def auto_parallelism(default_parallelism: int) -> int:
    """`spark.apply_parallelism` when the pipeline file leaves it out: twice the cores Spark runs
    tasks on (a thread spends much of a small MERGE waiting on the driver), at least 2."""
    return max(2, min(MAX_AUTO, 2 * default_parallelism))


@dataclass(frozen=True)
class Slot(Generic[T]):
    """What one task runs with."""

    item: T
    index: int  # its place in the given order
    spark: SparkSession | None  # the session to run Spark work in (its thread's own in parallel runs)
    finished_before: int  # how many tasks had finished when this one started

    @property
    def session(self) -> SparkSession:
        """`spark`, for work that runs Spark jobs: run_tasks was given a session."""
        if self.spark is None:
            raise TypeError("this task runs Spark work, but run_tasks was given no session")
        return self.spark


class _Skipped:
    """A task that did not start because another had failed."""


def clone_session(spark: SparkSession) -> SparkSession:
    """A session of its own (confs, temporary views) on the same SparkContext and cache, with the
    parent's confs and registered data sources."""
    from pyspark.sql import SparkSession

    return SparkSession(spark.sparkContext, spark._jsparkSession.cloneSession())


def run_tasks(
    items: Sequence[T],
    work: Callable[[Slot[T]], R],
    parallelism: int,
    spark: SparkSession | None,
    pool: str,
) -> list[R]:
    """work(slot) per item, at most `parallelism` at a time; results in the items' order.
    parallelism 1 (or a single item) runs them one after another in this thread and session;
    spark None: plain threads, for work that submits no Spark jobs."""
    if parallelism <= 1 or len(items) <= 1:
        results: list[R] = []
        for index, item in enumerate(items):
            results.append(work(Slot(item, index, spark, len(results))))
        return results
    return _Pool(spark, pool).run(items, work, parallelism)


class _Pool:
    def __init__(self, spark: SparkSession | None, pool: str):
        self.spark = spark
        self.pool = pool
        self._lock = threading.Lock()
        self._finished = 0
        self._failed = False
        self._local = threading.local()

    def _session(self) -> SparkSession | None:
        session = getattr(self._local, "spark", None)
        if session is None and self.spark is not None:
            session = self._local.spark = clone_session(self.spark)
            # Thread-local in the JVM (pinned threads): code that asks for the active session gets this one.
            driver_jvm(session).SparkSession.setActiveSession(session._jsparkSession)
            self.spark.sparkContext.setLocalProperty(POOL_PROPERTY, self.pool)
        return session

    def _task(self, index: int, item: T, work: Callable[[Slot[T]], R]) -> R | _Skipped:
        with self._lock:
            if self._failed:
                return _Skipped()
            finished = self._finished
        try:
            session = self._session()
            result = work(Slot(item, index, session, finished))
        except BaseException:
            with self._lock:
                self._failed = True
            raise
        with self._lock:
            self._finished += 1
        return result

    def run(self, items: Sequence[T], work: Callable[[Slot[T]], R], parallelism: int) -> list[R]:
        workers = min(parallelism, len(items))
        executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"cdc-apply-{self.pool}")
        futures: list[Future] = []
        try:
            # each task's log lines as the caller's (cdc demo indents them: logsetup.prefixed)
            task = carried(self._task)
            futures = [executor.submit(task, i, item, work) for i, item in enumerate(items)]
            wait(futures)
        finally:
            with self._lock:  # interrupted while waiting: nothing new starts either
                self._failed = self._failed or not all(f.done() for f in futures)
            executor.shutdown(wait=True, cancel_futures=True)
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
        return [future.result() for future in futures]
