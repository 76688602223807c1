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
import multiprocessing
import os
import signal

from pipelines import errors
from pipelines.errors import CdcError, LogError

STOP_WAIT_S = 30.0  # a graceful stop publishes what is durable; longer than this, we stop waiting


def check_broker(pipeline) -> None:
    """Raise LogError naming the address when no broker answers (bounded by the client timeout)."""
    from cdc.log.kafka import client as kc

    cfg = pipeline.log_config.kafka
    kc.admin(cfg.bootstrap_servers).close()


class PublisherProcess:
    def __init__(self, pipeline):
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._errors, child_end = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_child_main, args=(pipeline, self._stop, child_end, os.getpid()), name="cdc-publisher"
        )
        self._child_end = child_end

    def start(self) -> None:
        self._proc.start()
        self._child_end.close()  # only the child writes; EOF tells us it is gone

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
        self._proc.join(STOP_WAIT_S)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)

    def _failure(self) -> CdcError | None:
        with contextlib.suppress(EOFError, OSError):
            if self._errors.poll(1.0):
                kind, problem, fix = self._errors.recv()
                cls = getattr(errors, kind, LogError)
                return cls(problem, fix) if isinstance(cls, type) and issubclass(cls, CdcError) else LogError(problem, fix)
        return None


def _child_main(pipeline, stop_event, error_pipe, parent_pid: int) -> None:
    """Entry point of the child (multiprocessing, spawn)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent decides when we stop
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    from cdc.log import open_log
    from cdc.log.kafka.publisher import Publisher, publisher_lock

    def should_stop() -> bool:
        return stop_event.is_set() or os.getppid() != parent_pid  # re-parented: `cdc stream` is gone

    from cdc.envelope import pure_python_reason

    why = pure_python_reason()
    if why is not None:  # the unusual case: say why publishing costs about 3x the CPU
        print(f"publisher: rendering in pure Python ({why})", flush=True)
    staging = open_log(pipeline)
    publisher = Publisher(pipeline, staging, say=lambda m: print(m, flush=True))
    try:
        with publisher_lock(staging):
            if publisher.run(should_stop, pause=stop_event.wait) and os.getppid() == parent_pid:
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
