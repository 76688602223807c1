"""Deterministic crash points for tests (kill -9 at an exact step).

`CDC_FAULT=<point>` in the environment makes the process SIGKILL itself when it reaches that
point, as a power cut or the OOM killer would. Points: apply:after-merge (every table of a
batch merged, checkpoint not yet written), apply:between-tables, apply:before-checkpoint (rows,
markers and Delta's `_cdc_cuts` row written, checkpoint not yet), stream:after-append (rows in
the open batch, not committed), views:after-merge (a view's out table written for a cut, its
state file not yet). Unset in normal use: then this is a dictionary lookup.
`CDC_FAULT=apply:locked:out-of-memory` makes the driver JVM run out of heap there instead.

`CDC_FAULT_RAISE=1` as well: the point raises CrashPointReached instead, for tests that run the job
in their own process (a JVM start saved per crash). Nothing of the job's after the point runs: no
`except` of the job catches a BaseException, and its `finally` blocks only release memory and locks,
which a killed process releases too. Tests of the kill itself keep the SIGKILL.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any


def pause_point(name: str) -> None:
    """`CDC_PAUSE=<point>` with `CDC_PAUSE_FILE=<path>`: at that point create the file, then wait
    until the test removes it (so a test can hold a process at an exact step without sleeping).
    Points: apply:locked (a sink's apply lock taken, nothing written yet), and every crash point."""
    if os.environ.get("CDC_PAUSE") == name:
        marker = os.environ["CDC_PAUSE_FILE"]
        open(marker, "w").close()
        while os.path.exists(marker):
            time.sleep(0.05)


class CrashPointReached(BaseException):
    """A crash point reached with CDC_FAULT_RAISE=1 (a BaseException: the job's error handling,
    which reports and goes on, must not catch it)."""


def crash_point(name: str) -> None:
    """Every crash point is a pause point too (e.g. CDC_PAUSE=apply:between-tables holds an apply
    with a cut's first table committed and the next not yet written)."""
    pause_point(name)
    if os.environ.get("CDC_FAULT") == name:
        if os.environ.get("CDC_FAULT_RAISE") == "1":
            raise CrashPointReached(name)
        os.kill(os.getpid(), signal.SIGKILL)


def out_of_memory_point(name: str, spark: Any) -> None:
    """`CDC_FAULT=<name>:out-of-memory`: the driver JVM allocates more than its heap here, a real
    java.lang.OutOfMemoryError (with cdc's JVM options the JVM then exits, pipelines/spark.py)."""
    if os.environ.get("CDC_FAULT") == f"{name}:out-of-memory":
        spark.sparkContext._jvm.java.nio.ByteBuffer.allocate(2**31 - 16)
