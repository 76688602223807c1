"""pipelines/apply/parallel.py's pool on its own (plain threads, no Spark): results in order, at
most `parallelism` tasks at once, and on a failure the error a sequential run would raise, with
nothing new started after it."""

from __future__ import annotations

import threading

import pytest

from pipelines.apply.parallel import Slot, auto_parallelism, run_tasks
from pipelines.stages import Stages

pytestmark = pytest.mark.unit


def test_results_keep_the_items_order_and_parallelism_is_reached() -> None:
    barrier = threading.Barrier(3, timeout=60)  # only passes if three tasks run at the same time
    lock = threading.Lock()
    running = peak = 0

    def work(slot: Slot[int]) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        if slot.index < 3:
            barrier.wait()
        with lock:
            running -= 1
        return slot.item * 10

    assert run_tasks(list(range(9)), work, 3, None, "t") == [i * 10 for i in range(9)]
    assert peak == 3


def test_parallelism_one_runs_in_order_in_this_thread() -> None:
    seen: list[tuple[int, int, str]] = []

    def work(slot: Slot[str]) -> str:
        seen.append((slot.index, slot.finished_before, threading.current_thread().name))
        return slot.item.upper()

    assert run_tasks(["a", "b", "c"], work, 1, None, "t") == ["A", "B", "C"]
    main = threading.current_thread().name
    assert seen == [(0, 0, main), (1, 1, main), (2, 2, main)]


def test_the_earliest_failing_task_is_raised_and_nothing_starts_after_a_failure() -> None:
    second_failed = threading.Event()
    started: list[int] = []

    def work(slot: Slot[int]) -> None:
        started.append(slot.index)
        if slot.index == 1:
            second_failed.set()
            raise ValueError("table 1 failed")
        if slot.index == 0:
            assert second_failed.wait(60)  # fails after table 1 did, yet is the one reported
            raise ValueError("table 0 failed")

    with pytest.raises(ValueError, match="table 0 failed"):
        run_tasks(list(range(8)), work, 2, None, "t")
    assert sorted(started) == [0, 1], "a task started after another had failed"


def test_a_later_failure_still_lets_the_running_tasks_finish() -> None:
    release = threading.Event()
    finished: list[int] = []

    def work(slot: Slot[int]) -> None:
        if slot.index == 1:
            release.set()
            raise RuntimeError("boom")
        assert release.wait(60)
        finished.append(slot.index)

    with pytest.raises(RuntimeError, match="boom"):
        run_tasks([0, 1, 2], work, 2, None, "t")
    assert finished == [0]  # table 0 ran to its end; table 2 never started


def test_auto_parallelism() -> None:
    assert auto_parallelism(1) == 2 and auto_parallelism(2) == 4 and auto_parallelism(64) == 16


def test_stages_of_threads_end_in_any_order() -> None:
    """Stage lines of tables applied side by side: each stage ends with its own text and time."""
    import io

    out = io.StringIO()
    stages = Stages(stream=out, tty=False)
    try:
        first = stages.begin("table a")
        second = stages.begin("table b")
        stages.end(entry=first)  # a ends while b still runs
        stages.end(entry=second)
    finally:
        stages.close()
    done = [line for line in out.getvalue().splitlines() if "done in" in line]
    assert [line.split(":")[0] for line in done] == ["table a", "table b"]


def test_batches_compute_their_cached_values_side_by_side() -> None:
    """Two batches' first `_summary`/`events` at the same time (sinks/changes.py's cached_property):
    functools' in Python 3.11 holds one lock per property across every instance, which made the
    tables of a cut wait for each other's Spark jobs; here both are inside at once."""
    from sinks.changes import cached_property

    both_inside = threading.Barrier(2, timeout=60)

    class Batch:
        @cached_property
        def summary(self) -> int:
            both_inside.wait()  # raises BrokenBarrierError if the other cannot get in
            return id(self)

    batches = [Batch(), Batch()]
    got = run_tasks(batches, lambda slot: slot.item.summary, 2, None, "t")
    assert got == [id(b) for b in batches]
    assert all(b.summary == id(b) for b in batches)  # kept: computed once
