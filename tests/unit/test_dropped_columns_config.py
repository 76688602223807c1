"""`dropped_columns` per sink (issue 33.5): keep by default; null and drop only where the sink can
honour them (delta scd1, redis), refused with the reason elsewhere (exit 2 on the CLI)."""

from __future__ import annotations

import pytest

from cdc.ground.errors import PipelineFileError
from sinks.registry import parse_pipeline

pytestmark = pytest.mark.unit


def _pipeline(sink: dict):
    return parse_pipeline(
        {"name": "p", "source": {"postgres": {"dsn": "dbname=x", "tables": ["public.t"]}}, "sinks": [sink]}
    )


def test_keep_is_the_default_and_null_drop_are_taken_by_delta_and_redis() -> None:
    assert _pipeline({"name": "lake", "delta": {"path": "lake"}}).sinks[0].dropped_columns == "keep"
    for how in ("null", "drop"):
        assert (
            _pipeline({"name": "lake", "delta": {"path": "lake"}, "dropped_columns": how})
            .sinks[0]
            .dropped_columns
            == how
        )
        cache = {
            "name": "c",
            "redis": {"url": "redis://127.0.0.1:6379/0", "tables": ["public.t"]},
            "dropped_columns": how,
        }
        assert _pipeline(cache).sinks[0].dropped_columns == how


@pytest.mark.parametrize(
    "sink",
    [
        {"name": "hist", "delta": {"path": "hist", "mode": "scd2"}, "dropped_columns": "null"},
        {
            "name": "s",
            "search": {"engine": "tantivy", "path": "s", "tables": ["public.t"]},
            "dropped_columns": "drop",
        },
        {"name": "lake", "delta": {"path": "lake"}, "dropped_columns": "nullify"},
    ],
)
def test_other_sinks_and_values_are_refused(sink: dict) -> None:
    with pytest.raises(PipelineFileError, match="dropped_columns"):
        _pipeline(sink)
