"""Publishing the staging log to Kafka: the `kafka` log backend's writer.

Capture (snapshot and stream) always writes the embedded log first — it is fast, crash-safe
and already keeps snapshots and changes in position order. With `log: kafka` that log lives
in <state_dir>/staging and this publisher turns its cuts into Kafka: per table, the records
after what was published (rendered as Debezium-compatible key/value JSON, a tombstone after
each delete, the position in headers), then — once Kafka acknowledged them all (idempotent
producer, acks=all) — a cut record naming every table topic's base and end offsets. Only
then does the published position move, and the stream acknowledges to PostgreSQL no further
than that position: the slot never passes anything Kafka does not hold.

A crash between producing and recording the cut republishes the same events: the topic then
holds duplicates at the same positions, which followers ignore (they dedupe by position) and
which lie outside any cut until the cut is written.

Headers on every record: cdc.lsn and cdc.seq (the position), cdc.ts (commit time, µs since
the epoch), cdc.sv (schema version of the table, to type the values).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import orjson
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.errors import KafkaError
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from cdc.envelope import speedups
from cdc.ground.clock import now_ms
from cdc.ground.errors import LogError
from cdc.ground.formats import KAFKA, VERSION
from cdc.ground.private import private_open
from cdc.ground.tables import TableName
from cdc.log.kafka import client as kc
from cdc.log.kafka.recordbatch import NO_HEADERS, RecordsBody
from cdc.log.kafka.render import RenderPool, RenderTask, render_bodies
from cdc.log.kafka.topics import META_TOPIC_CONFIG, TABLE_TOPIC_CONFIG, cuts_topic, schemas_topic, table_topic
from cdc.log.local import LocalLog

if TYPE_CHECKING:
    from cdc.ground.config import Pipeline
    from cdc.log.base import Cut
    from cdc.log.kafka.batch_producer import BatchProducer

logger = logging.getLogger(__name__)

STATE_KEY = "kafka_published"
CUT_KEY = b"cut"
BATCH_BYTES = 1 << 20  # record batch (and Produce request) size
PART_EVENTS = 20_000  # a render task: this many events, or
PART_BYTES = 8 << 20  # this much of a snapshot segment file
BUSY_S = 0.005  # the first wait after a look that published something (Publisher.run)


def default_workers() -> int:
    """Render workers when the pipeline file does not say. None with the C speedup: rendering
    in C costs less than handing the rendered batches back from a worker process (measured:
    1M snapshot rows 195k rows/s in the publisher, 143k with one worker). In pure Python: one
    per core, up to 4; none on one core."""
    if speedups():
        return 0
    cores = os.cpu_count() or 1
    return 0 if cores < 2 else min(cores, 4)


def _counted(bodies: Iterable[RecordsBody], progress: Callable[[int], None] | None) -> Iterator[RecordsBody]:
    for body in bodies:
        yield body
        if progress is not None:
            progress(body.count)


@dataclass
class PublishedTable:
    topic: str
    local_base: int
    local_end: int
    kafka_base: int
    kafka_end: int  # last offset covered (kafka_base - 1 when empty)
    schema_version: int = 0


@dataclass
class PublishedState:
    cut_id: int = 0
    lsn: int = 0
    tables: dict[str, PublishedTable] = field(default_factory=dict)

    @classmethod
    def load(cls, log: LocalLog) -> PublishedState:
        raw = log.meta(STATE_KEY)
        if raw is None:
            return cls()
        data = orjson.loads(raw)
        return cls(data["cut_id"], data["lsn"], {k: PublishedTable(**v) for k, v in data["tables"].items()})

    def save(self, log: LocalLog) -> None:
        log.set_meta(STATE_KEY, orjson.dumps(asdict(self)).decode())


def published_lsn(log: LocalLog) -> int:
    raw = log.meta(STATE_KEY)
    return orjson.loads(raw)["lsn"] if raw else 0


class Publisher:
    def __init__(self, pipeline: Pipeline, staging: LocalLog) -> None:
        self.cfg, self.prefix = kc.kafka_log(pipeline)
        self.pipeline = pipeline
        self.staging = staging
        self._producer: BatchProducer | None = None
        self._admin: KafkaAdminClient | None = None
        self._pool: RenderPool | None = None
        self._database = ""
        # Ranges larger than one part are rendered by `workers` processes (0: in this one).
        workers = self.cfg.publisher_workers
        self.workers = workers if workers is not None else default_workers()
        self.part_events = PART_EVENTS
        self.part_bytes = PART_BYTES
        self._ready_topics: set[str] = set()

    # ---- clients ---------------------------------------------------------------------------------
    @property
    def producer(self) -> BatchProducer:
        if self._producer is None:
            self._producer = kc.producer(self.cfg)
        return self._producer

    def _ensure(self, topics: dict[str, dict[str, str]]) -> None:
        todo = {t: c for t, c in topics.items() if t not in self._ready_topics}
        if not todo:
            return
        if self._admin is None:
            self._admin = kc.admin(self.cfg)
        kc.ensure_topics(self._admin, todo, self.cfg.fix_cleanup_policy, self.cfg.replication_factor)
        self._ready_topics |= set(todo)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        for c in (self._producer, self._admin):
            if c is not None:
                with contextlib.suppress(Exception):  # closing a broken client must not mask the real error
                    c.close()
        self._producer = self._admin = None

    # ---- publishing ------------------------------------------------------------------------------
    def publish_once(self, progress: Callable[[int], None] | None = None) -> int:
        """Publish everything up to the staging log's latest cut; returns records produced."""
        cut = self.staging.latest_cut()
        state = PublishedState.load(self.staging)
        if cut is None or cut.id == state.cut_id:
            return 0
        self._ensure(
            {cuts_topic(self.prefix): META_TOPIC_CONFIG, schemas_topic(self.prefix): META_TOPIC_CONFIG}
        )
        self._database = self.staging.meta("source_database") or ""
        produced = 0
        for table, rng in sorted(cut.tables.items()):
            name = str(table)
            topic = table_topic(self.prefix, table)
            self._ensure({topic: {**TABLE_TOPIC_CONFIG, **self.cfg.topic_config}})
            prev = state.tables.get(name)
            version = self._publish_schemas(table, prev.schema_version if prev else 0)
            new_base = prev is None or prev.local_base != rng.base
            after = rng.base - 1 if prev is None or new_base else prev.local_end
            first, last, n = self._produce(table, topic, after, rng.end, progress)
            produced += n
            if prev is None or new_base:
                base = first if first is not None else kc.end_offsets(self._consumer(), [topic])[topic]
                end = last if last is not None else base - 1
            else:
                base, end = prev.kafka_base, last if last is not None else prev.kafka_end
            state.tables[name] = PublishedTable(topic, rng.base, rng.end, base, end, version)
        self._write_cut(cut, state)
        state.cut_id, state.lsn = cut.id, cut.lsn
        state.save(self.staging)
        return produced

    def _consumer(self) -> KafkaConsumer:
        return kc.consumer(self.cfg)

    def _publish_schemas(self, table: TableName, published: int) -> int:
        history = self.staging.schema_history(table)
        newest = history[-1][0] if history else 0
        records = []
        for version, since, schema in history:
            if version > published:
                value = {
                    "table": str(table),
                    "version": version,
                    "since_lsn": since,
                    "schema": schema.to_json(),
                }
                records.append((f"{table}/{version}".encode(), orjson.dumps(value), NO_HEADERS))
        if records:
            self.producer.send(schemas_topic(self.prefix), records)
        return newest

    def _produce(
        self, table: TableName, topic: str, after: int, upto: int, progress: Callable[[int], None] | None
    ) -> tuple[int | None, int | None, int]:
        if upto <= after:
            return None, None, 0
        parts = self.staging.read_parts(
            table, after, upto, events=self.part_events, segment_bytes=self.part_bytes
        )
        tasks = [
            RenderTask(str(self.staging.path), str(table), part, self._database, self.prefix, BATCH_BYTES)
            for part in parts
        ]
        if len(tasks) > 1 and self.workers > 0:
            bodies = self._render_pool().bodies(tasks)
        else:
            bodies = (body for task in tasks for body in render_bodies(task, self.staging))
        return self.producer.send_bodies(topic, _counted(bodies, progress))

    def _render_pool(self) -> RenderPool:
        if self._pool is None:
            self._pool = RenderPool(self.workers)
        return self._pool

    def _write_cut(self, cut: Cut, state: PublishedState) -> None:
        tables = {}
        for name, t in state.tables.items():
            if TableName.parse(name) not in cut.tables:
                continue
            st = self.staging.table_state(TableName.parse(name))
            tables[name] = {
                "topic": t.topic,
                "base": t.kafka_base,
                "end": t.kafka_end,
                "snapshot_lsn": st.snapshot_lsn if st else None,
                "schema_version": t.schema_version,
                # 'dropped': the table is gone from the source and every change it had is in the topic
                "state": st.state if st and st.state == "dropped" else "live",
                "dropped_lsn": st.dropped_lsn if st else None,
            }
        value = {
            "cut_id": cut.id,
            "lsn": cut.lsn,
            "ts_ms": now_ms(),
            "log_id": self.staging.log_id,
            "tables": tables,
        }
        value |= {
            "format": KAFKA.version,
            "cdc_version": VERSION,
        }  # the topics' format (cdc/ground/formats.py)
        self.producer.send(cuts_topic(self.prefix), [(CUT_KEY, orjson.dumps(value), NO_HEADERS)])

    # ---- continuous --------------------------------------------------------------------------------
    def run(
        self,
        should_stop: Callable[[], bool],
        idle_s: float = 0.2,
        pause: Callable[[float], object] = time.sleep,
        idle: Callable[[float], object] | None = None,
        busy_s: float = BUSY_S,
    ) -> bool:
        """Publish until should_stop(); a broker that goes away is retried with backoff (the
        events wait in the staging log, and the slot is not acknowledged past them). `pause`
        sleeps between attempts and returns early on a stop request; `idle` (default: `pause`)
        waits when nothing was new, and returns early when the stream says it committed a cut
        (child.py: the doorbell). That wait adapts: `busy_s` after a look that published
        something, twice as long after each look that found nothing, up to `idle_s`. So a
        writer that does not ring (`cdc snapshot` or `cdc log remove-table` beside a running
        stream, in another process) is seen within milliseconds while it writes, and an idle
        publisher looks only every `idle_s`. Returns whether the broker answered last (False:
        stopped while it was away)."""
        giving_up = stop_after_delay(3600)
        wait = min(busy_s, idle_s)

        def sleep(seconds: float) -> None:  # tenacity's sleep returns nothing; a pause may say it was woken
            pause(seconds)

        while not should_stop():
            try:
                for attempt in Retrying(
                    retry=retry_if_exception_type((KafkaError, LogError, OSError)),
                    wait=wait_exponential(multiplier=0.5, max=10),
                    stop=lambda state: giving_up(state) or should_stop(),
                    sleep=sleep,
                    reraise=True,
                ):
                    with attempt:
                        try:
                            produced = self.publish_once()
                        except (KafkaError, LogError, OSError) as exc:
                            logger.info(
                                f"publisher: Kafka not available ({type(exc).__name__}: {exc}); retrying"
                            )
                            self.close()
                            raise
            except (KafkaError, LogError, OSError):
                if should_stop():
                    return False
                raise
            if produced:
                wait = min(busy_s, idle_s)
            else:
                (idle or pause)(wait)
                wait = min(wait * 2, idle_s)
        return True


@contextlib.contextmanager
def publisher_lock(staging: LocalLog, wait: bool = True) -> Iterator[bool]:
    """One publisher per pipeline at a time (two would interleave records). Yields True when
    held; with wait=False yields False at once if another process publishes."""
    import fcntl

    path = staging.path / "publisher.lock"
    with private_open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
