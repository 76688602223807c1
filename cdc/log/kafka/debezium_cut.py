"""The cut of existing Debezium topics (cdc/log/kafka/debezium.py), confirmed transaction by
transaction: the incremental scan's state, what each record does to it, and the cut it allows.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from kafka.consumer.fetcher import ConsumerRecord

from cdc.ground.tables import TableName
from cdc.log.base import Cut, TableRange

SNAPSHOT_MARKERS = {"true", "first", "first_in_data_collection", "last_in_data_collection", "last"}
MORE_SNAPSHOT_ROWS = {
    "true",
    "first_in_data_collection",
}  # a topic whose newest snapshot row says this has more coming
STATE_VERSION = 1


def parse_txn_id(value: str) -> tuple[int, int | None]:
    """`"<xid>:<lsn>"` (Debezium 2+) or `"<xid>"` -> (xid, lsn or None)."""
    xid, _, lsn = str(value).partition(":")
    return int(xid), (int(lsn) if lsn else None)


def unwrap(doc: Any) -> Any:
    """The payload of a JSON-converter record written with schemas enabled."""
    if isinstance(doc, dict) and "payload" in doc and "schema" in doc and len(doc) == 2:
        return doc["payload"]
    return doc


def parse_envelope(value: bytes | None) -> dict[str, Any] | None:
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

    def attach(self, off: int, bad: int) -> None:
        """A record with no transaction of its own goes with the one read before it."""
        if self.owner == "":
            self.snap_end = max(self.snap_end, off)
        elif self.owner is not None and self.owner in self.pending:
            entry = self.pending[self.owner]
            entry[1] = max(entry[1], off)
            entry[2] += bad


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

    def take_record(self, scan: TopicScan, record: ConsumerRecord) -> None:
        """One record of a table topic: a snapshot row, an event of a transaction, or one riding
        with its neighbours (a tombstone, a malformed record, an event without a transaction)."""
        off = record.offset
        if record.value is None:  # tombstone: belongs with the delete before it
            scan.attach(off, bad=0)
            return
        doc = parse_envelope(record.value)
        if doc is None:  # malformed: counted with its neighbours so the cut does not stall on it
            scan.attach(off, bad=1)
            scan.loose_bad += 1
            return
        source = doc["source"]
        marker = str(source.get("snapshot")).lower() if source.get("snapshot") is not None else "false"
        if doc["op"] == "r" and marker in SNAPSHOT_MARKERS:
            scan.snap_end, scan.snap_marker, scan.snap_lsn = off, marker, source["lsn"]
            scan.owner = ""
            if marker == "last":
                self.snapshot_last = True
            self.snapshot_lsn = source["lsn"]
            return
        txn = doc.get("transaction")
        xid = source.get("txId")
        if not isinstance(txn, dict) or xid is None:
            scan.attach(off, bad=0)  # no transaction to count it in: it rides with its neighbours
            return
        key = str(xid)
        entry = scan.pending.get(key)
        if entry is None:
            entry = scan.pending[key] = [0, off, scan.loose_bad]
        entry[0] += 1
        entry[1] = off
        scan.owner = key
        scan.loose_bad = 0

    def snapshot_complete(self) -> bool:
        seen = [s for s in self.topics.values() if s.snap_marker is not None]
        if not seen:
            return True  # no snapshot (snapshot.mode no_data / never), or every table empty
        return self.snapshot_last and not any(s.snap_marker in MORE_SNAPSHOT_ROWS for s in seen)

    def confirm(self) -> None:
        """Move the cut over every transaction, in END order, whose events are all visible."""
        if not self.snapshot_complete():
            return
        if self.cut_txn_off == -2:
            self.cut_txn_off = -1
            self.cut_lsn = self.snapshot_lsn
        for scan in self.topics.values():
            scan.end = max(scan.end, scan.snap_end)
        while self.ends:
            xid, lsn, offset, counts = self.ends[0]
            entries = {}
            for name, count in counts.items():
                entry = self.topics[name].pending.get(xid)
                if entry is None or entry[0] + entry[2] < count:
                    return  # not all its events are visible yet
                entries[name] = entry
            for name, entry in entries.items():
                scan = self.topics[name]
                scan.end = max(scan.end, entry[1])
                del scan.pending[xid]
            self.ends.pop(0)
            self.cut_txn_off = offset
            if lsn is not None:
                self.cut_lsn = lsn - 1
        for scan in self.topics.values():  # transactions whose END expired before we saw it
            for xid in [x for x, e in scan.pending.items() if e[1] <= scan.end]:
                del scan.pending[xid]

    def cut(self, topics: dict[str, str]) -> Cut | None:
        if self.cut_txn_off == -2:
            return None
        ranges = {TableName.parse(n): TableRange(0, self.topics[n].end) for n in topics}
        return Cut(self.cut_txn_off + 2, self.cut_lsn or 0, 0, ranges)
