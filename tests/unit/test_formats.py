"""Versions of what cdc keeps on disk (cdc/ground/formats.py, README "Upgrading"): every writer
stamps its format, every reader refuses a newer one (exit 5), and the state cdc 0.1.0 wrote
(tests/fixtures/data/state-0.1.0) is upgraded in place, idempotently, and rolled back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cdc.ground.errors import ExitCode
from cdc.ground.formats import FORMATS, STATE, VERSION, FormatTooNew, check_version, version_line
from cdc.log.local import LocalLog
from tests.harness import cdc

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parent.parent / "fixtures" / "data" / "state-0.1.0"


@pytest.fixture
def old_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the state 0.1.0 wrote; returns its pipeline file."""
    work = tmp_path / "p"
    shutil.copytree(FIXTURE, work)
    monkeypatch.setenv("FIXTURE_DSN", "postgresql://nobody@127.0.0.1:1/none")
    return work / "pipeline.yml"


def test_version_is_single_sourced_and_shown_with_the_formats() -> None:
    setup_cfg = (Path(__file__).parents[2] / "setup.cfg").read_text()
    assert "version = attr: cdc.ground.formats.VERSION" in setup_cfg
    run = cdc("--version")
    assert run.code == 0 and run.out.strip() == version_line(), run
    assert VERSION in run.out and all(f"{f.name} {f.version}" in run.out for f in FORMATS)


def test_check_version_refuses_newer_names_both_versions() -> None:
    assert check_version(STATE, None, "x") == 0  # unstamped: what 0.1.0 wrote
    assert check_version(STATE, STATE.version, "x") == STATE.version
    with pytest.raises(FormatTooNew) as exc:
        check_version(STATE, STATE.version + 1, "state file f", "9.9.9")
    assert exc.value.exit_code == ExitCode.FORMAT == 5
    assert f"format {STATE.version + 1}, written by cdc 9.9.9" in exc.value.problem
    assert f"this cdc {VERSION} reads state format {STATE.version}" in exc.value.problem
    assert "cdc 9.9.9 or newer" in (exc.value.fix or "")
    with pytest.raises(FormatTooNew):
        check_version(STATE, "garbage", "x")


def test_marker_stamped_and_newer_refused() -> None:
    from sinks.marker import Marker

    m = Marker("p", "s", "log", 1, 5, 3)
    text = m.to_json()
    assert json.loads(text)["format"] == 1 and Marker.from_json(text) == m
    old = json.dumps({k: v for k, v in json.loads(text).items() if k not in ("format", "cdc_version")})
    assert Marker.from_json(old) == m  # 0.1.0's markers are read as they are
    with pytest.raises(FormatTooNew):
        Marker.from_json(json.dumps({**json.loads(text), "format": 99}))


def test_local_log_newer_refused(tmp_path: Path) -> None:
    log = LocalLog(tmp_path / "log")
    assert log.meta("format") == "1" and log.meta("cdc_version") == VERSION
    log.set_meta("format", "2")
    log.close()
    for readonly in (False, True):
        with pytest.raises(FormatTooNew, match=r"the log at .* is in local_log format 2"):
            LocalLog(tmp_path / "log", readonly=readonly)


def test_old_state_upgraded_in_place_once_then_rolled_back(old_state: Path) -> None:
    ckpt = old_state.parent / "state" / "checkpoints" / "lake.json"
    before = json.loads(ckpt.read_text())
    assert "format" not in before  # as 0.1.0 wrote it

    run = cdc("upgrade", old_state)
    assert run.code == 0, run
    assert "upgraded 1 state file(s)" in run.out and "from state format 0 (cdc 0.1.0) to 1" in run.out, (
        run.out
    )
    after = json.loads(ckpt.read_text())
    assert after == {"format": 1, "cdc_version": VERSION, **before}

    again = cdc("upgrade", old_state)  # idempotent: nothing changes, nothing is said to have
    assert again.code == 0 and "nothing to upgrade" in again.out and "upgraded 1" not in again.out, again
    assert json.loads(ckpt.read_text()) == after

    back = cdc("upgrade", old_state, "--rollback")
    assert back.code == 0 and "rolled back 1 state file(s)" in back.out, back
    assert json.loads(ckpt.read_text()) == before


def test_state_from_the_future_refused_cleanly(old_state: Path) -> None:
    ckpt = old_state.parent / "state" / "checkpoints" / "lake.json"
    data = json.loads(ckpt.read_text())
    ckpt.write_text(json.dumps({"format": STATE.version + 1, "cdc_version": "9.0.0", **data}))
    for verb in (("upgrade",), ("status",), ("log", "read")):
        run = cdc(*verb, old_state)
        assert run.code == 5, (verb, run)
        assert (
            f"is in state format {STATE.version + 1}, written by cdc 9.0.0; this cdc {VERSION}" in run.err
        ), run.err
        assert "  fix: run cdc 9.0.0 or newer" in run.err and "Traceback" not in run.err, run.err
    assert json.loads(ckpt.read_text())["format"] == STATE.version + 1  # untouched


def test_delta_cut_rows_of_0_1_0_read_and_newer_refused() -> None:
    import datetime as dt

    from cdc.ground.formats import DELTA_CUTS
    from sinks.delta.cuts import _record

    row = {
        "cut_id": 3,
        "lsn": 1,
        "log_id": "l",
        "versions": {"public.t": 1},
        "paths": {},
        "applied_at": dt.datetime.now(dt.UTC),
    }
    assert _record(row).cut_id == 3 and _record({**row, "format": None}).cut_id == 3  # 0.1.0's rows
    assert _record({**row, "format": DELTA_CUTS.version, "cdc_version": VERSION}).cut_id == 3
    with pytest.raises(
        FormatTooNew, match=r"cut 3 in _cdc_cuts is in delta_cuts format 2, written by cdc 0.9.0"
    ):
        _record({**row, "format": 2, "cdc_version": "0.9.0"})
