"""One applier per follower at a time: an flock on `<state_dir>/locks/apply.<sink>.lock`.

Two `cdc apply` runs on one sink (cron starting `apply --once` while the previous one still
runs, or a `cdc run` next to it) would write the same cut twice and race on the checkpoint.
Each run takes the sink's lock around its work on that sink. flock is held by the open file,
so the kernel drops it when the process ends in any way (exit, crash, kill -9): there is no
stale lock to clean up, and the lock file itself stays (deleting it would let two runs lock
two different files).

The holder writes who it is (pid, host, start time, command) into the file, so the run that
finds the lock taken can name it. By default that run does not wait: it reports the sink as
busy (exit 4) and leaves it to the running apply — waiting runs would pile up behind a stuck
one, each holding a Spark session. `--lock-wait SECONDS` waits up to that long instead.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cdc.ground.errors import CdcError
from cdc.ground.private import private_dir, private_fd
from pipelines.stages import beat

logger = logging.getLogger(__name__)

POLL_S = 0.2


class LockBusy(CdcError):
    """Another process applies this follower (exit 4, as other runtime failures)."""


def lock_path(state_path: Path, sink: str) -> Path:
    return state_path / "locks" / f"apply.{sink}.lock"


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "another process"
    return f"pid {info['pid']} on {info.get('host', '?')}, started {info.get('started', '?')} ({info.get('command', '?')})"


@contextmanager
def sink_lock(state_path: Path, sink: str, wait_s: float = 0.0) -> Iterator[bool]:
    """Hold the sink's apply lock for the block (yields whether it had to wait for another run);
    LockBusy if another process still holds it after `wait_s`."""
    path = lock_path(state_path, sink)
    private_dir(path.parent)
    fd = private_fd(path)
    try:
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(path)
                if time.monotonic() >= deadline:
                    raise LockBusy(
                        f"sink {sink}: another cdc apply is applying this follower ({holder}); this run left it alone",
                        "nothing to do: that run applies the log up to its cut and the next run takes the rest; "
                        "pass --lock-wait SECONDS to wait for it instead (lock file: " + str(path) + ")",
                    ) from None
                if not told:
                    logger.info(f"sink {sink}: waiting up to {wait_s:g}s for another cdc apply ({holder})")
                    told = True
                beat()  # a wait asked for, not a stall (pipelines/apply/stall.py)
                time.sleep(POLL_S)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(["cdc", *sys.argv[1:]])[:200],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        yield told
    finally:
        os.close(fd)  # releases the flock
