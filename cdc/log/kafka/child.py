"""The publisher child process of `cdc stream` with `log: kafka`.

The stream reader writes the staging log; this child turns its cuts into Kafka records (it is
a separate process so kafka-python's CPU does not share the reader's GIL). The parent:
* checks once, before starting it, that the broker answers (an unreachable broker at start is
  an error within seconds, not an endless retry; later outages are retried by the child);
* learns why the child stopped: a CdcError in the child travels back over a pipe and is raised
  in the parent as the same kind of error (same exit code, no traceback);
* stops it on shutdown with a bounded wait (whatever it did not publish stays durable in the
  staging log and is published by the next run).
The child stops by itself when its parent disappears (kill -9 of `cdc stream`).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING, Any

from cdc.ground import errors, logsetup
from cdc.ground.errors import CdcError, LogError
from cdc.log.kafka.doorbell import Doorbell, wait_for_ring

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from cdc.ground.config import Pipeline
    from cdc.log.local import LocalLog

STOP_WAIT_S = 30.0  # a graceful stop publishes what is durable; longer than this, we stop waiting
# with nothing to publish the child waits for a ring, and looks anyway after 5 ms, then twice as
# long each time it found nothing, up to this (Publisher.run: writers in other processes do not ring)
IDLE_S = 1.0
# Benchmarks only (bench/capture_kafka.py --only latency): poll the staging log every this many
# seconds and ignore the stream's rings, as the publisher did before it had them (0.2).
POLL_ENV = "PGCDC_PUBLISHER_POLL_S"


def check_broker(pipeline: Pipeline) -> None:
    """Raise LogError naming the address when no broker answers (bounded by the client timeout)."""
    from cdc.log.kafka import client as kc

    kc.admin(kc.kafka_log(pipeline)[0]).close()


class PublishWatch:
    """Says when Kafka stops taking the stream's changes, and when it takes them again.

    While the broker is away `cdc stream` goes on: changes become durable in the staging log and
    the slot is acknowledged only up to what Kafka holds, so nothing is lost; but the user must
    hear that it is waiting (and that the source keeps WAL meanwhile). Called by the reader
    between transactions; at most one staging-log look per second and one TCP probe of the
    bootstrap servers per PROBE_EVERY_S once publishing has not moved for STALL_S."""

    STALL_S = 5.0
    PROBE_EVERY_S = 10.0
    WARN_EVERY_S = 60.0

    def __init__(
        self,
        pipeline: Pipeline,
        staging: LocalLog,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        kafka = pipeline.log_config.kafka
        assert kafka is not None
        servers = kafka.bootstrap_servers
        self.servers = [
            s.strip() for s in (servers.split(",") if isinstance(servers, str) else servers) if s.strip()
        ]
        self.staging = staging
        self.clock = clock or time.monotonic
        now = self.clock()
        self._published = -1
        self._moved = now
        self._next_look = 0.0
        self._next_probe = 0.0
        self._last_warn: float | None = None
        self._away_since: float | None = None

    def check(self) -> None:
        from cdc.ground.lsn import format_lsn
        from cdc.log.kafka.publisher import published_lsn

        now = self.clock()
        if now < self._next_look:
            return
        self._next_look = now + 1.0
        published = published_lsn(self.staging)
        if published != self._published:
            self._published, self._moved = published, now
            if self._away_since is not None:
                logger.info(
                    f"Kafka is back after {now - self._away_since:.0f}s: publishing resumed "
                    f"(Kafka holds the changes up to {format_lsn(published)})"
                )
                self._away_since = self._last_warn = None
            return
        cut = self.staging.latest_cut()
        staged = cut.lsn if cut is not None else 0
        if staged <= published or now - self._moved < self.STALL_S or now < self._next_probe:
            return
        self._next_probe = now + self.PROBE_EVERY_S
        problem = unreachable(self.servers)
        if problem is None:
            return  # the broker answers: the publisher is busy (a large backlog), not waiting
        if self._last_warn is not None and now - self._last_warn < self.WARN_EVERY_S:
            return
        if self._away_since is None:
            self._away_since = self._moved
        self._last_warn = now
        logger.warning(
            f"the Kafka broker is unreachable ({problem}); waiting for it "
            f"(nothing published for {now - self._moved:.0f}s). Changes stay durable in the staging log "
            f"(up to {format_lsn(staged)}) and the slot is acknowledged only up to what Kafka holds "
            f"({format_lsn(published)}): nothing is lost, but the source keeps the WAL meanwhile "
            "(retained_wal_bytes in `cdc status`)"
        )


def unreachable(servers: list[str], timeout: float = 2.0) -> str | None:
    """None if any bootstrap server accepts a TCP connection, else what each one said."""
    import socket

    failures = []
    for server in servers:
        host, _, port = server.rpartition(":")
        try:
            socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout).close()
            return None
        except (OSError, ValueError) as exc:
            failures.append(f"{server}: {getattr(exc, 'strerror', None) or exc}")
    return "; ".join(failures) or "no bootstrap servers"


class StopFlag:
    """The parent's stop request to the publisher child, in shared memory without a lock. A
    multiprocessing.Event has one: a child killed with -9 inside Event.is_set() or wait() left it
    held, and the parent's set() at shutdown then waited forever, so `cdc stream` hung after its
    publisher died instead of exiting for its supervisor (the crash campaign's kill9_publisher).
    A signal handler may set it too (an Event's lock, held by the interrupted code, would deadlock)."""

    POLL_S = 0.05

    def __init__(self, ctx: BaseContext) -> None:
        self._value = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._value.value = 1

    def is_set(self) -> bool:
        return bool(self._value.value)

    def wait(self, timeout: float) -> bool:
        """Until set or `timeout` seconds passed; whether it is set."""
        end = time.monotonic() + timeout
        while not self.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.POLL_S, left))
        return True


