"""The `kafka` log as followers see it: the latest cut from the cut topic, table schemas from
the schema topic, each table's topic and base. Plain Python: Spark reads the change events
(pipelines.apply.readers.kafka)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

import orjson
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from cdc.ground.errors import LogError
from cdc.ground.formats import KAFKA, check_version
from cdc.ground.tables import TableName
from cdc.log.base import Cut, TableRange, TableSchema, TableState
from cdc.log.history import column_defaults
from cdc.log.kafka import client as kc
from cdc.log.kafka.topics import cuts_topic, schemas_topic

if TYPE_CHECKING:
    from cdc.ground.config import Pipeline

POLL_MS = 10_000


def read_topic(consumer: KafkaConsumer, topic: str, start: int | None = None) -> list[ConsumerRecord]:
    """All records of partition 0 of a (small, compacted) topic from `start` (default: beginning)."""
    tp = TopicPartition(topic, 0)
    end = consumer.end_offsets([tp]).get(tp, 0)
    if not end:
        return []
    consumer.assign([tp])
    if start is None:
        consumer.seek_to_beginning(tp)
    else:
        consumer.seek(tp, start)
    out: list[ConsumerRecord] = []
    while (consumer.position(tp) or 0) < end:  # None only before an assignment
        batch = consumer.poll(timeout_ms=POLL_MS)
        if not batch:
            raise LogError(
                f"Kafka topic {topic}: no records arrived within {POLL_MS / 1000:.0f}s while reading to offset {end}"
            )
        for records in batch.values():
            out.extend(records)
    return out


class KafkaLogView:
    value_kind = "envelope"  # values are envelope JSON (see sinks.sparktypes.from_envelope)
    # the staging log's changes, in its order (sinks.changes.TableBatch.inserts_new); a range the
    # broker compacted has gaps in its offsets, which the follower sees
    inserts_are_new = True

    def __init__(self, pipeline: Pipeline) -> None:
        self.cfg, self.prefix = kc.kafka_log(pipeline)
        self.pipeline = pipeline
        self._consumer: KafkaConsumer | None = None
        self._cut_body: dict[str, Any] | None = None
        self._schemas: dict[TableName, list[tuple[int, int, TableSchema]]] | None = None

    @property
    def consumer(self) -> KafkaConsumer:
        if self._consumer is None:
            self._consumer = kc.consumer(self.cfg)
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # ---- metadata ----------------------------------------------------------------------------------
    def latest_cut(self) -> Cut | None:
        topic = cuts_topic(self.prefix)
        tp = TopicPartition(topic, 0)
        end = self.consumer.end_offsets([tp]).get(tp, 0)
        if not end:
            return None
        records = read_topic(self.consumer, topic, end - 1)
        body = orjson.loads(records[-1].value)
        self._check_format(body)
        self._cut_body = body
        tables = {TableName.parse(k): TableRange(v["base"], v["end"]) for k, v in body["tables"].items()}
        return Cut(body["cut_id"], body["lsn"], body["ts_ms"], tables)

    def _check_format(self, body: dict[str, Any]) -> None:
        """FormatTooNew (exit 5) for a cut record a newer cdc wrote (0.1.0's carry no `format`)."""
        where = f"the Kafka log {cuts_topic(self.prefix)}"
        check_version(KAFKA, body.get("format"), where, body.get("cdc_version"))

    def cut(self, cut_id: int) -> Cut | None:
        """An earlier cut by id, read from the cuts topic (None when it is not there)."""
        for record in reversed(read_topic(self.consumer, cuts_topic(self.prefix))):
            body = orjson.loads(record.value)
            if body["cut_id"] == cut_id:
                self._check_format(body)
                tables = {
                    TableName.parse(k): TableRange(v["base"], v["end"]) for k, v in body["tables"].items()
                }
                return Cut(body["cut_id"], body["lsn"], body["ts_ms"], tables)
        return None

    @property
    def log_id(self) -> str:
        if self._cut_body is None:
            self.latest_cut()
        log_id: str = (self._cut_body or {}).get("log_id", "")
        return log_id

    def cut_tables(self) -> dict[str, dict[str, Any]]:
        """The latest cut's per-table entries: topic, base, end, snapshot_lsn, schema_version."""
        if self._cut_body is None:
            self.latest_cut()
        return dict((self._cut_body or {}).get("tables", {}))

    def table_meta(self, table: TableName) -> dict[str, Any]:
        """The latest cut's entry of a table (topic, base, end, ...); LogError when it has none."""
        if self._cut_body is None:
            self.latest_cut()
        meta: dict[str, Any] | None = (self._cut_body or {}).get("tables", {}).get(str(table))
        if meta is None:
            raise LogError(
                f"table {table} is not in the Kafka log",
                f"add it to the pipeline file's tables and run `{self.pipeline.command('snapshot', '--tables', shlex.quote(str(table)))}`",
            )
        return meta

    def first_commit_ms(self, table: TableName, after: int, upto: int) -> int | None:
        """Source commit time (ms since the epoch) of the table's first record after offset `after`
        (up to `upto`), for `cdc status`: header cdc.ts, else the envelope's source.ts_ms; None when
        there is no such record or it carries no time."""
        tp = TopicPartition(self.table_meta(table)["topic"], 0)
        consumer = self.consumer
        consumer.assign([tp])
        consumer.seek(tp, after + 1)
        while (consumer.position(tp) or 0) <= upto:  # None only before an assignment
            batch = consumer.poll(timeout_ms=POLL_MS, max_records=1)
            if not batch:
                return None
            for records in batch.values():
                for rec in records:
                    if rec.offset > upto:
                        return None
                    ts_us = int(dict(rec.headers or []).get("cdc.ts", b"0") or 0)
                    if ts_us:
                        return ts_us // 1000
                    if rec.value is not None:
                        return (orjson.loads(rec.value).get("source") or {}).get("ts_ms") or None
        return None

    def tables(self) -> list[TableState]:
        cut = self.latest_cut()
        if cut is None:
            return []
        out = []
        for name, meta in (self._cut_body or {}).get("tables", {}).items():
            out.append(
                TableState(
                    TableName.parse(name),
                    0,
                    meta.get("state", "live"),
                    meta["base"],
                    meta.get("snapshot_lsn"),
                    0,
                    meta.get("schema_version"),
                    meta.get("dropped_lsn"),
                )
            )
        return out

    def table_state(self, table: TableName) -> TableState | None:
        return next((t for t in self.tables() if t.table == table), None)

    def _history(self, table: TableName) -> list[tuple[int, int, TableSchema]]:
        if self._schemas is None:
            found: dict[TableName, list[tuple[int, int, TableSchema]]] = {}
            for record in read_topic(self.consumer, schemas_topic(self.prefix)):
                body = orjson.loads(record.value)
                found.setdefault(TableName.parse(body["table"]), []).append(
                    (body["version"], body["since_lsn"], TableSchema.from_json(body["schema"]))
                )
            self._schemas = {
                t: sorted({v[0]: v for v in h}.values(), key=lambda v: v[0]) for t, h in found.items()
            }
        history = self._schemas.get(table)
        if not history:
            raise LogError(
                f"the Kafka log has no schema for {table}", "is `cdc stream` (with its publisher) running?"
            )
        return history

    def schema(self, table: TableName, version: int | None = None) -> TableSchema:
        history = self._history(table)
        if version is None:
            return history[-1][2]
        return next(s for v, _, s in history if v == version)

    def column_defaults(self, table: TableName) -> dict[str, tuple[int, str]]:
        return column_defaults([(since, schema) for _, since, schema in self._history(table)])

    def schema_history(self, table: TableName) -> list[tuple[int, int, TableSchema]]:
        """(version, since LSN, schema) of every schema version of the table, oldest first."""
        return list(self._history(table))

    @property
    def retention_ms(self) -> int:
        """How long the table topics keep tombstones: a follower away longer may miss deletes."""
        from cdc.log.kafka.topics import TABLE_TOPIC_CONFIG

        return int({**TABLE_TOPIC_CONFIG, **self.cfg.topic_config}["delete.retention.ms"])

    def stream_position(self) -> tuple[int, int] | None:
        return None

    def meta(self, key: str) -> str | None:
        return None
