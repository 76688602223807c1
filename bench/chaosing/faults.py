"""Faults injected into a running pipeline, and the supervisor that keeps `cdc run` running.

The supervisor plays systemd or Kubernetes: whenever `cdc run` exits it is started again after a
short pause, and every exit is recorded. Each fault is a function of the round's `Rig` (its
services and the supervisor); it returns when the fault is over (the service back, the signal
sent), and the round then measures how long the followers take to reach the source position
taken just before the fault.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fixtures.lake import descendants  # the /proc walk the tests use


class Supervisor(threading.Thread):
    """Keeps `cdc run PIPELINE` running in its own process group; records how each run ended."""

    def __init__(self, argv: list[str], env: dict[str, str], log_dir: Path):
        super().__init__(daemon=True, name="supervisor")
        self.argv, self.env, self.log_dir = argv, env, log_dir
        self.proc: subprocess.Popen | None = None
        self.exits: list[int] = []
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.starts = 0

    def run(self) -> None:
        while not self.halt.is_set():
            with self.lock:
                if self.halt.is_set():
                    break
                self.starts += 1
                out = open(self.log_dir / f"run-{self.starts}.log", "wb")  # noqa: SIM115 - closed below
                self.proc = subprocess.Popen(
                    self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            code = self.proc.wait()
            out.close()
            self.exits.append(code)
            self.halt.wait(1.0)

    def pid(self) -> int | None:
        proc = self.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def stop(self) -> None:
        """SIGTERM (a clean stop, as Ctrl-C) and wait; SIGKILL the group after 120 s."""
        self.halt.set()
        with self.lock:
            proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.join(timeout=10)
        # nothing of ours may outlive the round (the stream child, Spark's JVM, Python workers)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def wait_running(self, timeout: float = 60) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            pid = self.pid()
            if pid is not None:
                return pid
            time.sleep(0.2)
        raise RuntimeError("cdc run did not start again within 60 s")


def stream_child(run_pid: int) -> int | None:
    """The `cdc stream` child of a `cdc run`."""
    return next((p for p, cmd in descendants(run_pid).items() if "pipelines.cli stream" in cmd), None)


@dataclass
class Rig:
    """What a fault can touch: the services of the run and the supervised `cdc run`."""

    sup: Supervisor
    pg: Any  # LocalPostgres
    redis: Any  # LocalRedis
    kafka: Any | None  # LocalKafka, on the Kafka log
    log_dir: Path | None  # the local log's directory, on its own small filesystem (None: no disk fault)
    rng: Any
    notes: list[str] = field(default_factory=list)


def kill9_stream(rig: Rig) -> None:
    """SIGKILL the stream reader (mid-transaction, mid-batch: wherever it is)."""
    run = rig.sup.wait_running()
    child = _wait_for(lambda: stream_child(run))
    os.kill(child, signal.SIGKILL)


def kill9_apply(rig: Rig) -> None:
    """SIGKILL the whole `cdc run` (its apply loop, Spark's JVM and the stream child): a power cut
    of the machine it runs on, as a container runtime kills a container."""
    run = rig.sup.wait_running()
    os.killpg(run, signal.SIGKILL)


def kill9_publisher(rig: Rig) -> None:
    """Kafka log: SIGKILL a process the stream spawned (the publisher child, a render worker)."""
    run = rig.sup.wait_running()
    stream = _wait_for(lambda: stream_child(run))
    spawned = _wait_for(
        # spawned children only: not multiprocessing's resource tracker, which the stream also starts
        lambda: [p for p, cmd in descendants(stream).items() if "spawn_main" in cmd] or None
    )
    os.kill(rig.rng.choice(spawned), signal.SIGKILL)


def sigterm_run(rig: Rig) -> None:
    """SIGTERM to `cdc run` (a deploy, a scale-down): it must stop cleanly; it is started again."""
    run = rig.sup.wait_running()
    os.kill(run, signal.SIGTERM)


def pg_restart_fast(rig: Rig) -> None:
    rig.pg.stop()
    rig.pg.start()


def pg_restart_immediate(rig: Rig) -> None:
    """SIGQUIT to the postmaster: an immediate shutdown (crash recovery at the next start)."""
    pid = rig.pg.pid()
    if pid is not None:
        os.kill(pid, signal.SIGQUIT)
        _wait_for(lambda: None if rig.pg.pid() else True, timeout=60)
    rig.pg.start()


def redis_restart(rig: Rig) -> None:
    rig.redis.stop()
    rig.redis.start()


def redis_stall(rig: Rig) -> None:
    """A follower that stops answering for a while (SIGSTOP), then goes on (SIGCONT)."""
    pid = rig.redis.pid()
    os.kill(pid, signal.SIGSTOP)
    time.sleep(rig.rng.uniform(3, 10))
    os.kill(pid, signal.SIGCONT)


def kafka_restart(rig: Rig) -> None:
    rig.kafka.stop()
    rig.kafka.start()


def disk_full(rig: Rig) -> None:
    """The local log's filesystem filled up by something else for a few seconds, then freed."""
    ballast = rig.log_dir / "ballast"
    with open(ballast, "wb") as f:
        chunk = b"\0" * (1 << 20)
        with contextlib.suppress(OSError):  # ENOSPC: full
            while True:
                f.write(chunk)
                f.flush()
    time.sleep(rig.rng.uniform(3, 8))
    ballast.unlink()


def _wait_for(probe: Callable[[], Any], timeout: float = 60) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError(f"{getattr(probe, '__name__', 'condition')} not met within {timeout:.0f} s")


FAULTS: dict[str, Callable[[Rig], None]] = {
    "kill9_stream": kill9_stream,
    "kill9_apply": kill9_apply,
    "sigterm_run": sigterm_run,
    "pg_restart_fast": pg_restart_fast,
    "pg_restart_immediate": pg_restart_immediate,
    "redis_restart": redis_restart,
    "redis_stall": redis_stall,
    "kafka_restart": kafka_restart,
    "kill9_publisher": kill9_publisher,
    "disk_full": disk_full,
}
KAFKA_ONLY = {"kafka_restart", "kill9_publisher"}
LOCAL_ONLY = {"disk_full"}
