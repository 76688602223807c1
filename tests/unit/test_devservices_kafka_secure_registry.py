"""`cdc dev up|down|status kafka` on a --dir whose broker was started with --secure (issue 34
item 6), without starting a broker: status and down find the secured kind from its marker, a
formatted directory is not switched between plain and secured, and Debezium is refused on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc.ground.errors import UsageError
from pipelines.devservices import registry
from pipelines.devservices.kafka import LocalKafka
from pipelines.devservices.kafka_secure import SecureKafka

pytestmark = pytest.mark.unit


def _secured(base: Path, formatted: bool = True) -> None:
    folder = base / "kafka"
    (folder / "data").mkdir(parents=True)
    (folder / "secure.json").write_text(json.dumps({"mtls": 1, "user": "cdc"}))
    if formatted:
        (folder / "data" / "meta.properties").write_text("node.id=1\n")


def test_status_and_down_find_a_secured_broker(tmp_path: Path) -> None:
    _secured(tmp_path)
    assert isinstance(registry.FACTORIES["kafka"](tmp_path), SecureKafka)
    assert "kafka: stopped" in registry.status(tmp_path, ())
    assert "kafka: not running" in registry.down(tmp_path, ())  # debezium among them: no error


def test_a_formatted_dir_keeps_its_kind(tmp_path: Path) -> None:
    _secured(tmp_path)
    with pytest.raises(UsageError) as caught:
        registry.up(tmp_path, ["kafka"])
    assert "holds a secured dev Kafka; it cannot be started plain" in caught.value.problem
    assert "cdc dev up kafka --secure" in (caught.value.fix or "")
    with pytest.raises(UsageError) as caught:
        registry.up(tmp_path, ["debezium"])
    assert "debezium runs on the plain dev Kafka" in caught.value.problem

    plain = tmp_path / "plain"
    (plain / "kafka" / "data").mkdir(parents=True)
    (plain / "kafka" / "data" / "meta.properties").write_text("node.id=1\n")
    assert isinstance(registry.FACTORIES["kafka"](plain), LocalKafka)
    with pytest.raises(UsageError) as caught:
        registry.up(plain, ["kafka"], secure=True)
    assert "holds a plain dev Kafka; it cannot be started secured" in caught.value.problem


def test_an_unformatted_secured_dir_may_start_plain(tmp_path: Path) -> None:
    _secured(tmp_path, formatted=False)
    service = registry._kafka(tmp_path.resolve(), secure=False)
    assert type(service) is LocalKafka and not (tmp_path / "kafka" / "secure.json").exists()


def test_secure_needs_kafka_or_spark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_SECRET", raising=False)
    with pytest.raises(UsageError) as caught:
        registry.up(tmp_path, ["redis"], secure=True)
    assert "--secure is for kafka and spark" in caught.value.problem
