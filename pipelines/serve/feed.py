"""Fan-out: one reader of the log per table, shared by every subscriber of it.

The hub polls the log's latest cut (every `poll_s`), reads each table's new whole transactions
once (in a worker thread) and hands them to every subscriber's bounded queue. It also keeps the
newest `ring` transactions in memory, so a client resuming from a recent position catches up
without touching the log; an older position is read from the log by that client's own request.

Memory per client is bounded: its queue holds at most `queue` transactions. A client that falls
that far behind is cut off (never waited for): it gets a `slow-client` control event with the last
position it received and resumes from there with Last-Event-ID or ?from=, like any reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from cdc.envelope import EnvelopeRenderer
from cdc.ground.logsetup import STDERR
from cdc.ground.secrets import redact
from cdc.ground.tables import TableName
from pipelines.serve import metrics
from pipelines.serve.logview import Access, Txn
from pipelines.serve.shape import TableShape

logger = logging.getLogger(__name__)

READ_EVENTS = 5000  # events per log read: bounds one read's memory and how long it holds a thread


@dataclass
class Control:
    """Why a stream ends. must-refetch reasons: compacted, rebuilt, schema-changed, unknown-position;
    `slow-client` is not a refetch: resume from `position`."""

    reason: str
    message: str
    position: int | None = None

    @property
    def refetch(self) -> bool:
        return self.reason != "slow-client"


@dataclass(eq=False)
class Subscriber:
    queue: asyncio.Queue[Txn | None]
    control: Control | None = None

    def stop(self, control: Control) -> None:
        self.control = control
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(None)  # wakes a waiting reader; a full queue is drained first anyway


@dataclass(eq=False)
class TableFeed:
    name: str
    shape: TableShape
    renderer: EnvelopeRenderer
    position: int = 0  # the last offset read and published
    base: int | None = None
    ring_size: int = 1024
    ring: deque[Txn] = field(default_factory=deque)
    ring_start: int = 0  # the ring holds every transaction after this offset up to `position`
    subscribers: set[Subscriber] = field(default_factory=set)
    ready: bool = False  # the first cut was read
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _sent: Any = None

    def sent_counter(self):  # the labelled child, looked up once
        if self._sent is None:
            self._sent = metrics.EVENTS_SENT.labels(metrics.PIPELINE.name, self.name)
        return self._sent

    @property
    def table(self) -> TableName:
        return self.shape.table

    def since(self, position: int) -> list[Txn] | None:
        """The transactions after `position` from memory, or None when the ring does not reach back."""
        if position < self.ring_start:
            return None
        return [t for t in self.ring if t.last > position]

    def subscribe(self, position: int, queue: int) -> Subscriber | None:
        """Join the live stream; only at the feed's own position, so nothing is missed or doubled."""
        if position != self.position:
            return None
        sub = Subscriber(asyncio.Queue(maxsize=queue))
        self.subscribers.add(sub)
        metrics.SUBSCRIBERS.labels(metrics.PIPELINE.name, self.name).inc()
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        if sub in self.subscribers:
            self.subscribers.discard(sub)
            metrics.SUBSCRIBERS.labels(metrics.PIPELINE.name, self.name).dec()

    def publish(self, txn: Txn) -> None:
        self.ring.append(txn)
        while len(self.ring) > self.ring_size:
            self.ring_start = self.ring.popleft().last
        self.position = txn.last
        for sub in list(self.subscribers):
            try:
                sub.queue.put_nowait(txn)
            except asyncio.QueueFull:
                self.unsubscribe(sub)
                metrics.DROPPED.labels(metrics.PIPELINE.name, self.name).inc()
                sub.stop(
                    Control("slow-client", "the client fell more than its queue behind; resume from position")
                )
        depth = max((sub.queue.qsize() for sub in self.subscribers), default=0)
        metrics.SUBSCRIBER_LAG.labels(metrics.PIPELINE.name, self.name).set(depth)
        self._wake()

    def advance(self, position: int) -> None:
        self.position = max(self.position, position)
        self._wake()

    def restart(self, control: Control, position: int) -> None:
        """Every subscriber must start over; the ring forgets what came before `position`."""
        for sub in list(self.subscribers):
            self.unsubscribe(sub)
            sub.stop(control)
        self.ring.clear()
        self.ring_start = self.position = position
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)


class Hub:
    def __init__(
        self, access: Access, shapes: dict[str, TableShape], pipeline_name: str, poll_s: float, ring: int
    ):
        self.access = access
        self.poll_s = poll_s
        self.renderer = EnvelopeRenderer("", pipeline_name)
        self.feeds = {
            name: TableFeed(name, shape, self.renderer, ring_size=ring) for name, shape in shapes.items()
        }
        self.version: dict[str, int | None] = {}
        self.error: str | None = None

    async def start(self) -> None:
        cut, states = await asyncio.to_thread(self.access.latest)
        self.renderer.database = self.access.database  # known once the log is open
        for feed in self.feeds.values():
            rng = cut.tables.get(feed.table) if cut else None
            state = states.get(feed.table)
            feed.base = state.base if state else None
            feed.position = feed.ring_start = rng.end if rng else 0
            feed.ready = True

    async def run(self) -> None:
        while True:
            try:
                await self.poll()
                if self.error is not None:
                    logger.info("cdc serve: reading the log works again", extra=STDERR)
                self.error = None
            except Exception as exc:  # a log read failed: say so (once) and on /healthz, try again
                error = redact(f"{type(exc).__name__}: {exc}")  # no password of a DSN or URL
                if error != self.error:
                    logger.warning(f"cdc serve: reading the log failed, retrying: {error}", extra=STDERR)
                self.error = error
            await asyncio.sleep(self.poll_s)

    async def poll(self) -> None:
        cut, states = await asyncio.to_thread(self.access.latest)
        if cut is None:
            return
        for feed in self.feeds.values():
            rng, state = cut.tables.get(feed.table), states.get(feed.table)
            if rng is None or state is None:
                continue
            if state.base != feed.base:
                feed.base = state.base
                self.version.pop(feed.name, None)
                feed.restart(
                    Control("rebuilt", f"{feed.name} was snapshotted again; fetch its rows anew"), rng.end
                )
                continue
            while feed.position < rng.end:
                after = feed.position
                batch = await asyncio.to_thread(
                    self.access.read_txns, self.renderer, feed.shape, after, rng.end, READ_EVENTS
                )
                for txn in batch.txns:
                    known = self.version.get(feed.name)
                    if known is not None and txn.version != known:
                        feed.restart(
                            Control(
                                "schema-changed", f"the columns of {feed.name} changed; fetch its rows anew"
                            ),
                            feed.position,
                        )
                    self.version[feed.name] = txn.version
                    feed.publish(txn)
                    metrics.EVENTS_READ.labels(metrics.PIPELINE.name, feed.name).inc(len(txn.changes))
                if batch.rebuilt:
                    feed.restart(
                        Control("rebuilt", f"{feed.name} was snapshotted again; fetch its rows anew"), rng.end
                    )
                    break
                feed.advance(batch.position)
