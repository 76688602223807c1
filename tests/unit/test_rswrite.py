"""sinks/delta/rswrite.py on its own, with delta-rs and no Spark: which tables it takes, a replayed
cut writes nothing, and the follower's position (Delta's transaction id) survives delta-rs's own
checkpoints and the log cleanup after them, read by delta-rs and by cdc's log-file reader
(`cdc status`, and the apply where delta-rs writes)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from sinks.delta import rswrite
from sinks.delta.logfiles import latest_version, txn_version

pytestmark = pytest.mark.unit

APP = "cdc:p:lake:log"


def rows(ids: list[int], name: str = "Name") -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), name: [f"v{i}" for i in ids]})


def test_which_tables_delta_rs_writes(tmp_path: Path) -> None:
    plain = str(tmp_path / "plain")
    write_deltalake(plain, rows([1]))
    assert rswrite.writable(plain)
    cdf = str(tmp_path / "cdf")
    write_deltalake(cdf, rows([1]), configuration={"delta.enableChangeDataFeed": "true"})
    assert not rswrite.writable(cdf), "a change data feed is Spark's to write"
    # a `timestamp` column: Spark may have written it as INT96 unless the table says otherwise
    stamped = pa.table({"id": [1], "at": pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("us", "UTC"))})
    old = str(tmp_path / "old")
    write_deltalake(old, stamped)
    assert not rswrite.writable(old)
    new = str(tmp_path / "new")
    write_deltalake(new, stamped)  # (delta-rs creates no table with a property of another name)
    DeltaTable(new).alter.set_table_properties(rswrite.INT64_TIMESTAMPS, raise_if_not_exists=False)
    assert rswrite.writable(new)
    ntz = str(tmp_path / "ntz")  # without time zone: Spark writes INT64 for those
    write_deltalake(ntz, pa.table({"id": [1], "at": pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("us"))}))
    assert rswrite.writable(ntz)
    assert not rswrite.writable("s3://bucket/table"), "object stores stay with Spark"


def test_merge_keeps_case_and_quotes_in_names_and_a_replay_writes_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    odd = 'We"ird Name'
    write_deltalake(path, rows([1, 2], odd))
    c = rswrite.ident
    merge = dict(
        on=f"t.{c('id')} = s.{c('id')}",
        delete_when="false",
        update_when="true",
        update={c(odd): f"s.{c(odd)} || '!'"},
        insert_when="true",
        insert={c("id"): f"s.{c('id')}", c(odd): f"s.{c(odd)}"},
        app_id=APP,
    )
    metrics = rswrite.merge(path, rows([2, 3], odd), cut_id=7, **merge)
    assert metrics is not None
    assert (metrics["num_target_rows_updated"], metrics["num_target_rows_inserted"]) == (1, 1)
    version = DeltaTable(path).version()
    assert rswrite.merge(path, rows([2, 3], odd), cut_id=7, **merge) is None
    assert rswrite.append(path, rows([9], odd), APP, 7) == 1
    assert DeltaTable(path).version() == version, "a replayed cut committed"
    got = {r["id"]: r[odd] for r in DeltaTable(path).to_pyarrow_table().to_pylist()}
    assert got == {1: "v1", 2: "v2!", 3: "v3"}


def test_the_position_survives_checkpoints_and_log_cleanup(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    write_deltalake(path, rows([0]), configuration={"delta.checkpointInterval": "5"})
    for cut in range(1, 13):
        rswrite.append(path, rows([cut]), APP, cut)
    log = Path(path) / "_delta_log"
    assert (log / f"{9:020d}.checkpoint.parquet").exists(), "delta-rs wrote no checkpoint"
    for commit in log.glob("*.json"):  # what log cleanup removes: the commits the checkpoint holds
        if int(commit.stem) <= 9:
            commit.unlink()
    assert txn_version(path, APP) == DeltaTable(path).transaction_version(APP) == 12
    assert latest_version(path) == 12
    for commit in log.glob("*.json"):  # and with only the checkpoint left
        commit.unlink()
    (log / "_last_checkpoint").unlink()
    assert txn_version(path, APP) == 9


def test_an_append_leaves_a_column_the_rows_lack_null(tmp_path: Path) -> None:
    """A column the source dropped stays in the table (`dropped_columns: keep`) and the cut's rows
    lack it: the crash campaign's Delta follower failed every cut after such a drop (KeyError)."""
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64()), "gone": ["kept"], "Name": ["v1"]}))
    assert rswrite.append(path, rows([2, 3]), APP, 7) == 2
    got = DeltaTable(path).to_pyarrow_table().sort_by("id").to_pylist()
    assert got == [
        {"id": 1, "gone": "kept", "Name": "v1"},
        {"id": 2, "gone": None, "Name": "v2"},
        {"id": 3, "gone": None, "Name": "v3"},
    ]
    assert txn_version(path, APP) == 7
