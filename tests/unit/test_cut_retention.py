"""Cut retention of the local log (issue 33.1): cuts stay from the slowest follower's position on
(its state file names it, cdc/log/holds.py), bounded by count and age, with an alarm past the bound."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from cdc.log.holds import follower_holds, holds_reader
from cdc.log.local import LocalLog

pytestmark = pytest.mark.unit


def _cuts(log: LocalLog, n: int) -> int:
    last = 0
    for i in range(n):
        last = log.commit(100 + i).id
    return last


def _state(path: Path, kind: str, name: str, cut_id: int, pending: int | None = None) -> None:
    directory = path / ("checkpoints" if kind == "sink" else "views")
    directory.mkdir(parents=True, exist_ok=True)
    body = {"sink" if kind == "sink" else "view": name, "cut_id": cut_id}
    if pending is not None:
        body["pending"] = {"cut_id": pending}
    (directory / f"{name}.json").write_text(json.dumps(body))


def test_without_holds_the_newest_cuts_stay(tmp_path: Path) -> None:
    log = LocalLog(tmp_path / "log")
    log.set_retention(20, 1000, 86400, holds_reader(tmp_path, ["lake"], []))
    last = _cuts(log, 300)
    assert log.cut(last - 19) is not None and log.cut(last - 20) is None
    assert log.retention()["oldest_cut"]["id"] == last - 19
    assert "alarm" not in log.retention()


def test_a_lagging_follower_holds_its_cut_and_every_later_one(tmp_path: Path) -> None:
    log = LocalLog(tmp_path / "log")
    log.set_retention(20, 100_000, 86400, holds_reader(tmp_path, ["lake", "cache"], ["docs"]))
    _cuts(log, 10)
    _state(tmp_path, "sink", "lake", 7)
    _state(tmp_path, "view", "docs", 9)
    _state(tmp_path, "sink", "cache", 0)  # never applied: holds nothing
    _state(tmp_path, "sink", "gone", 2)  # not in the pipeline file: holds nothing
    _cuts(log, 500)
    assert log.cut(6) is None
    assert all(log.cut(i) is not None for i in range(7, 511))
    _state(tmp_path, "sink", "lake", 400)  # the follower moves on: the cuts it left go
    _cuts(log, 100)
    assert log.cut(8) is None and log.cut(9) is not None  # the view still holds 9
    assert follower_holds(tmp_path, ["lake"], ["docs"]) == {"sink lake": 400, "view docs": 9}


def test_a_pending_cut_is_held_too(tmp_path: Path) -> None:
    _state(tmp_path, "sink", "lake", 30, pending=12)
    assert follower_holds(tmp_path, ["lake"], []) == {"sink lake": 12}


def test_past_the_count_bound_the_oldest_go_with_an_alarm(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = LocalLog(tmp_path / "log")
    log.set_retention(20, 150, 86400, holds_reader(tmp_path, ["lake"], []), "shop")
    _cuts(log, 5)
    _state(tmp_path, "sink", "lake", 3)
    last = _cuts(log, 400)
    assert log.cut(3) is None
    oldest = log.retention()["oldest_cut"]["id"]
    assert last - 200 <= oldest <= last - 100  # pruned every 50 cuts down to the bound
    alarm = log.retention()["alarm"]
    assert alarm["followers"] == {"sink lake": 3}
    (alarm_line,) = [  # once, not every prune; printed on stderr (logsetup.STDERR)
        r for r in caplog.records if r.getMessage().startswith("the log dropped cuts below")
    ]
    assert alarm_line.levelno == logging.WARNING and getattr(alarm_line, "stderr", False)
    assert "sink lake (at cut 3)" in alarm_line.getMessage() and "held_cuts_max" in alarm_line.getMessage()
    _state(tmp_path, "sink", "lake", last)  # the follower was rebuilt: the alarm clears
    _cuts(log, 50)
    assert "alarm" not in log.retention()


def test_past_the_age_bound_the_oldest_go(tmp_path: Path) -> None:
    log = LocalLog(tmp_path / "log")
    log.set_retention(20, 100_000, 60, holds_reader(tmp_path, ["lake"], []))
    _state(tmp_path, "sink", "lake", 10)
    _cuts(log, 100)
    assert log.cut(10) is not None and log.cut(9) is None
    log.db.execute("UPDATE cuts SET ts_ms = ts_ms - 3600000 WHERE id <= 80")  # an hour old
    _cuts(log, 50)
    assert log.cut(80) is None and log.cut(81) is not None
    assert log.retention()["alarm"]["followers"] == {"sink lake": 10}
