"""Follower kinds as sinks/registry.py registers them: each kind's settings and sink in its own
folder, and a kind added to the registry is a key of the pipeline file (validated with its
settings, named in the errors and in the reference) without a change to cdc/ground."""

from __future__ import annotations

import pytest
from pydantic import Field

from cdc.ground.config import pipeline_model
from cdc.ground.errors import PipelineFileError
from cdc.ground.pipeline_file import parse_pipeline
from cdc.ground.settings import SinkSettings
from sinks.registry import SINK_KINDS, PipelineModel, SinkConfigModel, SinkKind

pytestmark = pytest.mark.unit


def test_each_kind_keeps_its_settings_and_its_sink_in_one_folder() -> None:
    for kind, spec in SINK_KINDS.items():
        folder = spec.settings.__module__.rpartition(".")[0]
        assert spec.settings.__module__ == f"{folder}.settings", kind
        assert spec.sink.startswith(f"{folder}."), kind
        assert spec.settings.__name__.endswith("Settings"), kind
    assert SinkConfigModel.kinds == tuple(SINK_KINDS)
    assert PipelineModel.sink_config is SinkConfigModel


class QueueSettings(SinkSettings):
    topic: str = Field(description="where rows go")
    tables: list[str] | None = None
    views: list[str] = Field(default_factory=list)


def test_a_kind_added_to_the_registry_is_a_key_of_the_pipeline_file() -> None:
    kinds = {**SINK_KINDS, "queue": SinkKind(QueueSettings, "tests.unit.test_sink_kinds:nothing", "a queue")}
    model = pipeline_model({k: (s.settings, s.description) for k, s in kinds.items()}, __name__)
    source = {"postgres": {"dsn": "dbname=x", "tables": ["public.t"]}}

    pipeline = parse_pipeline(
        {"name": "p", "source": source, "sinks": [{"name": "q", "queue": {"topic": "t"}}]}, model=model
    )
    assert pipeline.sinks[0].kind == "queue" and pipeline.sinks[0].settings == QueueSettings(topic="t")

    with pytest.raises(PipelineFileError) as bad:
        parse_pipeline(
            {"name": "p", "source": source, "sinks": [{"name": "q", "queue": {"topik": "t"}}, {"name": "r"}]},
            model=model,
        )
    assert "sinks.0.queue: unknown key 'topik' (did you mean 'topic'?)" in bad.value.problem
    assert "give exactly one sink kind: `delta`, `iceberg`, `search`, `redis` or `queue`" in bad.value.problem
    assert list(model.sink_config.model_fields)[:2] == [
        "name",
        "delta",
    ]  # kinds after the name, as the reference lists them
