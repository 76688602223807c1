"""pipelines/stages.py without a terminal: plain start/end lines, nested stages, failures, and
nothing at all when no verb turned reporting on."""

from __future__ import annotations

import io

import pytest

from pipelines import stages

pytestmark = pytest.mark.unit


def test_plain_lines() -> None:
    out = io.StringIO()
    reporter = stages.Stages(stream=out, tty=False)
    old = stages.activate(reporter)
    try:
        with stages.stage("sink lake: cut 3"), stages.stage("sink lake: public.t: applying offsets 1..9"):
            pass
        with pytest.raises(ValueError), stages.stage("comparing"):
            raise ValueError("boom")
    finally:
        stages.activate(old)
        reporter.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "sink lake: cut 3 ..."
    assert lines[1] == "sink lake: public.t: applying offsets 1..9 ..."
    assert lines[2].startswith("sink lake: public.t: applying offsets 1..9: done in ") and lines[2].endswith(
        "s"
    )
    assert lines[3].startswith("sink lake: cut 3: done in ")
    assert lines[4] == "comparing ..." and lines[5].startswith("comparing: failed after ")


def test_quiet_when_not_active(capsys) -> None:
    stages.activate(None)
    with stages.stage("anything"):
        pass
    assert capsys.readouterr() == ("", "")


def test_terminal_mode_keeps_finished_stages() -> None:
    """With a terminal (rich): the live line goes away, each finished stage stays as a line."""
    out = io.StringIO()
    reporter = stages.Stages(stream=out, tty=True)
    old = stages.activate(reporter)
    try:
        with stages.stage("starting Spark (local[2])"):
            pass
        with stages.stage("sink lake: public.t: applying offsets 1..9"):
            pass
    finally:
        stages.activate(old)
        reporter.close()
    lines = out.getvalue().splitlines()
    assert [line.split(": done in ")[0] for line in lines] == [
        "starting Spark (local[2])",
        "sink lake: public.t: applying offsets 1..9",
    ]
