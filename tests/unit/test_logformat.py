"""pipelines/logformat.py: `--log-format json` lines (README "Monitoring"), stage lines included,
and the text format unchanged."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest

from pipelines import logformat, stages

pytestmark = pytest.mark.unit


@pytest.fixture
def json_format(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("CDC_LOG_FORMAT", raising=False)
    logformat.configure("json")
    logformat.set_pipeline("shop")
    yield
    logformat.configure("text")
    logformat._pipeline = None


def test_json_records(json_format: None) -> None:
    out = io.StringIO()
    logformat.emit("sink lake: up to date", out)
    logformat.emit("the log is empty", out, "error", fix="run `cdc snapshot shop.yml` first", exit_code=4)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert set(first) == {"time", "level", "pipeline", "event", "fields"}
    assert first["level"] == "info" and first["pipeline"] == "shop" and first["fields"] == {}
    assert (
        first["event"] == "sink lake: up to date" and first["time"].endswith("Z") and len(first["time"]) == 24
    )
    assert second["level"] == "error" and second["fields"] == {
        "fix": "run `cdc snapshot shop.yml` first",
        "exit_code": 4,
    }
    assert logformat.child_env()["CDC_LOG_FORMAT"] == "json"  # cdc run's stream child prints the same way


def test_stage_lines_are_json(json_format: None) -> None:
    out = io.StringIO()
    reporter = stages.Stages(stream=out, tty=True)  # even on a terminal: no live line between JSON lines
    old = stages.activate(reporter)
    try:
        with pytest.raises(RuntimeError), stages.stage("sink lake: public.t: applying offsets 1..9"):
            raise RuntimeError("boom")
    finally:
        stages.activate(old)
        reporter.close()
    started, failed = (json.loads(line) for line in out.getvalue().splitlines())
    assert started["fields"] == {"stage": "sink lake: public.t: applying offsets 1..9", "status": "started"}
    assert failed["fields"]["status"] == "failed" and failed["fields"]["seconds"] >= 0
    assert failed["event"].startswith("sink lake: public.t: applying offsets 1..9: failed after")


def test_text_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDC_LOG_FORMAT", raising=False)
    logformat.configure(None)
    out = io.StringIO()
    logformat.emit("plain line", out)
    assert out.getvalue() == "plain line\n" and not logformat.is_json()
    monkeypatch.setenv("CDC_LOG_FORMAT", "JSON")
    logformat.configure(None)
    assert logformat.is_json()
    logformat.configure("text")
