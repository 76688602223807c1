"""The Kafka publisher's unchanged-TOAST filling (cdc.log.kafka.toast) against a real staging log."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from cdc.envelope import UNAVAILABLE, EnvelopeRenderer
from cdc.ground.tables import TableName
from cdc.log.base import Column, LogRecord, TableSchema
from cdc.log.kafka import toast
from cdc.log.local import LocalLog
from cdc.pgoutput import UNCHANGED
from cdc.pgoutput_encode import encode_tuple

pytestmark = pytest.mark.unit

T = TableName("public", "tz")
TYPES = {23: {"oid": 23, "name": "int4", "kind": "base"}, 25: {"oid": 25, "name": "text", "kind": "base"}}
V1 = TableSchema((Column("id", 23, -1), Column("n", 23, -1), Column("big", 25, -1)), ("id",), TYPES)
V2 = TableSchema((*V1.columns[:2], Column("big2", 25, -1)), ("id",), TYPES)  # big dropped, big2 added
U = UNCHANGED


class Staging:
    """A staging log with one table, snapshotted with rows (id, 0, big<id>) for ids 1..3."""

    def __init__(self, path: Path) -> None:
        self.log = LocalLog(path)
        self.tid = self.log.ensure_table(T)
        self.sv = self.log.schema_version(self.tid, V1, 100)
        snap = self.log.begin_snapshot(self.tid, 100, self.sv)
        for chunk, ids in enumerate(([1, 2], [3])):
            seg = self.log.segment_path(self.tid, snap, chunk)
            seg.parent.mkdir(parents=True, exist_ok=True)
            seg.write_bytes(b"".join(f"{i}\t0\tbig{i}\n".encode() for i in ids))
            self.log.add_segment(snap, chunk, seg, len(ids), seg.stat().st_size)
        self.log.finish_snapshot(snap)
        self.lsn = 200

    def event(self, op: str, key: int | None, *values: object, sv: int | None = None) -> None:
        payload = encode_tuple(v.encode() if isinstance(v, str) else v for v in values) if values else None
        self.lsn += 10
        row = (
            self.lsn,
            1,
            op,
            None if key is None else str(key).encode(),
            payload,
            None,
            None,
            sv or self.sv,
            1,
            0,
            self.lsn,
        )
        self.log.append(self.tid, [row])
        self.log.commit(self.lsn)

    def published(self, after: int = 0) -> list[LogRecord]:
        """The records one publishing run from `after` would produce, filled."""
        return list(toast.fill_unchanged(self.log, T, self.log.read(T, after, self.log.end_offset(T))))

    def updates(self, records: list[LogRecord]) -> list[tuple[int, list]]:
        return [(int(r.key or b"0"), r.values or []) for r in records if r.op == "u"]


@pytest.fixture
def staging(tmp_path: Path):
    s = Staging(tmp_path / "staging")
    yield s
    s.log.close()


def history(s: Staging) -> list[tuple[int, list]]:
    """Updates needing values from the snapshot, from the run itself, across a delete, a
    truncate and a schema change; returns what each update must carry."""
    s.event("u", 1, "1", "1", U)  # from the snapshot (second segment file holds id 3)
    s.event("u", 3, "3", "1", U)
    s.event("u", 1, "1", "2", U)  # from the update before, which was filled from the snapshot
    s.event("c", 4, "4", "0", "big4")
    s.event("u", 4, "4", "1", U)  # from the insert
    s.event("u", 4, "4", "2", "big4b")
    s.event("u", 4, "4", "3", U)  # from the newest update that has it
    s.event("d", 2, "2", None, None)
    s.event("c", 2, "2", "0", "new2")
    s.event("u", 2, "2", "1", U)  # from the re-insert, not the snapshot
    s.event("t", None)
    s.event("u", 4, "4", "4", U)  # not from before a truncate
    s.log.schema_version(s.tid, V2, s.lsn)
    s.event("c", 3, "3", "0", "big3b")
    s.event("u", 3, "3", "2", U, sv=2)  # across a schema change: stays a placeholder
    s.event("c", 1, "1", "9", "new1", sv=2)
    s.event("u", 1, "1", "10", U, sv=2)
    return [
        (1, ["1", "1", "big1"]),
        (3, ["3", "1", "big3"]),
        (1, ["1", "2", "big1"]),
        (4, ["4", "1", "big4"]),
        (4, ["4", "2", "big4b"]),
        (4, ["4", "3", "big4b"]),
        (2, ["2", "1", "new2"]),
        (4, ["4", "4", U]),
        (3, ["3", "2", U]),
        (1, ["1", "10", "new1"]),
    ]


@pytest.mark.parametrize("window", [1, 2, 3, 2000])
def test_one_run_fills_updates_from_older_events_and_the_snapshot(
    staging: Staging, monkeypatch, window: int
) -> None:
    monkeypatch.setattr(toast, "WINDOW", window)
    expected = history(staging)
    assert staging.updates(staging.published()) == expected


def test_each_event_in_its_own_run_looks_back_through_the_log(staging: Staging) -> None:
    expected = history(staging)
    got = []
    for off in range(staging.log.table_state(T).base or 0, staging.log.end_offset(T) + 1):  # type: ignore[union-attr]
        got += staging.updates(list(toast.fill_unchanged(staging.log, T, staging.log.read(T, off - 1, off))))
    assert got == expected


def test_lookups_are_batched(staging: Staging, monkeypatch) -> None:
    """Several keys resolved from the snapshot: one event scan and one pass over the segments;
    a run of updates of one key queries once."""
    for n in range(1, 4):
        for key in (1, 2, 3):
            staging.event("u", key, str(key), str(n), U)
    calls = {"events": 0, "segments": 0}
    for name, counter in (("key_events_before", "events"), ("snapshot_rows", "segments")):
        original = getattr(staging.log, name)

        def counted(*args, _original=original, _counter=counter):
            calls[_counter] += 1
            return _original(*args)

        monkeypatch.setattr(staging.log, name, counted)
    updates = staging.updates(staging.published())
    assert all(values[2] == f"big{key}" for key, values in updates) and len(updates) == 9
    assert calls == {"events": 1, "segments": 1}


def test_filled_envelope_equals_a_full_one(staging: Staging) -> None:
    staging.event("u", 2, "2", "5", U)
    renderer = EnvelopeRenderer("db", "prefix")
    [(rec, _key, encoded)] = [r for r in renderer.records(staging.published()) if r[0].op == "u"]
    value = orjson.loads(encoded)
    full = LogRecord(**{**{f: getattr(rec, f) for f in LogRecord.__slots__}, "values": ["2", "5", "big2"]})
    assert encoded == renderer.value_json(full, value["ts_ms"])
    assert value["after"] == {"id": 2, "n": 5, "big": "big2"} and UNAVAILABLE not in str(value)


def test_value_not_in_the_log_stays_a_placeholder(staging: Staging) -> None:
    """Key 7 was never inserted (the staging log lost its history): nothing to fill it from."""
    staging.event("u", 7, "7", "1", U)
    staging.event("u", 1, "1", "1", "small")
    assert staging.updates(staging.published()) == [(7, ["7", "1", U]), (1, ["1", "1", "small"])]


def test_compacted_staging_log_keeps_what_it_can(staging: Staging) -> None:
    """`cdc log compact` merges values into the newest update and keeps the history of keys it
    cannot resolve: publishing the compacted log from its base gives each key's newest row."""
    from cdc.log.compact import compact_table

    history(staging)
    compact_table(staging.log, staging.log.table_state(T), retention_s=3600)  # type: ignore[arg-type]
    newest = dict(staging.updates(staging.published()))
    assert newest == {4: ["4", "4", U], 3: ["3", "2", U], 1: ["1", "10", "new1"]}


