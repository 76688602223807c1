"""The Iceberg follower's position (sinks/iceberg/position.py): the newest snapshot of its app id
with a cut among the current snapshot's ancestors, so a table rolled back behind the tool holds
the older cut; and `cdc status`'s reader of it without Spark (sinks/iceberg/catalogread.py) on a
real SQLite catalog written by pyiceberg: a table rolled back, dropped, its catalog file gone, a
REST catalog not read. The Spark side is tested in tests/integration/test_iceberg_follower.py."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cdc.ground.errors import SinkError
from cdc.ground.tables import TableName
from sinks.iceberg.position import APP_ID, CUT, follower_snapshot, walk_to_follower
from sinks.marker import Marker, lost_reason, why_lost
from sinks.registry import make_sink, parse_pipeline

pytestmark = pytest.mark.unit

ME = "cdc:p:ice:log1"


def ours(cut: int, app_id: str = ME) -> dict[str, str]:
    return {APP_ID: app_id, CUT: str(cut)}


class Metadata:
    """Snapshots as (snapshot id, parent id, summary), in commit order; which ones were read."""

    def __init__(self, *snapshots: tuple[int, int | None, Mapping[str, str]]):
        self.snapshots = list(snapshots)
        self.looked_up: list[int] = []
        self.listed = False

    def lookup(self, snapshot_id: int) -> tuple[int | None, Mapping[str, str]] | None:
        self.looked_up.append(snapshot_id)
        return next(((p, s) for i, p, s in self.snapshots if i == snapshot_id), None)

    def kept_newest_first(self) -> Iterator[tuple[int, Mapping[str, str]]]:
        self.listed = True
        for i, _p, s in reversed(self.snapshots):
            yield i, s

    def position(self, current: int | None, app_id: str = ME) -> int | None:
        found = follower_snapshot(current, self.lookup, self.kept_newest_first, app_id)
        return None if found is None else found[0]


def test_the_current_snapshot_of_the_follower_is_read_alone() -> None:
    meta = Metadata((1, None, ours(1)), (2, 1, ours(2)), (3, 2, ours(3)))
    assert meta.position(3) == 3 and meta.looked_up == [3] and not meta.listed


def test_commits_of_others_and_without_a_cut_are_walked_past() -> None:
    meta = Metadata(
        (1, None, ours(1)),
        (2, 1, ours(2)),
        (3, 2, {"operation": "replace"}),  # `cdc maintain`'s compaction
        (4, 3, ours(9, "cdc:p:ice:oldlog")),  # another log's follower
        (5, 4, {APP_ID: ME}),  # no cut
    )
    assert meta.position(5) == 2 and meta.looked_up == [5, 4, 3, 2] and not meta.listed


def test_a_rollback_leaves_the_newer_cuts_in_the_metadata_but_not_in_the_position() -> None:
    meta = Metadata((1, None, ours(1)), (2, 1, ours(2)), (3, 2, ours(3)), (4, 3, {"operation": "replace"}))
    assert meta.position(4) == 3
    assert meta.position(2) == 2  # rolled back to cut 2: snapshots 3 and 4 are kept, not current
    assert meta.position(1) == 1
    later = Metadata(*meta.snapshots, (5, 1, ours(4)))  # rolled back to 1, then cut 4 committed
    assert later.position(5) == 5
    assert later.position(1) == 1 and not later.listed


def test_rolled_back_before_the_first_cut_holds_none() -> None:
    meta = Metadata((1, None, {"operation": "append"}), (2, 1, ours(1)), (3, 2, ours(2)))
    assert meta.position(1) is None and not meta.listed
    assert meta.position(None) is None and meta.looked_up == [1]


def test_a_chain_cut_by_expired_snapshots_falls_back_to_the_newest_kept() -> None:
    # snapshots 2 and 4 expired: the walk from 5 stops at 4; the newest kept snapshot of the
    # follower (commit order) is the answer, as before ancestry was checked
    meta = Metadata((1, None, ours(1)), (3, 2, ours(3)), (5, 4, {"operation": "replace"}))
    assert meta.position(5) == 3 and meta.looked_up == [5, 4] and meta.listed
    assert Metadata((5, 4, {"operation": "replace"})).position(5) is None


def test_a_loop_in_broken_metadata_ends_the_walk() -> None:
    meta = Metadata((1, 2, {"operation": "replace"}), (2, 1, {"operation": "replace"}), (0, None, ours(7)))
    assert meta.position(1) == 0 and meta.listed


def test_the_walk_names_every_snapshot_maintain_must_keep() -> None:
    """`cdc maintain` keeps the walk (maintain.py `protected`): after a rollback to cut 3 and a
    compaction on top (6), expiring 3 (the current snapshot's parent, the position) cuts the chain: the newest
    kept snapshot of the follower (cut 5, rolled back) would be taken for its position."""
    meta = Metadata((1, None, ours(1)), (3, 1, ours(3)), (5, 3, ours(5)), (6, 3, {"operation": "replace"}))
    walked = walk_to_follower(6, meta.lookup, ME)
    assert (walked.ids, walked.summary, walked.chain_cut) == ([6, 3], ours(3), False)
    cut = Metadata((5, 3, ours(5)), (6, 3, {"operation": "replace"}))  # 3 expired: what keeping prevents
    assert walk_to_follower(6, cut.lookup, ME).chain_cut and cut.position(6) == 5
    assert walk_to_follower(6, meta.lookup, "cdc:other").ids == [6, 3, 1]  # to the root: none
    assert not walk_to_follower(6, meta.lookup, "cdc:other").chain_cut


# ---- the reader without Spark, on a catalog pyiceberg writes -------------------------------------
def _pipeline(tmp_path: Path, catalog: dict | None = None) -> Any:
    iceberg: dict[str, Any] = {"warehouse": "lake"} | ({"catalog": catalog} if catalog else {})
    return parse_pipeline(
        {
            "name": "p",
            "source": {"postgres": {"dsn": "dbname=x", "tables": ["public.t"]}},
            "sinks": [{"name": "ice", "iceberg": iceberg}],
        },
        base_dir=tmp_path,
    )


def _status_sink(pipeline: Any) -> Any:
    sink = make_sink(pipeline.sinks[0], pipeline, None)  # as `cdc status` makes it: no session
    sink.log_id = "log1"
    assert sink.reads_without_spark and sink.app_id == ME
    return sink


def test_status_reads_the_table_marker_and_position_with_pyiceberg(tmp_path: Path) -> None:
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    pipeline = _pipeline(tmp_path)
    lake = tmp_path / "lake"
    sink = _status_sink(pipeline)
    table = TableName("public", "t")
    assert not sink.has_table(table) and not (lake / "catalog.db").exists()  # not made by the check
    lake.mkdir()
    catalog = SqlCatalog("ice", uri=f"sqlite:///{lake / 'catalog.db'}", warehouse=f"file://{lake}")
    catalog.create_namespace("public")
    fixed = Marker("p", "ice", "log1", 5, None, None)
    rows = pa.table({"id": pa.array([1], pa.int64())})
    made = catalog.create_table(("public", "t"), rows.schema, properties={"cdc.follower": fixed.to_json()})
    for cut in (1, 2, 3):
        made.append(rows, snapshot_properties=ours(cut))
    made.append(rows, snapshot_properties=ours(8, "cdc:p:ice:otherlog"))
    try:
        assert sink.has_table(table)
        assert Marker.from_json(sink.read_marker(table)) == fixed.with_cut(3)
        assert why_lost(sink, table, Marker("p", "ice", "log1", 5, None, 3)) is None

        # rolled back behind the tool to cut 2's snapshot: the checkpoint's cut 3 is not in it
        two = next(s.snapshot_id for s in made.snapshots() if (s.summary or {}).get(CUT) == "2")
        made.manage_snapshots().rollback_to_snapshot(two).commit()
        assert Marker.from_json(sink.read_marker(table)) == fixed.with_cut(2)
        why = why_lost(sink, table, Marker("p", "ice", "log1", 5, None, 3))
        assert why == lost_reason(fixed.with_cut(2), Marker("p", "ice", "log1", 5, None, 3)) and why
        assert "commits up to cut 2, the checkpoint says cut 3" in why, why

        catalog.drop_table(("public", "t"))
        assert why_lost(sink, table, Marker("p", "ice", "log1", 5, None, 3)) == (
            "the table is gone from the engine (deleted or moved away)"
        )
        assert sink.read_marker(table) is None
    finally:
        sink.close()
        catalog.close()


def test_catalogs_pyiceberg_does_not_read_are_not_checked(tmp_path: Path) -> None:
    # a REST catalog that does not answer (one that does: test_schema_changes_data.py)
    rest = _status_sink(_pipeline(tmp_path, {"type": "rest", "uri": "http://127.0.0.1:9"}))
    with pytest.raises(SinkError, match="pyiceberg could not read the catalog: ") as raised:
        rest.has_table(TableName("public", "t"))
    assert "checked by `cdc apply`" in (raised.value.fix or "")
    other = _status_sink(_pipeline(tmp_path, {"type": "jdbc", "uri": "jdbc:mysql://h/cat"}))
    with pytest.raises(SinkError, match="pyiceberg reads JDBC catalogs on PostgreSQL and SQLite only"):
        other.read_marker(TableName("public", "t"))
    down = {"type": "jdbc", "uri": "jdbc:postgresql://127.0.0.1:9/cat", "user": "u", "password": "secret"}
    refused = _status_sink(_pipeline(tmp_path, down))
    with pytest.raises(SinkError, match="pyiceberg could not read the catalog: OperationalError") as raised:
        refused.has_table(TableName("public", "t"))
    problem = raised.value.problem
    assert "Connection refused" in problem and "\n" not in problem and "secret" not in problem, problem
