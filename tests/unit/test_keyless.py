"""Keyless (insert-only) tables without services: position keys, snapshot positions, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cdc.ground.tables import TableName
from cdc.keyless import keyless_problems
from cdc.keys import position_key, snapshot_seq
from cdc.log.local import iter_segment, iter_segment_positions
from cdc.source import CheckReport, ColumnInfo, TableInfo, insert_publication
from sinks.registry import load_pipeline

pytestmark = pytest.mark.unit


def _table(name: str, key: tuple[str, ...], ident: str = "d") -> TableInfo:
    cols = (ColumnInfo("id", 1, 23, -1, True), ColumnInfo("v", 2, 25, -1, False))
    return TableInfo(
        TableName.parse(name), 1, "r", ident, cols, key, "primary key" if key else "", True, True
    )


def test_insert_only_is_no_key_and_default_or_no_identity() -> None:
    assert _table("public.a", ()).insert_only and _table("public.a", (), "n").insert_only
    assert not _table("public.a", (), "f").insert_only  # FULL without a key: a multiset, not insert-only
    assert not _table("public.a", ("id",)).insert_only


def test_multiset_is_no_key_and_full_identity() -> None:
    assert _table("public.a", (), "f").multiset
    assert not _table("public.a", ()).multiset and not _table("public.a", ("id",), "f").multiset


def test_position_keys_are_unique_and_snapshot_ones_never_a_streamed_seq() -> None:
    assert position_key(123, 4) == b"123\t4"
    seqs = {snapshot_seq(off, pos) for off in (7, 8, 7 + (1 << 27)) for pos in (0, 1, 99, (1 << 36) - 1)}
    assert (
        len(seqs) == 12 - 4
    )  # the segment offset is taken modulo 2**27 (segments of one snapshot are close)
    assert all(s < 0 for s in seqs) and all(s >= -(1 << 63) for s in seqs)


def test_segment_positions_match_slices(tmp_path: Path) -> None:
    path = tmp_path / "seg"
    lines = [b"1\ta\n", b"2\t\\N\n", b"3\tlong value\n"]
    path.write_bytes(b"".join(lines))
    whole = list(iter_segment_positions(path))
    assert [f[-1] for f in whole] == [0, 4, 9] and [f[:-1] for f in whole] == list(iter_segment(path))
    # slices of one file (Spark partitions) give each line once, with the same position
    parts = list(iter_segment_positions(path, 0, 5)) + list(iter_segment_positions(path, 5, None))
    assert parts == whole


def test_insert_publication_name_fits() -> None:
    assert insert_publication("cdc_shop") == "cdc_shop_inserts"
    assert len(insert_publication("p" * 63)) == 63


def test_keyless_tables_refused_where_they_cannot_be_held(tmp_path: Path) -> None:
    doc = {
        "name": "t",
        "source": {
            "postgres": {"dsn": "postgresql://x@127.0.0.1/db", "tables": ["public.audit", "public.k"]}
        },
        "log": {"kafka": {"bootstrap_servers": "127.0.0.1:9092"}},
        "sinks": [
            {"name": "lake", "delta": {"path": "lake"}},
            {"name": "cache", "redis": {"url": "redis://127.0.0.1:6379/0", "tables": ["public.k"]}},
            {"name": "docs", "search": {"engine": "tantivy", "path": "idx", "tables": ["public.*"]}},
        ],
    }
    file = tmp_path / "t.yml"
    file.write_text(yaml.safe_dump(doc))
    report = CheckReport(tables=[_table("public.audit", ()), _table("public.k", ("id",))])
    # our Kafka log keys its records by position; the cache does not follow it; search keys documents by position
    assert keyless_problems(load_pipeline(file), report) == []
    doc["log"]["kafka"]["format"] = "debezium"  # Debezium's topics: null keys
    file.write_text(yaml.safe_dump(doc))
    problems = [p.what for p in keyless_problems(load_pipeline(file), report)]
    assert len(problems) == 1, problems
    assert "public.audit has no primary key, which the Debezium topics cannot follow" in problems[0]
    doc.pop("log")
    doc["sinks"][0]["delta"]["mode"] = "scd2"
    file.write_text(yaml.safe_dump(doc))
    problems = [p.what for p in keyless_problems(load_pipeline(file), report)]
    assert len(problems) == 1 and problems[0].startswith(
        "sink lake (delta, mode scd2) cannot follow public.audit"
    ), problems


def test_iceberg_follows_insert_only_and_multiset_tables_and_refuses_scd2(tmp_path: Path) -> None:
    doc = {
        "name": "t",
        "source": {
            "postgres": {
                "dsn": "postgresql://x@127.0.0.1/db",
                "tables": ["public.audit", "public.full", "public.k"],
            }
        },
        "sinks": [{"name": "ice", "iceberg": {"warehouse": "wh"}}],
    }
    file = tmp_path / "t.yml"
    file.write_text(yaml.safe_dump(doc))
    report = CheckReport(
        tables=[_table("public.audit", ()), _table("public.full", (), "f"), _table("public.k", ("id",))]
    )
    # the insert-only table is appended (each row identified by its position), the multiset MERGEd
    # by position (a delete removes one row of its content: sinks/multiset.py)
    assert keyless_problems(load_pipeline(file), report) == []
    doc["sinks"][0]["iceberg"]["mode"] = "scd2"
    file.write_text(yaml.safe_dump(doc))
    problems = keyless_problems(load_pipeline(file), report)
    assert [p.what.split(":")[0] for p in problems] == [
        "sink ice (iceberg, mode scd2) cannot follow public.audit",
        "sink ice (iceberg, mode scd2) cannot follow public.full",
    ]
    assert problems[0].fix.startswith("follow public.audit with an iceberg sink in mode scd1"), problems


def test_multiset_tables_refused_where_one_of_two_identical_rows_cannot_be_removed(tmp_path: Path) -> None:
    doc = {
        "name": "t",
        "source": {"postgres": {"dsn": "postgresql://x@127.0.0.1/db", "tables": ["public.full"]}},
        "sinks": [
            {"name": "lake", "delta": {"path": "lake"}},
            {"name": "docs", "search": {"engine": "tantivy", "path": "idx", "tables": ["public.*"]}},
        ],
    }
    file = tmp_path / "t.yml"
    file.write_text(yaml.safe_dump(doc))
    report = CheckReport(tables=[_table("public.full", (), "f")])
    problems = [p.what for p in keyless_problems(load_pipeline(file), report)]
    assert len(problems) == 1 and problems[0].startswith(
        "sink docs (search) cannot follow public.full: it has no primary key and REPLICA IDENTITY FULL"
    ), problems
    doc["sinks"] = [{"name": "lake", "delta": {"path": "lake", "mode": "scd2"}}]
    file.write_text(yaml.safe_dump(doc))
    problems = [p.what for p in keyless_problems(load_pipeline(file), report)]
    assert len(problems) == 1 and "followed as a multiset of rows identified by content" in problems[0], (
        problems
    )


def test_compaction_keeps_every_record_of_a_keyless_table(tmp_path: Path) -> None:
    """A multiset table's delete removes one row of its content, which may be any earlier record:
    `cdc log compact` purges no delete of a keyless table (even past the tombstone retention); only
    what the newest truncate ends goes."""
    from cdc.log.base import Column, TableSchema
    from cdc.log.compact import compact_table
    from cdc.log.local import LocalLog
    from cdc.pgoutput_encode import encode_tuple

    table = TableName("public", "tally")
    types = {25: {"oid": 25, "name": "text", "kind": "base"}}
    log = LocalLog(tmp_path / "log")
    tid = log.ensure_table(table)
    sv = log.schema_version(tid, TableSchema((Column("k", 25, -1),), (), types), 100)
    ops = ["c", "c", "d", "c", "d"]  # two 'a' rows, one deleted; then 'a' again, deleted
    for i, op in enumerate(ops, 1):
        lsn = 100 + i
        payload = encode_tuple([b"a"])
        row = (
            lsn,
            1,
            op,
            position_key(lsn, 1),
            None if op == "d" else payload,
            payload if op == "d" else None,
        )
        log.append(tid, [(*row, "O" if op == "d" else None, sv, 1, 1, lsn)])  # ts 1 µs: far past retention
        log.commit(lsn)
    state = log.table_state(table)
    assert state is not None
    stats = compact_table(log, state, retention_s=0)
    assert (stats.events_before, stats.events_after, stats.purged_deletes) == (5, 5, 0)
    log.append(tid, [(110, 1, "t", None, None, None, None, sv, 1, 1, 110)])
    log.commit(110)
    state = log.table_state(table)
    assert state is not None
    assert compact_table(log, state, retention_s=0).events_after == 1  # the truncate ends them
    log.close()
