"""Reference pages generated from the code, so they cannot drift from it: the CLI from the click
command tree, the pipeline file from the pydantic models, the type mapping from cdc/typetable.py,
the metrics from the Prometheus registry. Written by
`scripts/gen_docs.py`; tests/unit/test_reference_docs.py fails when a page is out of date."""

from __future__ import annotations

from collections.abc import Callable

from pipelines.docgen.common import FIX, REFERENCE, header

__all__ = ["FIX", "REFERENCE", "header", "pages"]


def pages() -> dict[str, Callable[[], str]]:
    """docs/reference/<file> -> its text (imports are lazy: each page only needs its own code)."""
    from pipelines.docgen.cli_ref import cli_page
    from pipelines.docgen.config_ref import pipeline_file_page
    from pipelines.docgen.metrics_ref import metrics_page
    from pipelines.docgen.types_ref import types_page

    return {
        "cli.md": cli_page,
        "pipeline-file.md": pipeline_file_page,
        "types.md": types_page,
        "metrics.md": metrics_page,
    }
