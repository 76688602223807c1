"""The feed's reads of a `kafka` log (log: kafka): the same answers as pipelines/serve/logview.py's
LogAccess, from the topics. Positions are the table topic's offsets; a record's value is already
the envelope (`cdc log read` prints it as is), its headers carry the position (cdc.lsn, cdc.seq)
and the schema version (cdc.sv). One consumer per worker thread (a consumer is not thread-safe).

What Kafka does not tell: which deletes its compaction removed (delete.retention.ms), so a client
resuming from a position older than that may miss a delete without a `compacted` control event.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from kafka import TopicPartition

from cdc.envelope import EnvelopeRenderer
from cdc.ground.config import Pipeline
from cdc.ground.errors import LogError
from cdc.ground.tables import TableName
from cdc.log.base import Cut, TableState
from pipelines.serve.logview import Batch, Change, Txn
from pipelines.serve.shape import TableShape

POLL_MS = 10_000


class KafkaAccess:
    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self._local = threading.local()
        self.database = ""

    def view(self) -> Any:
        from cdc.log.kafka.view import KafkaLogView

        view = getattr(self._local, "view", None)
        if view is None:
            view = self._local.view = KafkaLogView(self.pipeline)
        return view

    def latest(self) -> tuple[Cut | None, dict[TableName, TableState]]:
        view = self.view()
        cut = view.latest_cut()
        if cut is None:
            return None, {}
        states = {}
        for name, meta in (view._cut_body or {}).get("tables", {}).items():
            table = TableName.parse(name)
            states[table] = TableState(
                table,
                0,
                meta.get("state", "live"),
                meta["base"],
                meta.get("snapshot_lsn"),
                0,
                meta.get("schema_version"),
            )
        return cut, states

    def _records(self, table: TableName, after: int, upto: int) -> Iterator[Any]:
        view = self.view()
        tp = TopicPartition(view.table_meta(table)["topic"], 0)
        consumer = view.consumer
        consumer.assign([tp])
        consumer.seek(tp, after + 1)
        while consumer.position(tp) <= upto:
            batch = consumer.poll(timeout_ms=POLL_MS)
            if not batch:  # never "read to upto" without the records: the caller retries (no gap)
                raise LogError(
                    f"Kafka topic {tp.topic}: no records arrived within {POLL_MS / 1000:.0f}s while reading to offset {upto}"
                )
            for records in batch.values():
                for rec in records:
                    if rec.offset > upto:
                        return
                    yield rec

    def read_txns(
        self, renderer: EnvelopeRenderer, shape: TableShape, after: int, upto: int, max_events: int
    ) -> Batch:
        txns: list[Txn] = []
        count = 0
        for rec in self._records(shape.table, after, upto):
            headers = dict(rec.headers or [])
            lsn = int(headers.get("cdc.lsn", b"0"))
            if txns and txns[-1].lsn == lsn:
                txn = txns[-1]
            else:
                if count >= max_events:
                    return Batch([t for t in txns if t.changes], txns[-1].last)
                txn = Txn(lsn, rec.offset, int(headers.get("cdc.sv", b"0") or 0))
                txns.append(txn)
            txn.last = rec.offset
            if rec.value is not None:  # a delete's tombstone is for compaction, not for clients
                txn.changes.append(Change(bytes(rec.value)))
                count += 1
        return Batch([t for t in txns if t.changes], upto)

    def state_at(self, renderer: EnvelopeRenderer, shape: TableShape, base: int, end: int) -> list[Change]:
        rows: dict[bytes, Change] = {}
        for rec in self._records(shape.table, base - 1, end):
            if rec.value is None:
                rows.pop(bytes(rec.key), None)
                continue
            change = Change(bytes(rec.value))
            op = change.doc.get("op")
            if op == "t":
                rows.clear()
            elif op == "d":
                rows.pop(bytes(rec.key), None)
            else:
                rows[bytes(rec.key)] = change
        return list(rows.values())

    def version_at(self, table: TableName, position: int) -> int | None:
        for rec in self._records(table, position - 1, position):
            sv = dict(rec.headers or []).get("cdc.sv")
            return int(sv) if sv else None
        return None

    def key(self, table: TableName) -> tuple[str, ...]:
        return self.view().schema(table).key

    def purged_below(self, state: TableState) -> int:
        return 0
