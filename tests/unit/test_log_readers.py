"""Spark stays out of the log layer (issue 12 item 3): the log views are plain Python, and
pipelines.apply.readers.change_reader gives each view its Spark reader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cdc.log import open_log_view
from cdc.log.kafka.debezium import DebeziumLogView
from cdc.log.kafka.view import KafkaLogView
from cdc.log.local import LocalLog
from pipelines.apply.readers import change_reader
from pipelines.apply.readers.debezium import DebeziumReader
from pipelines.apply.readers.kafka import KafkaReader
from pipelines.apply.readers.local import LocalReader
from sinks.registry import load_pipeline
from tests.harness import REPO, write_pipeline

pytestmark = pytest.mark.unit

# Imports the whole log layer with pyspark and delta made unimportable.
NO_SPARK = """
import importlib, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyspark", "delta", "py4j"):
            raise ImportError(f"{name} is blocked")
sys.meta_path.insert(0, Block())
for m in ("cdc.log", "cdc.log.local", "cdc.log.compact", "cdc.log.kafka.view", "cdc.log.kafka.debezium",
          "cdc.log.kafka.publisher"):
    importlib.import_module(m)
print(sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "delta", "pipelines")))
"""


def test_log_layer_imports_without_spark() -> None:
    done = subprocess.run(
        [sys.executable, "-c", NO_SPARK], capture_output=True, text=True, cwd=REPO, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_views_have_no_spark_methods() -> None:
    for view in (LocalLog, KafkaLogView, DebeziumLogView):
        assert not {"read_changes", "_between"} & set(dir(view)), view


@pytest.mark.parametrize(
    ("log", "view", "reader"),
    [
        (None, LocalLog, LocalReader),
        ({"kafka": {"bootstrap_servers": "127.0.0.1:1"}}, KafkaLogView, KafkaReader),
        (
            {"kafka": {"bootstrap_servers": "127.0.0.1:1", "format": "debezium"}},
            DebeziumLogView,
            DebeziumReader,
        ),
    ],
)
def test_change_reader_per_view(tmp_path: Path, log: dict | None, view: type, reader: type) -> None:
    extra = {"log": log} if log else {}
    pipeline = load_pipeline(write_pipeline(tmp_path, "postgresql://127.0.0.1:1/x", ["public.t"], **extra))
    if log is None:  # the local view opens the log read-only: write it first
        LocalLog(pipeline.local_log_path).close()
    opened = open_log_view(pipeline)
    try:
        assert isinstance(opened, view)
        got = change_reader(opened)
        assert type(got) is reader
        assert got.view is opened
        got.close()
    finally:
        opened.close()
    with pytest.raises(TypeError, match="no Spark reader"):
        change_reader(object())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("log", "problem", "fix"),
    [
        (None, "the log is empty", "run `cdc snapshot"),
        (
            {"kafka": {"bootstrap_servers": "127.0.0.1:1", "format": "debezium", "topic_prefix": "dbz"}},
            "no complete cut in Debezium's topics under prefix 'dbz' yet",
            "has finished its snapshot",
        ),
    ],
)
def test_an_empty_log_names_the_fix_for_its_kind(
    tmp_path: Path, log: dict | None, problem: str, fix: str
) -> None:
    """Debezium's topics are filled by the connector: `cdc snapshot` is never the fix there."""
    from cdc.log import empty_log_error

    extra = {"log": log} if log else {}
    error = empty_log_error(load_pipeline(write_pipeline(tmp_path, "postgresql://x", ["public.t"], **extra)))
    assert error.problem == problem and fix in error.fix and ("cdc snapshot" in error.fix) == (log is None)
