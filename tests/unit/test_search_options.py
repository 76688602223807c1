"""The search sink's pipeline-file options (cdc/ground/config.py): parsing only, no services."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def test_pipeline_file_search_options(tmp_path: Path) -> None:
    from cdc.ground.config import parse_pipeline
    from cdc.ground.errors import PipelineFileError

    def parse(search: dict) -> None:
        parse_pipeline(
            {
                "name": "p",
                "source": {"postgres": {"dsn": "x", "tables": ["public.t"]}},
                "sinks": [{"name": "s", "search": search}],
            }
        )

    parse({"tables": ["public.t"], "fields": {"public.t": {"v": "keyword"}}, "gc_deletes": "12h"})
    for bad, expected in (
        ({"tables": ["public.t"], "colour": 1}, "unknown key 'colour'"),
        ({"tables": ["public.t"], "fields": {"public.u": {"v": "text"}}}, "not among this sink's `tables`"),
        ({"tables": ["public.t"], "fields": {"public.t": {"v": "blob"}}}, "fields.public.t.v"),
        ({"tables": ["public.t"], "gc_deletes": "soon"}, "gc_deletes"),
        ({"engine": "opensearch", "tables": ["public.t"]}, "needs `hosts`"),
    ):
        with pytest.raises(PipelineFileError) as exc:
            parse(bad)
        assert expected in str(exc.value), (bad, str(exc.value))
