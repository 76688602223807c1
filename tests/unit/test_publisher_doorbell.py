"""The stream's ring to its Kafka publisher child (cdc/log/kafka/doorbell.py) with real processes.

The stream rings after every cut it commits, from its hot loop: a ring must never block it,
whatever the child does. A child killed with -9 (its end of the pipe closed) or stopped (a
full pipe nobody reads) must leave the ringing stream running; a waiting child must wake on a
ring, and every ring waiting is consumed by one wake-up.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest

from cdc.log.kafka.doorbell import Doorbell, wait_for_ring
from tests.fixtures.spinning import wait_for_rings

pytestmark = pytest.mark.unit

RINGS = 200_000  # far more bytes than a pipe holds (64 KiB on Linux)


def _ring_many(bell: Doorbell) -> threading.Thread:
    ringer = threading.Thread(target=lambda: [bell.ring() for _ in range(RINGS)], daemon=True)
    ringer.start()
    ringer.join(30)  # a hang guard: a blocking ring never returns
    return ringer


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["kill-9", "stopped"])
def test_a_killed_or_stopped_child_does_not_block_the_ringing_stream(how: signal.Signals) -> None:
    ctx = multiprocessing.get_context("spawn")
    bell = Doorbell(ctx)
    child = ctx.Process(target=wait_for_rings, args=(bell.receiver,))
    child.start()
    bell.handed_over()
    try:
        for _ in range(50):  # rings while the child waits for them
            bell.ring()
            time.sleep(0.01)
        os.kill(child.pid, how)
        if how == signal.SIGKILL:
            child.join(10)
            assert child.exitcode == -signal.SIGKILL
        ringer = _ring_many(bell)
        assert not ringer.is_alive(), f"ring() blocked after the child got {how.name}"
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)
        bell.close()


def test_a_ring_wakes_the_waiter_and_all_waiting_rings_are_consumed() -> None:
    bell = Doorbell(multiprocessing.get_context("spawn"))
    assert wait_for_ring(bell.receiver, 0.05) is False  # nothing rang: the timeout
    for _ in range(1000):
        bell.ring()
    assert wait_for_ring(bell.receiver, 5) is True
    assert wait_for_ring(bell.receiver, 0.05) is False  # one wake-up took them all
    threading.Timer(0.1, bell.ring).start()
    assert wait_for_ring(bell.receiver, 30) is True  # woken by the ring, not the 30 s timeout
    bell.close()
    assert wait_for_ring(bell.receiver, 0.05) is False  # the parent's end closed: EOF is no ring
