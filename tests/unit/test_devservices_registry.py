"""`cdc dev down` / `status` with no names cover Debezium's Kafka Connect too (issue 23 item 7):
it starts only when named, but a bare `down` must not leave its JVM running, and stops it before
the Kafka it writes to."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.devservices import registry

pytestmark = pytest.mark.unit


def test_bare_down_and_status_include_debezium(tmp_path: Path) -> None:
    assert [line.split(":")[0] for line in registry.status(tmp_path, ())] == [
        "postgres",
        "kafka",
        "redis",
        "opensearch",
        "debezium",
        "spark",
    ]
    down = [line.split(":")[0] for line in registry.down(tmp_path, ())]
    assert down.index("debezium") < down.index("kafka"), down
    assert set(down) == set(registry.FACTORIES)


def test_up_help_names_debezium() -> None:
    from click.testing import CliRunner

    from pipelines.cli import cli

    out = CliRunner().invoke(cli, ["dev", "up", "--help"]).output
    assert "debezium" in out and "cdc dev up postgres kafka debezium" in out, out
