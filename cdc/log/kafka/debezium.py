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

The cut (`latest_cut`):

* With the transaction metadata topic: the per-table offsets up to which every transaction is
  complete — its END record seen and, for every followed table the END lists, that many events
  of its xid in the table's topic (one partition each, in commit order, so the offset of the
  last one bounds everything before it). Transactions are confirmed in END order; the first
  incomplete one stops the cut. The snapshot is included only once its row marked `last` is
  visible (and no topic's latest snapshot row says more rows follow). The scan is incremental:
  its state is cached in `<state_dir>/debezium/<prefix>.json` (a cache: deleting it only costs
  a re-scan). Cut id = offset of the last confirmed END + 2 (1 for a snapshot alone).
* Without it: every table topic's high watermark. Weaker: a transaction touching two tables may
  be visible in one topic and not yet in the other, and a running snapshot is visible in part;
  each table on its own still follows commit order, and later batches catch up.

Tombstones are skipped: Debezium writes a delete event before each of them, which carries the
position. Malformed records (value not JSON, no `op`, no position, a key that is not a JSON
object) are found in Spark (the reader) before anything is merged: the apply stops naming topic, partition
and offset, or, with `dead_letter: <path>`, parks them in a Delta table there and goes on.

Column types come from the source database's catalog (the JSON carries no PostgreSQL types
when schemas are disabled, and Connect types when enabled). Debezium's values are those of our
envelope (README "Type mapping") with the connector settings of pipelines/devservices/debezium.py,
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
from dataclasses import dataclass, field
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

POLL_MS = 10_000
CHUNK = 200_000  # records read per topic per scan round (bounds the scan's memory)
SNAPSHOT_MARKERS = {"true", "first", "first_in_data_collection", "last_in_data_collection", "last"}
MORE_SNAPSHOT_ROWS = {
    "true",
    "first_in_data_collection",
}  # a topic whose newest snapshot row says this has more coming
STATE_VERSION = 1

_TOPIC_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

if TYPE_CHECKING:
    from psycopg2.extensions import connection

    from cdc.ground.config import Pipeline


def debezium_topic(prefix: str, table: TableName) -> str:
    """Debezium's default topic name (characters Kafka does not allow become `_`)."""
    return f"{prefix}.{_TOPIC_UNSAFE.sub('_', table.schema)}.{_TOPIC_UNSAFE.sub('_', table.name)}"


def parse_txn_id(value: str) -> tuple[int, int | None]:
    """`"<xid>:<lsn>"` (Debezium 2+) or `"<xid>"` -> (xid, lsn or None)."""
    xid, _, lsn = str(value).partition(":")
    return int(xid), (int(lsn) if lsn else None)


def unwrap(doc: Any) -> Any:
    """The payload of a JSON-converter record written with schemas enabled."""
    if isinstance(doc, dict) and "payload" in doc and "schema" in doc and len(doc) == 2:
        return doc["payload"]
    return doc


# ---- the incremental scan behind the cut ---------------------------------------------------------
@dataclass
class TopicScan:
    topic: str
    next: int = 0  # next offset to read
    end: int = -1  # last offset in the confirmed cut
    pending: dict[str, list[int]] = field(
        default_factory=dict
    )  # xid -> [events, last offset, malformed nearby]
    owner: str | None = None  # xid of the last stream record read ("" = snapshot), for tombstones
    loose_bad: int = 0  # malformed records not yet attached to a transaction
    snap_end: int = -1
    snap_marker: str | None = None
    snap_lsn: int | None = None


@dataclass
class ScanState:
    mode: str = "txn"  # "txn" (transaction topic) | "hwm" (high watermarks)
    txn_next: int = 0
    ends: list[list[Any]] = field(
        default_factory=list
    )  # unconfirmed ENDs: [xid, lsn, offset, {table: events}]
    topics: dict[str, TopicScan] = field(default_factory=dict)
    snapshot_last: bool = False
    snapshot_lsn: int | None = None
    cut_txn_off: int = -2  # offset of the last confirmed END (-1: snapshot only, -2: no cut)
    cut_lsn: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "mode": self.mode,
            "txn_next": self.txn_next,
            "ends": self.ends,
            "topics": {k: v.__dict__ for k, v in self.topics.items()},
            "snapshot_last": self.snapshot_last,
            "snapshot_lsn": self.snapshot_lsn,
            "cut_txn_off": self.cut_txn_off,
            "cut_lsn": self.cut_lsn,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScanState:
        if data.get("version") != STATE_VERSION:
            return cls()
        topics = {k: TopicScan(**v) for k, v in data["topics"].items()}
        return cls(
            data["mode"],
            data["txn_next"],
            data["ends"],
            topics,
            data["snapshot_last"],
            data["snapshot_lsn"],
            data["cut_txn_off"],
            data["cut_lsn"],
        )


