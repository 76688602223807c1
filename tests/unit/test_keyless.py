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
    assert not _table("public.a", (), "f").insert_only  # FULL without a key: refused, not insert-only
    assert not _table("public.a", ("id",)).insert_only


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
    problems = [p.what for p in keyless_problems(load_pipeline(file), report)]
    assert len(problems) == 1, problems  # the cache does not follow it; search keys documents by position
    assert "public.audit has no primary key, which the Kafka log cannot hold yet" in problems[0]
    doc.pop("log")
    doc["sinks"][0]["delta"]["mode"] = "scd2"
    file.write_text(yaml.safe_dump(doc))
    problems = [p.what for p in keyless_problems(load_pipeline(file), report)]
    assert len(problems) == 1 and problems[0].startswith(
        "sink lake (delta, mode scd2) cannot follow public.audit"
    ), problems
    doc["sinks"] = [{"name": "ice", "iceberg": {"warehouse": "wh"}}]
    file.write_text(yaml.safe_dump(doc))
    problems = [p.what for p in keyless_problems(load_pipeline(file), report)]
    assert len(problems) == 1 and problems[0].startswith(
        "sink ice (iceberg) cannot follow public.audit yet"
    ), problems
