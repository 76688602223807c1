"""Liveness and readiness of this process, for supervisors (docs/monitoring.md, health).

The loops report here (the stream's read loop, the continuous apply); pipelines/metrics.py serves
the answer as /healthz (live) and /readyz (ready) on the metrics port. Recording is one clock read
and a dict write, so the stream's read loop can afford it once per batch and per idle second.

* live: every loop of the process moved within its own bound (a hung loop is dead to a supervisor:
  restart it);
* ready: live, and doing its job: the stream is connected to PostgreSQL and reading, the apply's
  followers advance (the last round of each ended without error, recently).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

Check = Callable[[], dict[str, Any]]  # {"live": bool, "ready": bool, "reason": str, ...}

_lock = threading.Lock()
_checks: dict[str, Check] = {}


def register(component: str, check: Check) -> None:
    with _lock:
        _checks[component] = check


def unregister(component: str) -> None:
    with _lock:
        _checks.pop(component, None)


def report() -> dict[str, Any]:
    """{"live", "ready", "components": {name: {...}}}: live/ready only if every component is (ready
    also needs one at least)."""
    with _lock:
        checks = dict(_checks)
    components: dict[str, dict[str, Any]] = {}
    for name, check in sorted(checks.items()):
        try:
            components[name] = check()
        except Exception as exc:  # a broken check must not take the endpoint down: it is not ready
            components[name] = {
                "live": True,
                "ready": False,
                "reason": f"health check failed: {type(exc).__name__}",
            }
    live = all(c.get("live", False) for c in components.values())
    # nothing registered yet (starting), or a batch verb (cdc snapshot, cdc apply --once): not ready
    ready = live and bool(components) and all(c.get("ready", False) for c in components.values())
    return {"live": live, "ready": ready, "components": components}


class Heartbeat:
    """When a loop last moved; live while that is within `within_s` (changeable per phase)."""

    def __init__(self, within_s: float):
        self.within_s = within_s
        self.at = time.monotonic()

    def beat(self, within_s: float | None = None) -> None:
        self.at = time.monotonic()
        if within_s is not None:
            self.within_s = within_s

    def age(self) -> float:
        return time.monotonic() - self.at

    def alive(self) -> bool:
        return self.age() <= self.within_s
