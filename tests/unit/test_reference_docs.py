"""The reference pages under docs/reference/ are generated from the code (scripts/gen_docs.py):
each must equal what the generator makes of the code now, so a new option, key or type rule
cannot ship with a stale page. The failure names the command that regenerates them."""

from __future__ import annotations

import difflib
from pathlib import Path

import click
import pytest

from pipelines.docgen import FIX, REFERENCE, pages

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(pages()))
def test_reference_page_is_up_to_date(name: str) -> None:
    path = ROOT / REFERENCE / name
    want = pages()[name]()
    have = path.read_text() if path.exists() else ""
    if have != want:
        diff = "".join(
            list(difflib.unified_diff(have.splitlines(True), want.splitlines(True), str(path), "generated"))[
                :40
            ]
        )
        pytest.fail(
            f"{REFERENCE / name} is out of date with the code; regenerate it: `{FIX}`\n{diff}", pytrace=False
        )


def test_every_visible_command_and_option_is_in_the_cli_page() -> None:
    """The generator walks the whole tree: each verb and each visible option appears."""
    from pipelines.cli import cli

    page = pages()["cli.md"]()

    def walk(path: str, cmd: click.Command) -> None:
        if getattr(cmd, "hidden", False):
            return
        if path != "cdc":
            assert f"## `{path}`" in page, path
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                assert f"`{p.opts[0]}`" in page, f"{path} {p.opts[0]}"
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(f"{path} {name}", sub)

    walk("cdc", cli)


def test_every_pipeline_key_is_in_the_pipeline_file_page() -> None:
    from pydantic import BaseModel

    from sinks.registry import PipelineModel

    page = pages()["pipeline-file.md"]()

    def walk(model: type[BaseModel], seen: set[type]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, info in model.model_fields.items():
            if not info.exclude:
                assert f"| `{info.alias or name}` |" in page, f"{model.__name__}.{name}"
            for inner in _models(info.annotation):
                walk(inner, seen)

    walk(PipelineModel, set())  # the pipeline model with every follower kind's settings


def _models(annotation) -> list:
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]
