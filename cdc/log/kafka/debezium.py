"""Existing Debezium topics as the log (`log: {kafka: {format: debezium, topic_prefix: ...}}`).

A Debezium PostgreSQL connector writes one topic per table (`<prefix>.<schema>.<table>`, one
partition), each record a change event envelope (JSON converter, with or without schemas), a
tombstone after each delete, and — with `provide.transaction.metadata=true` — BEGIN/END records
in `<prefix>.transaction`. `DebeziumLogView` offers followers (apply, verify, status) the same
plain-Python methods as `KafkaLogView` (cut, tables, schemas, state); Spark reads the table
topics in executors (pipelines.apply.readers.debezium).

What Debezium's PostgreSQL fields mean with pgoutput (checked on real events of Debezium
3.7.0.Final against the pgoutput messages of the same transactions; see
tests/integration/test_debezium.py::test_debezium_positions_follow_commit_order):

* `source.lsn`: the LSN of the change's own WAL record (the XLogData start pgoutput sends for
  an I/U/D message). Not unique: the rows of one multi-insert (COPY) share it, and a primary-key
  change's delete and create share it. Not in commit order across transactions (transactions
  interleave in the WAL); for one row it is, because row locks order the writers.
* `source.sequence` = `["<lastCommitLsn>", "<lsn>"]`: lastCommitLsn is the END of the commit
  record of the *previous* transaction Debezium processed (null for the first transaction after
  a connector start), not the event's own commit.
* `source.txId`: the transaction's 32-bit xid (the same for snapshot rows: the snapshot's xid).
* `transaction.id` = `"<xid>:<lsn>"` where lsn is the position Debezium was at when it wrote
  the record: it differs between BEGIN, each event and END of one transaction, so only the
  xid part identifies the transaction. In the END record it is the end of the commit record
  (the next transaction's `sequence[0]` repeats it).
* `transaction.total_order`: 1-based index of the event in its transaction, across tables;
  `data_collection_order` the same within one table.
* Snapshot rows: `op: "r"`, `source.snapshot` `first` / `true` / `last_in_data_collection` /
  `last` (the very last row of the snapshot), `source.lsn` the snapshot's consistent point, no
  `transaction` block and no BEGIN/END records.

Positions (commit LSN, index), as followers compare them:

* stream event with a transaction block whose END record is in the transaction topic:
  (END's LSN - 1, total_order). END's LSN is the end of the commit record, so END - 1 lies
  inside the commit record: for every record boundary P (a slot's consistent point, a WAL
  position) `END - 1 < P` exactly when the transaction committed before P, as with the
  commit LSN our own log uses. total_order makes the pair unique inside the transaction.
* stream event without (no transaction metadata, or its END already expired):
  (source.lsn, 1). Orders each row's events like commit order (a writer of a row waits for
  the previous writer's commit, so its change comes later in the WAL), which is what
  followers need per key; it is not a commit order across rows.
* snapshot row: (source.lsn, 0) — the snapshot's consistent point, before any streamed
  event (those commit after it).

The cut (`latest_cut`) is confirmed transaction by transaction from the transaction topic, or
taken at the topics' high watermarks without it: cdc/log/kafka/debezium_cut.py says how.

Tombstones are skipped: Debezium writes a delete event before each of them, which carries the
position. Malformed records (value not JSON, no `op`, no position, a key that is not a JSON
object) are found in Spark (the reader) before anything is merged: the apply stops naming topic, partition
and offset, or, with `dead_letter: <path>`, parks them in a Delta table there and goes on.

Column types come from the source database's catalog (the JSON carries no PostgreSQL types
when schemas are disabled, and Connect types when enabled). Debezium's values are those of our
envelope (docs/reference/types.md) with the connector settings of pipelines/devservices/debezium.py,
except `timestamp(0..3)`, which Debezium's adaptive mode writes in milliseconds: converted by the
reader.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from cdc.ground.errors import LogError
from cdc.ground.private import private_dir
from cdc.ground.tables import TableName
from cdc.log.base import Cut, TableRange, TableSchema, TableState
from cdc.log.kafka import client as kc
from cdc.log.kafka.debezium_cut import ScanState, TopicScan, parse_envelope, parse_txn_id, unwrap

POLL_MS = 10_000
CHUNK = 200_000  # records read per topic per scan round (bounds the scan's memory)

_TOPIC_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

if TYPE_CHECKING:
    from psycopg2.extensions import connection

    from cdc.ground.config import Pipeline


def debezium_topic(prefix: str, table: TableName) -> str:
    """Debezium's default topic name (characters Kafka does not allow become `_`)."""
    return f"{prefix}.{_TOPIC_UNSAFE.sub('_', table.schema)}.{_TOPIC_UNSAFE.sub('_', table.name)}"


