"""The continuous apply's part of /healthz and /readyz (cdc/health.py; docs/monitoring.md, health).

* live: between rounds the loop beats every fraction of a second; inside a round (one cut, which
  may take long) it is live while the stall guard (pipelines/apply/stall.py) sees it move, and the
  guard ends the process itself after `spark.stall_timeout_s` without movement.
* ready: no follower's last round failed, and each follower advances: a round of it ended without
  error within max(300 s, 10 trigger intervals), or a round is under way and moving.
"""

from __future__ import annotations

import time
from typing import Any

from cdc.health import Heartbeat
from pipelines.apply.stall import StallGuard

LOOP_LIVE_S = 120.0  # between rounds the loop sleeps 0.2 s at a time: still for 2 minutes = hung
MOVING_S = 120.0  # a round whose guard saw movement this recently is advancing


class ApplyHealth:
    def __init__(self, sinks: list[str], trigger_interval_s: float, guard: StallGuard | None):
        self.sinks = sinks
        self.guard = guard
        self.stale_s = max(300.0, 10 * trigger_interval_s)
        self.loop = Heartbeat(LOOP_LIVE_S)
        self.in_round = False
        self.last_ok: dict[str, float] = {}  # sink -> monotonic time its last good round ended
        self.failing: dict[str, str] = {}  # sink -> the problem of its last (failed) round

    def round_started(self) -> None:
        self.in_round = True
        self.loop.beat()

    def round_ended(self, runs: list[Any]) -> None:  # SinkRun of pipelines/apply/cut.py
        now = time.monotonic()
        for run in runs:
            if run.error is None:
                self.last_ok[run.sink] = now
                self.failing.pop(run.sink, None)
            else:
                self.failing[run.sink] = run.error.problem
        self.in_round = False
        self.loop.beat()

    def idle(self) -> None:
        self.loop.beat()

    def check(self) -> dict[str, Any]:
        still = self.guard.still_s() if self.guard is not None and self.in_round else 0.0
        if self.in_round:
            timeout = self.guard.timeout_s if self.guard is not None else float("inf")
            live = still < timeout
            why_dead = (
                f"the apply has not moved for {still:.0f}s inside a round (spark.stall_timeout_s {timeout:g})"
            )
        else:
            live = self.loop.alive()
            why_dead = f"the apply loop has not moved for {self.loop.age():.0f}s between rounds: hung"
        advancing = self.in_round and still < MOVING_S
        now = time.monotonic()
        problems = []
        for sink in self.sinks:
            if sink in self.failing:
                problems.append(f"sink {sink}: its last round failed: {self.failing[sink]}")
            elif advancing:
                continue
            elif sink not in self.last_ok:
                problems.append(f"sink {sink}: no round has ended yet")
            elif now - self.last_ok[sink] > self.stale_s:
                problems.append(
                    f"sink {sink}: no round ended without error for {now - self.last_ok[sink]:.0f}s "
                    f"(more than {self.stale_s:g}s)"
                )
        ready = live and not problems
        reason = why_dead if not live else "; ".join(problems) if problems else "every follower advances"
        return {
            "live": live,
            "ready": ready,
            "reason": reason,
            "in_round": self.in_round,
            "followers": {
                s: {
                    "ok": s not in self.failing,
                    "last_ok_s": round(now - self.last_ok[s], 1) if s in self.last_ok else None,
                }
                for s in self.sinks
            },
        }
