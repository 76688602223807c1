"""cdc/ground/logsetup.py: `--log-format json` lines (README "Monitoring"), stage lines and the
modules' log records included, and the text format unchanged."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
from collections.abc import Iterator

import pytest

from cdc.ground import logsetup
from pipelines import stages

pytestmark = pytest.mark.unit


@pytest.fixture
def json_format(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("CDC_LOG_FORMAT", raising=False)
    logsetup.configure("json")
    logsetup.set_pipeline("shop")
    yield
    logsetup.configure("text")
    logsetup._pipeline = None


def test_json_records(json_format: None) -> None:
    out = io.StringIO()
    logsetup.emit("sink lake: up to date", out)
    logsetup.emit("the log is empty", out, "error", fix="run `cdc snapshot shop.yml` first", exit_code=4)
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
    assert logsetup.child_env()["CDC_LOG_FORMAT"] == "json"  # cdc run's stream child prints the same way


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
    logsetup.configure(None)
    out = io.StringIO()
    logsetup.emit("plain line", out)
    assert out.getvalue() == "plain line\n" and not logsetup.is_json()
    monkeypatch.setenv("CDC_LOG_FORMAT", "JSON")
    logsetup.configure(None)
    assert logsetup.is_json()
    logsetup.configure("text")


@pytest.fixture
def cli_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CLI's handler on the tool's loggers for one test, then as before."""
    monkeypatch.delenv("CDC_LOG_FORMAT", raising=False)
    loggers = [logging.getLogger(name) for name in logsetup.PACKAGES]
    before = [(lg.level, list(lg.handlers)) for lg in loggers]
    logsetup.configure("text")
    yield
    logsetup.configure("text")
    logsetup.set_pipeline(None)
    for lg, (level, handlers) in zip(loggers, before, strict=True):
        lg.setLevel(level)
        lg.handlers[:] = handlers


def test_module_records_as_the_cli_prints_them(cli_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A module's logger.info is the line as is on stdout, logger.warning starts with `warning: `, a
    password is masked, prefixed() and to_stderr() shape what is logged inside them; debug detail
    and other libraries' records are not shown."""
    logger = logging.getLogger("snapshot.somewhere")
    logger.info("sink lake: up to date")
    logger.warning("the pipeline file changed\n  fix: restart")
    logger.debug("not shown")
    logging.getLogger("py4j.clientserver").info("not ours")
    with logsetup.prefixed("catch-up: "), logsetup.prefixed("re-base public.t: "):
        logger.info("connecting to postgresql://cdc:hunter2@db/shop")
    with logsetup.to_stderr():
        logger.info("upgraded the state_dir")
    out, err = capsys.readouterr()
    assert out == (
        "sink lake: up to date\n"
        "warning: the pipeline file changed\n  fix: restart\n"
        "catch-up: re-base public.t: connecting to postgresql://cdc:***@db/shop\n"
    )
    assert err == "upgraded the state_dir\n"


def test_module_records_as_json(cli_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    logsetup.configure("json")
    logsetup.set_pipeline("shop")
    logger = logging.getLogger("cdc.somewhere")
    logger.info("streamed 3 changes", extra={"fields": {"events": 3}})
    logger.warning("the slot is behind")
    first, second = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert set(first) == {"time", "level", "pipeline", "event", "fields"}
    assert first["level"] == "info" and first["event"] == "streamed 3 changes"
    assert first["pipeline"] == "shop" and first["fields"] == {"events": 3}
    assert second["level"] == "warning" and second["event"] == "warning: the slot is behind"


def test_collected_lines_from_threads_carrying_the_prefix() -> None:
    """collected(): the lines as the text form prints them, from other threads too; carried() runs
    a function in another thread with the caller's prefix."""
    logger = logging.getLogger("pipelines.somewhere")
    with logsetup.collected() as lines, logsetup.prefixed("      "):
        logger.info("in this thread")
        worker = threading.Thread(target=logsetup.carried(lambda: logger.warning("in a worker")))
        worker.start()
        worker.join()
        plain = threading.Thread(target=lambda: logger.info("in a thread of its own"))
        plain.start()
        plain.join()
    logger.info("after the block")
    assert lines == ["      in this thread", "      warning: in a worker", "in a thread of its own"]


def test_a_reader_gone_reaches_the_verb(cli_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cdc status | head -1`: the write's BrokenPipeError raises at the logging call, as a print
    would (pipelines/cli/failures.py makes it exit 141), not a "Logging error" report."""

    class Gone(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Gone())
    with pytest.raises(BrokenPipeError):
        logging.getLogger("pipelines.status").info("pipeline shop (slot cdc_shop, publication cdc_shop)")


def test_collected_blocks_that_overlap() -> None:
    """A block that ends while another still listens (threads of a test) leaves it hearing INFO."""
    logger = logging.getLogger("sinks.somewhere")
    first = logsetup.collected()
    early = first.__enter__()
    with logsetup.collected("sinks") as late:
        first.__exit__(None, None, None)
        logger.info("still heard")
    assert late == ["still heard"] and early == []