class PublisherProcess:
    def __init__(self, pipeline: Pipeline) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop = StopFlag(ctx)
        self._bell = Doorbell(ctx)
        self._errors, child_end = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_child_main,
            args=(pipeline, self._stop, child_end, os.getpid(), self._bell.receiver, logsetup.shown()),
            name="cdc-publisher",
        )
        self._child_end = child_end

    def start(self) -> None:
        self._proc.start()
        self._child_end.close()  # only the child writes; EOF tells us it is gone
        self._bell.handed_over()

    def wake(self, *_: object) -> None:
        """A cut was committed to the staging log: the child publishes it now (never blocks)."""
        self._bell.ring()

    def check(self) -> None:
        """Raise the child's error if it stopped (the reader calls this between transactions)."""
        if self._proc.is_alive():
            return
        failure = self._failure()
        if failure is not None:
            raise failure
        raise LogError(
            f"the Kafka publisher of this stream stopped (exit code {self._proc.exitcode})",
            "see its output above; fix the cause and restart",
        )

    def stop(self) -> None:
        self._stop.set()
        self._bell.ring()  # out of its idle wait now
        self._proc.join(STOP_WAIT_S)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._bell.close()

    def _failure(self) -> CdcError | None:
        with contextlib.suppress(EOFError, OSError):
            if self._errors.poll(1.0):
                kind, problem, fix = self._errors.recv()
                cls = getattr(errors, kind, LogError)
                return (
                    cls(problem, fix)
                    if isinstance(cls, type) and issubclass(cls, CdcError)
                    else LogError(problem, fix)
                )
        return None


def _child_main(
    pipeline: Pipeline,
    stop_event: StopFlag,
    error_pipe: Connection,
    parent_pid: int,
    bell: Connection,
    shown: str | None,
) -> None:
    """Entry point of the child (multiprocessing, spawn); its lines are shown as the parent's (`shown`)."""
    if shown is not None:
        logsetup.configure(shown)
        logsetup.set_pipeline(pipeline.name)
    signal.signal(
        signal.SIGINT, signal.SIG_IGN
    )  # Ctrl-C reaches the whole group: the parent decides when we stop
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    from cdc.log import open_log
    from cdc.log.kafka.publisher import Publisher, publisher_lock

    def should_stop() -> bool:
        return stop_event.is_set() or os.getppid() != parent_pid  # re-parented: `cdc stream` is gone

    from cdc.envelope import pure_python_reason

    why = pure_python_reason()
    if why is not None:  # the unusual case: say why publishing costs about 3x the CPU
        logger.info(f"publisher: rendering in pure Python ({why})")
    staging = open_log(pipeline)
    publisher = Publisher(pipeline, staging)
    try:
        with publisher_lock(staging):
            if (
                publisher.run(should_stop, pause=stop_event.wait, **_idle(bell))
                and os.getppid() == parent_pid
            ):
                publisher.publish_once()  # whatever the stream made durable before it stopped
    except CdcError as exc:
        error_pipe.send((type(exc).__name__, exc.problem, exc.fix))
        raise SystemExit(int(exc.exit_code)) from None
    except Exception as exc:  # an unexpected failure still reaches the user as one line
        error_pipe.send(("LogError", f"the Kafka publisher failed: {type(exc).__name__}: {exc}", None))
        raise SystemExit(4) from None
    finally:
        publisher.close()
        staging.close()
        error_pipe.close()  # its EOF tells the parent we are gone


def _idle(bell: Connection) -> dict[str, Any]:
    """How the child waits when it found nothing to publish: for the stream's ring (or the
    POLL_ENV fixed sleep of the benchmark's "before")."""
    poll = os.environ.get(POLL_ENV)
    if poll:
        return {"idle_s": float(poll), "busy_s": float(poll)}
    return {"idle_s": IDLE_S, "idle": lambda seconds: wait_for_ring(bell, seconds)}
