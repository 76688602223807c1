"""The stream's "something to publish" signal to its Kafka publisher child, without a lock.

The publisher used to look at the staging log every 0.2 s when it found nothing new, so a change
waited 100 ms on average (and up to 200) before it was even rendered. Now the stream rings after
each cut it commits and the publisher sleeps in select() until a ring (or a timeout, its
fallback). The ring is one byte written to an os.pipe, non-blocking: a full pipe (the publisher
is busy or stopped: it already has a ring to read) or a closed one (the publisher was killed with
-9) costs the stream nothing and never blocks it. That is the property the stop request
(child.StopFlag) keeps for the same reason: nothing the child holds can stall the parent.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext

_DRAIN = 4096


class Doorbell:
    """Made by the parent before it starts the child; `receiver` goes to the child (a
    multiprocessing Connection: spawn passes its descriptor), the parent keeps the sending end."""

    def __init__(self, ctx: BaseContext) -> None:
        self.receiver, self._sender = ctx.Pipe(duplex=False)
        os.set_blocking(self._sender.fileno(), False)

    def ring(self) -> None:
        """Tell the child there is something to publish; never blocks, never raises."""
        with contextlib.suppress(OSError):  # EAGAIN: a ring is already waiting; EPIPE: the child is gone
            os.write(self._sender.fileno(), b"\x01")

    def handed_over(self) -> None:
        """The child started with its own copy of the receiving end: drop ours, so a dead child
        makes our writes fail at once (EPIPE) instead of filling a pipe nobody reads."""
        self.receiver.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sender.close()


def wait_for_ring(receiver: Connection, timeout: float) -> bool:
    """In the child: sleep until the parent rings or `timeout` seconds passed; whether it rang.
    Every ring waiting is consumed: one wake-up covers all cuts committed until now."""
    fd = receiver.fileno()
    os.set_blocking(fd, False)
    readable, _, _ = select.select([fd], [], [], timeout)
    if not readable:
        return False
    try:
        data = os.read(fd, _DRAIN)
        while len(data) == _DRAIN:
            data = os.read(fd, _DRAIN)
    except BlockingIOError:
        return True
    if not data:  # EOF: the parent closed its end (it is stopping or gone); sleep instead of spinning
        time.sleep(timeout)
        return False
    return True
