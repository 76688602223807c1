"""docs/reference/cli.md from the click command tree of pipelines/cli/."""

from __future__ import annotations

import inspect

import click

from pipelines.docgen.common import header


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _type(param: click.Parameter) -> str:
    t = param.type
    if isinstance(param, click.Option) and param.is_flag:
        return "flag"
    if isinstance(t, click.Choice):
        return " \\| ".join(f"`{c}`" for c in t.choices)
    if isinstance(t, click.IntRange | click.FloatRange):
        bounds = [f"{t.min}{'<' if t.min_open else '<='}x" if t.min is not None else "x"]
        if t.max is not None:
            bounds.append(f"{'<' if t.max_open else '<='}{t.max}")
        return ("INTEGER" if isinstance(t, click.IntRange) else "FLOAT") + " " + "".join(bounds)
    return t.name.upper()


def _unset(value: object) -> bool:
    """No default: None, (), a callable, or click's own UNSET sentinel (click 8.2)."""
    return value is None or value == () or callable(value) or type(value).__name__ == "Sentinel"


def _default(param: click.Option) -> str:
    if param.is_flag or _unset(param.default):
        return ""
    return f"`{param.default}`"


def _options(cmd: click.Command) -> list[str]:
    rows = []
    for p in cmd.params:
        if not isinstance(p, click.Option) or p.hidden:
            continue
        names = ", ".join(f"`{o}`" for o in p.opts + p.secondary_opts)
        extra = []
        if p.multiple:
            extra.append("repeatable")
        if isinstance(p.envvar, str) and p.envvar not in (p.help or ""):
            extra.append(f"env `{p.envvar}`")
        help_text = _cell(p.help or "") + (f" ({'; '.join(extra)})" if extra else "")
        rows.append(f"| {names} | {_type(p)} | {_default(p)} | {help_text} |")
    if not rows:
        return []
    return ["| option | value | default | what it does |", "|---|---|---|---|", *rows, ""]


def _usage(path: str, cmd: click.Command) -> str:
    args = " ".join(
        f"[{p.human_readable_name.upper()}]..." if p.nargs == -1 else p.human_readable_name.upper()
        for p in cmd.params
        if isinstance(p, click.Argument)
    )
    return " ".join(part for part in (path, "[OPTIONS]" if _options(cmd) else "", args) if part)


def _command(path: str, cmd: click.Command, out: list[str]) -> None:
    if getattr(cmd, "hidden", False):
        return
    if isinstance(cmd, click.Group):
        if path != "cdc":
            out += [f"## `{path}`", "", inspect.cleandoc(cmd.help or ""), ""]
        for name in sorted(cmd.commands):
            _command(f"{path} {name}", cmd.commands[name], out)
        return
    out += [f"## `{path}`", "", f"```\n{_usage(path, cmd)}\n```", "", inspect.cleandoc(cmd.help or ""), ""]
    out += _options(cmd)


def cli_page() -> str:
    from pipelines.cli import cli

    out = [
        header("the click commands of pipelines/cli/").rstrip("\n"),
        "",
        "# Command line reference",
        "",
        inspect.cleandoc(cli.help or ""),
        "",
        "Every command takes `-h`/`--help`; `cdc --version` prints the version and the formats it reads and writes.",
        "",
    ]
    _command("cdc", cli, out)
    return "\n".join(out).rstrip("\n") + "\n"
