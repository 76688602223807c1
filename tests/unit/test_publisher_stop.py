"""The Kafka publisher child's stop flag (cdc/log/kafka/child.py StopFlag) with real processes.

The crash campaign killed the publisher child with -9 while it was inside multiprocessing.Event's
lock: the parent's Event.set() at shutdown then blocked forever, and `cdc stream` hung instead of
exiting for its supervisor. A child reading the flag in a tight loop is killed at several moments;
setting the flag afterwards must not block, and a waiter must see it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest

from cdc.log.kafka.child import StopFlag
from tests.fixtures.spinning import read_forever

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("after_s", [0.6, 0.75, 0.9])
def test_stop_flag_is_set_after_a_child_reading_it_was_killed(after_s: float) -> None:
    ctx = multiprocessing.get_context("spawn")
    flag = StopFlag(ctx)
    child = ctx.Process(target=read_forever, args=(flag,))
    child.start()
    time.sleep(after_s)  # spawned, imported, inside its loop
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    setter = threading.Thread(target=flag.set, daemon=True)
    setter.start()
    setter.join(5)
    assert not setter.is_alive(), "set() blocked after the child died"
    assert flag.is_set() and flag.wait(0.5)


def test_wait_returns_on_timeout_and_on_set() -> None:
    flag = StopFlag(multiprocessing.get_context("spawn"))
    began = time.monotonic()
    assert flag.wait(0.2) is False and time.monotonic() - began >= 0.2
    threading.Timer(0.1, flag.set).start()
    assert flag.wait(5) is True
