"""Deterministic crash points for tests (kill -9 at an exact step).

`CDC_FAULT=<point>` in the environment makes the process SIGKILL itself when it reaches that
point, as a power cut or the OOM killer would. Points: apply:after-merge (every table of a
batch merged, checkpoint not yet written), apply:between-tables, stream:after-append (rows in
the open batch, not committed). Unset in normal use: then this is a dictionary lookup.
"""

from __future__ import annotations

import os
import signal


def crash_point(name: str) -> None:
    if os.environ.get("CDC_FAULT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
