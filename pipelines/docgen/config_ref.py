"""docs/reference/pipeline-file.md from the pydantic models of the pipeline file (cdc/ground/config.py
and its sections' cdc/ground/*_config.py, each follower kind's sinks/<kind>/settings.py, put
together by sinks/registry.py): every key with its type, default, allowed values, constraints and
description."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from pipelines.docgen.common import header


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _args(annotation: Any) -> tuple[Any, ...]:
    return typing.get_args(annotation)


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _model_in(annotation: Any) -> tuple[type[BaseModel], str] | None:
    """The model a key holds, and how its keys are reached: '' (a mapping), '[]' (a list of
    them) or '.<name>' (a mapping of them by a name the user chooses)."""
    if _is_union(annotation):
        for arg in _args(annotation):
            found = _model_in(arg)
            if found:
                return found
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    origin = typing.get_origin(annotation)
    if origin is list and _args(annotation) and _model_in(_args(annotation)[0]):
        return _model_in(_args(annotation)[0])[0], "[]"  # type: ignore[index]
    if origin is dict and len(_args(annotation)) == 2 and _model_in(_args(annotation)[1]):
        return _model_in(_args(annotation)[1])[0], ".<name>"  # type: ignore[index]
    return None


def _type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type(_args(annotation)[0])
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in _args(annotation))
    if _is_union(annotation):
        parts = [_type(a) for a in _args(annotation) if a is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in _args(annotation) else "")
    if origin in (list, set, tuple):
        return (
            f"list of {_type(_args(annotation)[0]).replace('mapping (below)', 'mappings (below)')}"
            if _args(annotation)
            else "list"
        )
    if origin is dict:
        key, value = _args(annotation)
        return f"mapping {_type(key)} → {_type(value)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping (below)"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(below)"
        return f"`{value}`" if value not in ([], {}, set()) else "empty"
    if info.default is None or info.default is PydanticUndefined:
        return ""
    return f"`{str(info.default).lower() if isinstance(info.default, bool) else info.default}`"


def _constraints(info: FieldInfo) -> str:
    said = []
    for meta in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(meta, attr, None) is not None:
                said.append(f"{sign} {getattr(meta, attr)}")
        if getattr(meta, "min_length", None) is not None:
            said.append(f"at least {meta.min_length}")
        if getattr(meta, "pattern", None) is not None:
            said.append(f"matches `{meta.pattern}`")
    return ", ".join(said)


def _section(path: str, model: type[BaseModel], out: list[str], seen: set[str]) -> None:
    out += [f"## `{path}`" if path else "## top level", ""]
    doc = (
        inspect.cleandoc(model.__doc__ or "") if model.__doc__ and model.__doc__ != BaseModel.__doc__ else ""
    )
    if doc and not doc.startswith(model.__name__ + "("):
        out += [" ".join(doc.split()), ""]
    out += ["| key | type | default | constraints | description |", "|---|---|---|---|---|"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, info in model.model_fields.items():
        if info.exclude:
            continue  # set by the loader (base_dir, file), not keys of the file
        key = info.alias or name
        inner = _model_in(info.annotation)
        out.append(
            f"| `{key}` | {_type(info.annotation)} | {_default(info)} | {_constraints(info)} | "
            f"{_cell(info.description or '')} |"
        )
        if inner:
            nested.append((f"{path}.{key}{inner[1]}" if path else f"{key}{inner[1]}", inner[0]))
    out.append("")
    for sub, sub_model in nested:
        _section(sub, sub_model, out, seen)


INTRO = """# Pipeline file reference

A pipeline file is YAML: one PostgreSQL source, one log, any number of sinks. `${VAR}` and
`${VAR:-default}` are replaced from the environment (`$$` is a literal `$`); relative paths are
relative to the file. Unknown keys, wrong types and missing required keys are refused (exit 2)
with the key's path. `cdc validate PIPELINE` checks a file and its source without changing anything.

Each section below is one mapping; `[]` marks a list of such mappings, `.<name>` a mapping of
them by a name you choose (a table such as `public.orders`).
"""


def pipeline_file_page() -> str:
    from sinks.registry import PipelineModel

    out = [
        header("the pydantic models of cdc/ground/*config.py and sinks/*/settings.py").rstrip("\n"),
        "",
        INTRO,
    ]
    _section("", PipelineModel, out, set())
    return "\n".join(out).rstrip("\n") + "\n"
