"""The cut of Debezium topics (cdc/log/kafka/debezium_cut.py) without a broker: records as the
connector writes them, fed to the scan state the way DebeziumLogView reads them."""

from __future__ import annotations

import orjson
import pytest
from kafka.consumer.fetcher import ConsumerRecord

from cdc.ground.tables import TableName
from cdc.log.kafka.debezium_cut import ScanState, TopicScan, parse_txn_id

pytestmark = pytest.mark.unit

ORDERS, ITEMS = "public.orders", "public.items"
TOPICS = {ORDERS: "dbz.public.orders", ITEMS: "dbz.public.items"}


def record(offset: int, value: dict | None) -> ConsumerRecord:
    body = None if value is None else orjson.dumps(value)
    return ConsumerRecord("t", 0, None, offset, 0, 0, None, body, [], None, 0, 0, 0)


def snapshot_row(lsn: int, marker: str) -> dict:
    return {"op": "r", "after": {"id": 1}, "source": {"lsn": lsn, "snapshot": marker, "txId": 700}}


def event(xid: int, lsn: int, op: str = "c") -> dict:
    return {
        "op": op,
        "after": {"id": 2},
        "source": {"lsn": lsn, "txId": xid},
        "transaction": {"id": f"{xid}:{lsn}"},
    }


def fresh() -> ScanState:
    return ScanState(topics={name: TopicScan(topic) for name, topic in TOPICS.items()})


def test_a_transaction_joins_the_cut_only_once_every_table_shows_all_its_events() -> None:
    state = fresh()
    orders, items = state.topics[ORDERS], state.topics[ITEMS]
    state.take_record(orders, record(0, snapshot_row(100, "last")))
    state.confirm()
    cut = state.cut(TOPICS)
    assert cut is not None and cut.id == 1 and cut.lsn == 100  # the snapshot alone
    # END of xid 800 (transaction topic offset 5): two events in orders, one in items
    state.ends.append(["800", 300, 5, {ORDERS: 2, ITEMS: 1}])
    state.take_record(orders, record(1, event(800, 200)))
    state.take_record(orders, record(2, event(800, 210, "d")))
    state.take_record(orders, record(3, None))  # the delete's tombstone rides with it
    state.confirm()
    assert state.cut(TOPICS) == cut  # items has not shown its event yet
    state.take_record(items, record(0, event(800, 220)))
    state.confirm()
    cut = state.cut(TOPICS)
    assert cut is not None
    assert (cut.id, cut.lsn) == (5 + 2, 300 - 1)  # END offset + 2, END's LSN - 1
    assert cut.tables[TableName.parse(ORDERS)].end == 3 and cut.tables[TableName.parse(ITEMS)].end == 0
    assert not state.ends and not orders.pending and not items.pending


def test_no_cut_while_the_snapshot_says_more_rows_follow() -> None:
    state = fresh()
    state.take_record(state.topics[ORDERS], record(0, snapshot_row(100, "first")))
    state.take_record(state.topics[ITEMS], record(0, snapshot_row(100, "last")))
    state.take_record(state.topics[ORDERS], record(1, snapshot_row(100, "true")))
    state.confirm()
    assert state.cut(TOPICS) is None  # orders' newest snapshot row says more are coming
    state.take_record(state.topics[ORDERS], record(2, snapshot_row(100, "last_in_data_collection")))
    state.confirm()
    cut = state.cut(TOPICS)
    assert cut is not None and cut.tables[TableName.parse(ORDERS)].end == 2


def test_a_malformed_record_counts_with_its_transaction_so_the_cut_does_not_stall() -> None:
    state = fresh()
    orders = state.topics[ORDERS]
    state.ends.append(["900", 500, 0, {ORDERS: 2}])
    state.take_record(orders, record(0, event(900, 400)))
    state.take_record(orders, ConsumerRecord("t", 0, None, 1, 0, 0, None, b"not json", [], None, 0, 0, 0))
    state.confirm()
    cut = state.cut(TOPICS)
    assert cut is not None and cut.tables[TableName.parse(ORDERS)].end == 1


def test_the_state_survives_its_json_file_and_an_older_version_starts_over() -> None:
    state = fresh()
    state.ends.append(["800", 300, 5, {ORDERS: 1}])
    state.take_record(state.topics[ORDERS], record(0, event(800, 200)))
    again = ScanState.from_json(orjson.loads(orjson.dumps(state.to_json())))
    assert again == state
    assert ScanState.from_json({"version": 0}) == ScanState()


def test_transaction_ids_with_and_without_a_position() -> None:
    assert parse_txn_id("800:23577840") == (800, 23577840)
    assert parse_txn_id("800") == (800, None)
