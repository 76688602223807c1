"""A Delta table's properties read from its `_delta_log` files without a JVM (sinks/delta/logfiles.py),
as `cdc status` reads a Delta follower's marker (issue 34 item 1). The tables are real Delta tables
written by delta-rs (the `deltalake` package); the Spark-written case is the integration test
test_delta_table_deleted_while_idle_is_found_by_status_and_apply (status reads a real marker)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from sinks.delta.logfiles import LogUnreadable, is_delta_table, table_properties, txn_version

pytestmark = pytest.mark.unit

KEY = "cdc.follower"


def marked_table(path: Path, *markers: str) -> None:
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(str(path), pa.table({"id": [1, 2]}))
    for marker in markers:  # one metadata commit each, as the sink's ALTER TABLE SET TBLPROPERTIES
        DeltaTable(str(path)).alter.set_table_properties({KEY: marker}, raise_if_not_exists=False)
    write_deltalake(str(path), pa.table({"id": [3]}), mode="append")  # a data commit after them


def test_the_newest_metadata_commit_wins(tmp_path: Path) -> None:
    marked_table(tmp_path / "t", '{"end": 1}', '{"end": 2}')
    assert is_delta_table(tmp_path / "t")
    assert table_properties(tmp_path / "t")[KEY] == '{"end": 2}'


def test_read_from_the_checkpoint_when_the_commits_are_cleaned_up(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    path = tmp_path / "t"
    marked_table(path, '{"end": 1}', '{"end": 7}')
    DeltaTable(str(path)).create_checkpoint()
    for commit in (path / "_delta_log").glob("*.json"):
        commit.unlink()  # what log cleanup leaves: the checkpoint only
    assert list((path / "_delta_log").glob("*.checkpoint.parquet"))
    assert table_properties(path)[KEY] == '{"end": 7}'


def test_no_table_and_no_marker(tmp_path: Path) -> None:
    assert not is_delta_table(tmp_path / "gone")
    (tmp_path / "empty" / "_delta_log").mkdir(parents=True)
    assert not is_delta_table(tmp_path / "empty")
    marked_table(tmp_path / "plain")
    assert KEY not in table_properties(tmp_path / "plain")
    with pytest.raises(LogUnreadable):
        table_properties(tmp_path / "empty")


def follower_commits(path: Path, *cuts: int, app_id: str = "cdc:p:s:log") -> None:
    """Data commits carrying the follower's idempotent-write id, as the sink's MERGEs do."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    for cut in cuts:
        props = CommitProperties(app_transactions=[Transaction(app_id, cut)])
        write_deltalake(str(path), pa.table({"id": [cut]}), mode="append", commit_properties=props)


def test_txn_version_is_the_newest_cut_of_the_app_id(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    path = tmp_path / "t"
    marked_table(path)
    assert txn_version(path, "cdc:p:s:log") is None  # no commit of the follower yet
    follower_commits(path, 3, 4)
    follower_commits(path, 9, app_id="cdc:other:s:log")  # another follower's commit after them
    assert txn_version(path, "cdc:p:s:log") == 4
    assert txn_version(path, "cdc:other:s:log") == 9
    assert DeltaTable(str(path)).transaction_version("cdc:p:s:log") == 4  # delta-rs agrees


def test_txn_version_from_the_checkpoint_and_from_the_checksum(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    path = tmp_path / "t"
    marked_table(path)
    follower_commits(path, 5)
    table = DeltaTable(str(path))
    table.create_checkpoint()
    at = table.version()
    from deltalake import write_deltalake

    write_deltalake(str(path), pa.table({"id": [0]}), mode="append")  # a commit without the txn after it
    for commit in (path / "_delta_log").glob("*.json"):
        if int(commit.stem) <= at:
            commit.unlink()  # log cleanup: only the checkpoint holds cut 5
    assert txn_version(path, "cdc:p:s:log") == 5
    # the latest version's checksum file lists every app id's version (Spark's Delta writes one)
    latest = max(int(c.stem) for c in (path / "_delta_log").glob("*.json"))
    checksum = {"setTransactions": [{"appId": "cdc:p:s:log", "version": 6, "lastUpdated": 0}]}
    (path / "_delta_log" / f"{latest:020d}.crc").write_text(json.dumps(checksum))
    assert txn_version(path, "cdc:p:s:log") == 6
    assert txn_version(path, "cdc:none") is None
