"""Reading a pipeline file: YAML, `${VAR}` / `${VAR:-default}` from the environment or from the
file `$VAR_FILE` names (a mounted secret), and pydantic's validation errors worded for the person
who wrote the file (the key path, what was expected, the key a typo most likely meant; secrets
never shown). The model read with is pipeline_model()'s (cdc/ground/config.py), with the follower
kinds sinks/registry.py registers; its load_pipeline/parse_pipeline are the ones to call."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from cdc.ground.errors import PipelineFileError

if TYPE_CHECKING:
    from cdc.ground.config import Pipeline

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def interpolate(value: Any, where: str = "") -> Any:
    """Replace ${VAR} / ${VAR:-default} in every string of a parsed YAML tree."""
    if isinstance(value, dict):
        return {k: interpolate(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, f"{where}.{i}") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        var, default = match.group(1), match.group(2)
        from_file = secret_file(var, where)
        if from_file is not None:
            return from_file
        if var in os.environ:
            return os.environ[var]
        if default is not None:
            return default
        raise PipelineFileError(
            f"{where}: environment variable {var} is not set",
            f"export {var}=..., or {var}_FILE=<a file holding the value>, or write ${{{var}:-default}} in the pipeline file",
        )

    return _VAR.sub(sub, value)


def secret_file(var: str, where: str) -> str | None:
    """${VAR} from the file $VAR_FILE names (a secret as container orchestrators mount it), its
    trailing newline stripped; None when VAR_FILE is not set. Setting both is ambiguous: an error."""
    path = os.environ.get(f"{var}_FILE")
    if path is None:
        return None
    if var in os.environ:
        raise PipelineFileError(
            f"{where}: both {var} and {var}_FILE are set (the value would be ambiguous)",
            f"unset one of them: {var} holds the value itself, {var}_FILE the path of a file holding it",
        )
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise PipelineFileError(
            f"{where}: ${{{var}}} is read from {var}_FILE={path}, which cannot be read ({why})",
            f"put the secret in that file, readable by this user (mode 0600 or 0400), or point {var}_FILE at the file holding it",
        ) from None
    return text.rstrip("\r\n")  # `echo pw > file` and editors add a newline the secret does not have


def _models_in(tp: Any) -> list[Any]:
    """The types a (possibly Optional / Union / Annotated) annotation can hold."""
    if get_origin(tp) is Annotated:
        return _models_in(get_args(tp)[0])
    if get_origin(tp) in (Union, UnionType):
        return [m for arg in get_args(tp) for m in _models_in(arg)]
    return [tp]


def keys_at(model: type[Pipeline], loc: tuple[Any, ...]) -> list[str]:
    """The keys the pipeline file allows in the mapping at `loc` (a pydantic error location);
    union tags pydantic puts into locations are stepped over."""
    current: list[Any] = [model]
    for part in loc:
        following: list[Any] = []
        for tp in (m for c in current for m in _models_in(c)):
            origin, args = get_origin(tp), get_args(tp)
            if isinstance(part, int) and origin is list and args:
                following.append(args[0])
            elif isinstance(part, str) and isinstance(tp, type) and issubclass(tp, BaseModel):
                field = tp.model_fields.get(part)
                if field is not None:
                    following.append(field.annotation)
            elif isinstance(part, str) and origin is dict and len(args) == 2:
                following.append(args[1])
        if following:
            current = following  # else: a union tag in the location, not a key
    keys: list[str] = []
    for tp in (m for c in current for m in _models_in(c)):
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            keys += [f.alias or name for name, f in tp.model_fields.items()]
    return keys


_SECRET_KEYS = frozenset({"mask_key", "sasl_password", "password"})


def _describe(error: ErrorDetails, model: type[Pipeline]) -> str:
    loc = ".".join(str(p) for p in error["loc"]) or "(top level)"
    kind, msg = error["type"], error["msg"]
    if kind == "extra_forbidden":
        parent, key = loc.rpartition(".")[0], error["loc"][-1]
        # a typo (stat_dir, mdoe) gets the key it most likely meant
        close = difflib.get_close_matches(str(key), keys_at(model, tuple(error["loc"][:-1])), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{parent or '(top level)'}: unknown key {key!r}{hint}"
    if kind == "missing":
        return f"{loc}: required key is missing"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    got = error.get("input")
    secret = bool(error["loc"]) and error["loc"][-1] in _SECRET_KEYS  # a wrong secret is still a secret
    shown = "" if isinstance(got, dict | list) or got is None or secret else f" (got {got!r})"
    return f"{loc}: {msg}{shown}"


def parse_pipeline(
    data: Any, source: str = "<pipeline>", base_dir: Path | None = None, *, model: type[Pipeline]
) -> Pipeline:
    """The pipeline file's parsed YAML as `model` (pipeline_model(): sinks/registry.py's
    parse_pipeline and load_pipeline give the follower kinds)."""
    if not isinstance(data, dict):
        raise PipelineFileError(f"{source}: the pipeline file must be a YAML mapping (name:, source:, ...)")
    try:
        data = interpolate(data)
    except PipelineFileError as exc:
        raise PipelineFileError(f"{source}: {exc.problem}", exc.fix) from None
    try:
        # base_dir first: validators resolve relative paths (certificate files) against it
        pipeline = model.model_validate(data | {"base_dir": base_dir or Path(".")})
    except ValidationError as exc:
        lines = [_describe(e, model) for e in exc.errors()]
        raise PipelineFileError(
            f"{source}: invalid pipeline file:\n  " + "\n  ".join(lines),
            "see docs/reference/pipeline-file.md",
        ) from None
    return pipeline.model_copy(update={"base_dir": base_dir or Path(".")})


def load_pipeline(path: str | os.PathLike[str], *, model: type[Pipeline]) -> Pipeline:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PipelineFileError(
            f"pipeline file {file} does not exist", "check the path (relative to the current directory)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineFileError(f"cannot read pipeline file {file}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PipelineFileError(
            f"{file}: not valid YAML{at}: {problem}",
            "fix the YAML syntax there (indentation, a missing ':', an unclosed bracket or quote)",
        ) from None
    pipeline = parse_pipeline(data, str(file), file.resolve().parent, model=model)
    return pipeline.model_copy(update={"file": str(path)})