class DebeziumLogView:
    value_kind = "envelope"
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
        cfg = pipeline.log_config.kafka
        assert cfg is not None
        self.cfg = cfg
        self.pipeline = pipeline
        self.prefix = cfg.topic_prefix or pipeline.name
        self.txn_topic = cfg.transaction_topic or f"{self.prefix}.transaction"
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
            cut = self._txn_cut(state, topics)
        self._state, self._cut = state, cut
        return cut

    def _hwm_cut(self, tables: list[TableName], topics: dict[str, str], hwm: dict[str, int]) -> Cut | None:
        if not any(hwm.get(tp, 0) for tp in topics.values()):
            return None
        lsns = []
        for tp in topics.values():
            end = hwm.get(tp, 0)
            for record in self._read(tp, max(end - 1, 0), end) if end else ():
                doc = self._parse(record.value)
                if doc is not None:
                    lsns.append(doc["source"]["lsn"])
        ranges = {TableName.parse(n): TableRange(0, hwm.get(tp, 0) - 1) for n, tp in topics.items()}
        return Cut(1 + sum(hwm.get(tp, 0) for tp in topics.values()), min(lsns) if lsns else 0, 0, ranges)

    @staticmethod
    def _parse(value: bytes | None) -> dict[str, Any] | None:
        """The envelope of a record, or None when it is not one (tombstones excluded by the caller)."""
        if value is None:
            return None
        try:
            doc = unwrap(orjson.loads(value))
        except (orjson.JSONDecodeError, TypeError):
            return None
        if not isinstance(doc, dict) or doc.get("op") not in ("c", "u", "d", "r", "t"):
            return None
        source = doc.get("source")
        if not isinstance(source, dict) or not isinstance(source.get("lsn"), int):
            return None
        return doc

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
                    self._scan_record(state, scan, record)
                scan.next = max(scan.next, stop)
            self._confirm(state)
            caught_up = state.txn_next >= hwm[self.txn_topic] and all(
                state.topics[n].next >= hwm.get(tp, 0) for n, tp in topics.items()
            )
            if caught_up or not progressed:
                return

    def _scan_record(self, state: ScanState, scan: TopicScan, record: ConsumerRecord) -> None:
        off = record.offset
        if record.value is None:  # tombstone: belongs with the delete before it
            self._attach(scan, off, bad=0)
            return
        doc = self._parse(record.value)
        if doc is None:  # malformed: counted with its neighbours so the cut does not stall on it
            self._attach(scan, off, bad=1)
            scan.loose_bad += 1
            return
        source = doc["source"]
        marker = str(source.get("snapshot")).lower() if source.get("snapshot") is not None else "false"
        if doc["op"] == "r" and marker in SNAPSHOT_MARKERS:
            scan.snap_end, scan.snap_marker, scan.snap_lsn = off, marker, source["lsn"]
            scan.owner = ""
            if marker == "last":
                state.snapshot_last = True
            state.snapshot_lsn = source["lsn"]
            return
        txn = doc.get("transaction")
        xid = source.get("txId")
        if not isinstance(txn, dict) or xid is None:
            self._attach(scan, off, bad=0)  # no transaction to count it in: it rides with its neighbours
            return
        key = str(xid)
        entry = scan.pending.get(key)
        if entry is None:
            entry = scan.pending[key] = [0, off, scan.loose_bad]
        entry[0] += 1
        entry[1] = off
        scan.owner = key
        scan.loose_bad = 0

    @staticmethod
    def _attach(scan: TopicScan, off: int, bad: int) -> None:
        if scan.owner == "":
            scan.snap_end = max(scan.snap_end, off)
        elif scan.owner is not None and scan.owner in scan.pending:
            entry = scan.pending[scan.owner]
            entry[1] = max(entry[1], off)
            entry[2] += bad

    def _snapshot_complete(self, state: ScanState) -> bool:
        seen = [s for s in state.topics.values() if s.snap_marker is not None]
        if not seen:
            return True  # no snapshot (snapshot.mode no_data / never), or every table empty
        return state.snapshot_last and not any(s.snap_marker in MORE_SNAPSHOT_ROWS for s in seen)

    def _confirm(self, state: ScanState) -> None:
        if not self._snapshot_complete(state):
            return
        if state.cut_txn_off == -2:
            state.cut_txn_off = -1
            state.cut_lsn = state.snapshot_lsn
        for scan in state.topics.values():
            scan.end = max(scan.end, scan.snap_end)
        while state.ends:
            xid, lsn, offset, counts = state.ends[0]
            entries = {}
            for name, count in counts.items():
                entry = state.topics[name].pending.get(xid)
                if entry is None or entry[0] + entry[2] < count:
                    return  # not all its events are visible yet
                entries[name] = entry
            for name, entry in entries.items():
                scan = state.topics[name]
                scan.end = max(scan.end, entry[1])
                del scan.pending[xid]
            state.ends.pop(0)
            state.cut_txn_off = offset
            if lsn is not None:
                state.cut_lsn = lsn - 1
        for scan in state.topics.values():  # transactions whose END expired before we saw it
            for xid in [x for x, e in scan.pending.items() if e[1] <= scan.end]:
                del scan.pending[xid]

    def _txn_cut(self, state: ScanState, topics: dict[str, str]) -> Cut | None:
        if state.cut_txn_off == -2:
            return None
        ranges = {TableName.parse(n): TableRange(0, state.topics[n].end) for n in topics}
        return Cut(state.cut_txn_off + 2, state.cut_lsn or 0, 0, ranges)

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