class DebeziumLogView:
    value_kind = "envelope"
    # No promise that an insert's key was absent before it (sinks.changes.TableBatch.inserts_new):
    # positions are derived from the records (pipelines/apply/readers/debezium.py) and incremental
    # snapshot rows come between the stream's events
    inserts_are_new = False
    # A follower past the topics' retention cannot be repaired by `cdc snapshot` (Debezium owns
    # the slot): rebuild it from the topics, which hold the compacted state.
    rebuild_hint = (
        "delete this follower's data for {table}, then `{reset}` (the next apply rebuilds the follower from the "
        "topics, which hold the compacted state), or have the Debezium connector take a new snapshot"
    )

    @property
    def log_id(self) -> str:
        return f"debezium:{self.prefix}"

    def __init__(self, pipeline: Pipeline) -> None:
        self.cfg, self.prefix = kc.kafka_log(pipeline)
        self.pipeline = pipeline
        self.txn_topic = self.cfg.transaction_topic or f"{self.prefix}.transaction"
        self._consumer: KafkaConsumer | None = None
        self._admin: KafkaAdminClient | None = None
        self._tables: list[TableName] | None = None
        self._schemas: dict[TableName, TableSchema] = {}
        self._state: ScanState | None = None
        self._cut: Cut | None = None

    # ---- clients -----------------------------------------------------------------------------------
    @property
    def consumer(self) -> KafkaConsumer:
        if self._consumer is None:
            self._consumer = kc.consumer(
                self.cfg,
                client_id="cdc-debezium-reader",
                consumer_timeout_ms=float("inf"),  # as before: no iterator timeout
                max_poll_records=20_000,
                max_partition_fetch_bytes=16 << 20,
                fetch_max_bytes=64 << 20,
            )
        return self._consumer

    def close(self) -> None:
        for client in (self._consumer, self._admin):
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
        self._consumer = self._admin = None

    # ---- tables and schemas (from the source catalog) ----------------------------------------------
    def _connect(self) -> connection:
        from cdc.source import connect

        conn: connection = connect(self.pipeline.source.postgres.dsn, application_name="cdc debezium reader")
        return conn

    def followed_tables(self) -> list[TableName]:
        if self._tables is None:
            from cdc.source import resolve_tables

            conn = self._connect()
            try:
                found, missing = resolve_tables(conn, self.pipeline.table_selectors)
            finally:
                conn.close()
            if missing:
                raise LogError(
                    f"table(s) {', '.join(missing)} of the pipeline do not exist in the source database",
                    "fix source.postgres.tables (the Debezium reader takes column types from the source's catalog)",
                )
            self._tables = found
        return self._tables

    def topic(self, table: TableName) -> str:
        return debezium_topic(self.prefix, table)

    def schema(self, table: TableName, version: int | None = None) -> TableSchema:
        if table not in self._schemas:
            from cdc.schema import TypeCache, build_schema, column_extras
            from cdc.source import table_info

            conn = self._connect()
            try:
                info = table_info(conn, table)
                if not info.key_columns:
                    raise LogError(
                        f"table {table} has no key in the source database", "give it a primary key"
                    )
                columns = [(c.name, c.type_oid, c.typmod) for c in info.columns]
                self._schemas[table] = build_schema(
                    conn, columns, info.key_columns, TypeCache(), column_extras(conn, table)
                )
            finally:
                conn.close()
        return self._schemas[table]

    def column_defaults(self, table: TableName) -> dict[str, tuple[int, str]]:
        # Debezium's topics do not say when a column was added; rows written later carry its value.
        return {}

    # ---- the cut -----------------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        safe = _TOPIC_UNSAFE.sub("_", self.prefix)
        return self.pipeline.state_path / "debezium" / f"{safe}.json"

    def _load_state(self) -> ScanState:
        try:
            return ScanState.from_json(json.loads(self.state_file.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return ScanState()

    def _save_state(self, state: ScanState) -> None:
        private_dir(self.state_file.parent)
        fd, tmp = tempfile.mkstemp(dir=self.state_file.parent, prefix=".scan-")
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(state.to_json()))
        os.replace(tmp, self.state_file)

    def existing_topics(self) -> set[str]:
        topics = self.consumer.topics()
        return set(topics)

    def _partitions_check(self, topic: str) -> None:
        parts = self.consumer.partitions_for_topic(topic) or {0}
        if parts != {0}:
            raise LogError(
                f"Debezium topic {topic} has {len(parts)} partitions; the reader needs one partition per table topic "
                "(the order of a table's events across partitions is lost)",
                "recreate the topic with one partition (Debezium's default)",
            )

    def _ends(self, topics: list[str]) -> dict[str, int]:
        parts = [TopicPartition(t, 0) for t in topics]
        return {tp.topic: off for tp, off in self.consumer.end_offsets(parts).items()} if parts else {}

    def _read(self, topic: str, start: int, stop: int) -> Iterator[ConsumerRecord]:
        """Records of partition 0 with start <= offset < stop (compaction leaves gaps)."""
        if stop <= start:
            return
        tp = TopicPartition(topic, 0)
        self.consumer.assign([tp])
        self.consumer.seek(tp, start)
        while (self.consumer.position(tp) or 0) < stop:  # None only before an assignment
            batch = self.consumer.poll(timeout_ms=POLL_MS)
            if not batch:
                raise LogError(
                    f"Kafka topic {topic}: no records arrived within {POLL_MS / 1000:.0f}s while reading to offset {stop}"
                )
            for records in batch.values():
                for record in records:
                    if record.offset >= stop:
                        return
                    yield record

    def latest_cut(self) -> Cut | None:
        tables = self.followed_tables()
        existing = self.existing_topics()
        state = self._load_state()
        mode = "txn" if self.txn_topic in existing else "hwm"
        if state.mode != mode:
            state = ScanState(mode=mode)
        topics = {str(t): self.topic(t) for t in tables}
        present = [tp for tp in topics.values() if tp in existing]
        for tp in present:
            self._partitions_check(tp)
        hwm = self._ends(present + ([self.txn_topic] if mode == "txn" else []))
        if mode == "hwm":
            cut = self._hwm_cut(tables, topics, hwm)
        else:
            for name, tp in topics.items():
                scan = state.topics.get(name)
                if scan is None or scan.topic != tp or scan.next > hwm.get(tp, 0):
                    state.topics[name] = TopicScan(tp)  # new, or the topic was recreated: scan again
            if state.txn_next > hwm[self.txn_topic]:
                state = ScanState(mode=mode, topics={n: TopicScan(tp) for n, tp in topics.items()})
            self._scan(state, topics, hwm)
            self._save_state(state)
            cut = state.cut(topics)
        self._state, self._cut = state, cut
        return cut

    def _hwm_cut(self, tables: list[TableName], topics: dict[str, str], hwm: dict[str, int]) -> Cut | None:
        if not any(hwm.get(tp, 0) for tp in topics.values()):
            return None
        lsns = []
        for tp in topics.values():
            end = hwm.get(tp, 0)
            for record in self._read(tp, max(end - 1, 0), end) if end else ():
                doc = parse_envelope(record.value)
                if doc is not None:
                    lsns.append(doc["source"]["lsn"])
        ranges = {TableName.parse(n): TableRange(0, hwm.get(tp, 0) - 1) for n, tp in topics.items()}
        return Cut(1 + sum(hwm.get(tp, 0) for tp in topics.values()), min(lsns) if lsns else 0, 0, ranges)

    def _scan(self, state: ScanState, topics: dict[str, str], hwm: dict[str, int]) -> None:
        names_by_collection = {name: name for name in topics}
        while True:
            progressed = False
            # transaction topic first: every END whose events we then count
            stop = min(hwm[self.txn_topic], state.txn_next + CHUNK)
            for record in self._read(self.txn_topic, state.txn_next, stop):
                state.txn_next = record.offset + 1
                progressed = True
                try:
                    doc = unwrap(orjson.loads(record.value)) if record.value is not None else None
                    if doc is None or doc.get("status") != "END":
                        continue
                    xid, lsn = parse_txn_id(doc["id"])
                    counts = {}
                    for dc in doc.get("data_collections") or []:
                        name = names_by_collection.get(str(TableName.parse(dc["data_collection"])))
                        if name is not None and dc["event_count"]:
                            counts[name] = int(dc["event_count"])
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                    raise LogError(
                        f"malformed record in Debezium's transaction topic {self.txn_topic} partition 0 at offset "
                        f"{record.offset}: {type(exc).__name__}: {exc}",
                        "the transaction metadata topic must hold Debezium's BEGIN/END records only",
                    ) from None
                state.ends.append([str(xid), lsn, record.offset, counts])
            state.txn_next = max(state.txn_next, stop)
            for name, tp in topics.items():
                scan = state.topics[name]
                stop = min(hwm.get(tp, 0), scan.next + CHUNK)
                for record in self._read(tp, scan.next, stop):
                    progressed = True
                    state.take_record(scan, record)
                scan.next = max(scan.next, stop)
            state.confirm()
            caught_up = state.txn_next >= hwm[self.txn_topic] and all(
                state.topics[n].next >= hwm.get(tp, 0) for n, tp in topics.items()
            )
            if caught_up or not progressed:
                return

    def _current_cut(self) -> Cut | None:
        return self._cut if self._cut is not None else self.latest_cut()

    def tables(self) -> list[TableState]:
        cut = self._current_cut()
        if cut is None:
            return []
        snap = self._state.snapshot_lsn if self._state is not None else None
        return [TableState(t, i, "live", 0, snap, 0, None) for i, t in enumerate(cut.tables)]

    def table_state(self, table: TableName) -> TableState | None:
        return next((t for t in self.tables() if t.table == table), None)

    def cut_end_offset(self) -> int | None:
        """Offset in the transaction topic of the last END record inside the cut; None without the
        transaction topic (high-watermark cuts) or before the first confirmed transaction."""
        if self._state is None:
            self.latest_cut()
        state = self._state
        if state is None or state.mode != "txn" or state.cut_txn_off < 0:
            return None
        return state.cut_txn_off

    def check_retained(self, topic: str, after: int) -> None:
        """LogError when retention deleted offsets after `after` of a table topic (a follower there would miss changes)."""
        tp = TopicPartition(topic, 0)
        first = self.consumer.beginning_offsets([tp]).get(tp, 0)
        if first > after + 1:
            raise LogError(
                f"Kafka topic {topic} no longer holds offsets {after + 1}..{first - 1} (deleted by retention), "
                "so this follower would miss changes",
                "keep Debezium's topics longer than your slowest follower's lag (retention.ms), or rebuild the follower "
                "from a new Debezium snapshot",
            )

    def stream_position(self) -> tuple[int, int] | None:
        """(commit LSN, commit LSN) of the last transaction in the cut (transaction mode only)."""
        cut = self._current_cut()
        if cut is None or self._state is None or self._state.mode != "txn" or self._state.cut_txn_off < 0:
            return None
        return cut.lsn, cut.lsn

    def meta(self, key: str) -> str | None:
        return None

    @property
    def retention_ms(self) -> int | None:
        """The shortest time a table topic keeps deletes (None: forever or unknown)."""
        from kafka.admin import ConfigResource, ConfigResourceType

        if self._admin is None:
            self._admin = kc.admin(self.cfg)
        existing = self.existing_topics()
        names = [self.topic(t) for t in self.followed_tables() if self.topic(t) in existing]
        if not names:
            return None
        keys: dict[str, Any] = {"cleanup.policy": None, "retention.ms": None, "delete.retention.ms": None}
        result: Any = self._admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, n, dict(keys)) for n in names]
        )
        found = []
        for configs in (result or {}).get("topic", {}).values():

            def value(k: str, configs: dict[str, Any] = configs) -> Any:
                entry = configs.get(k)
                return entry.get("value") if isinstance(entry, dict) else entry

            policy = str(value("cleanup.policy") or "delete")
            ms = value("retention.ms") if "delete" in policy else value("delete.retention.ms")
            with contextlib.suppress(TypeError, ValueError):
                if int(ms) > 0:
                    found.append(int(ms))
        return min(found) if found else None