# ---- the same range split into parts (the publisher's render workers read parts) ---------------------
def rows_of(records: list[LogRecord]) -> list[tuple]:
    return [(r.offset, r.lsn, r.seq, r.op, r.key, r.values, r.before, r.schema_version) for r in records]


def rendered(bodies) -> list[tuple]:
    """Decoded (key, value without its wall-clock ts_ms, headers) of rendered batches."""
    from kafka.record.default_records import DefaultRecordBatch

    from cdc.log.kafka.recordbatch import frame_batch

    out = []
    for body in bodies:
        for r in DefaultRecordBatch(frame_batch(body, 1, 0, 0)):
            value = orjson.loads(r.value) if r.value is not None else None
            if value is not None:
                value.pop("ts_ms")
            out.append((r.key, value, r.headers))
    return out


def tasks_for(s: Staging, events: int, segment_bytes: int):
    from cdc.log.kafka.render import RenderTask

    parts = s.log.read_parts(T, 0, s.log.end_offset(T), events=events, segment_bytes=segment_bytes)
    return parts, [RenderTask(str(s.log.path), str(T), p, "db", "prefix", 300) for p in parts]


@pytest.mark.parametrize(("events", "segment_bytes"), [(1, 1), (2, 5), (3, 9), (10**6, 1 << 20)])
def test_parts_read_in_order_are_the_whole_range(staging: Staging, events: int, segment_bytes: int) -> None:
    history(staging)
    parts, _ = tasks_for(staging, events, segment_bytes)
    whole = list(staging.log.read(T, 0, staging.log.end_offset(T)))
    assert rows_of([r for p in parts for r in staging.log.read_part(T, p)]) == rows_of(whole)
    assert len(parts) > 1 and sum(r.op == "r" for r in whole) == 3


def test_parts_render_what_one_range_renders_in_a_pool_too(staging: Staging) -> None:
    """Unchanged TOAST values filled per part (each part looks back through the log) and
    batches rendered by worker processes: the same records, in the same order."""
    from cdc.log.kafka.render import RenderPool, render_bodies

    history(staging)
    single = rendered(b for t in tasks_for(staging, 10**6, 1 << 20)[1] for b in render_bodies(t, staging.log))
    _, small = tasks_for(staging, 1, 5)
    inline = rendered(b for t in small for b in render_bodies(t, staging.log))
    pool = RenderPool(2)
    try:
        parallel = rendered(pool.bodies(small))
    finally:
        pool.close()
    assert single == inline == parallel
    assert len(single) == 3 + 16 + 1  # snapshot rows, events, a tombstone after the delete
    started_ms = staging.log.db.execute("SELECT started_ms FROM snapshots").fetchone()[0]
    ts = b"%d" % (started_ms * 1000)  # snapshot rows: the snapshot's time (as source.ts_ms)
    assert [h for _k, _v, h in single[:1]] == [
        [("cdc.lsn", b"100"), ("cdc.seq", b"0"), ("cdc.ts", ts), ("cdc.sv", b"1")]
    ]
