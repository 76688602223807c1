"""Commands printed in `fix:` lines. The pipeline file as the user gave it is known only to the
caller (Pipeline.command in cdc/ground/config.py); layers below take that method as a callable
so their remedies run as printed, without importing upwards."""

from __future__ import annotations

from collections.abc import Callable

# command("snapshot", "--tables", "public.t") -> "cdc snapshot <pipeline file> --tables public.t"
Command = Callable[..., str]


def placeholder(verb: str, *args: str) -> str:
    """For callers without a pipeline file (library use, unit tests): a literal PIPELINE."""
    return " ".join(["cdc", verb, "PIPELINE", *args])
