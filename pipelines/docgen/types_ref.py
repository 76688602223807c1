"""docs/reference/types.md from cdc/typetable.py, each example's output computed by cdc.typemap."""

from __future__ import annotations

import orjson

from pipelines.docgen.common import header


def _example(ex) -> str:
    from cdc.typemap import to_json_value

    out = orjson.dumps(to_json_value(ex.type, ex.text, ex.typmod)).decode()
    shown = f"`{ex.text}` → `{out}`".replace("|", "\\|")
    return f"{ex.note}: {shown}" if ex.note else shown


def _delta(row) -> str:
    """The Delta/Spark column type(s) the apply job gives the row's types (sinks/sparktypes.py)."""
    import re

    from cdc.typetable import base
    from sinks.sparktypes import scalar_type

    names = [n.strip() for n in row.types.split(",")]
    first = names[0].split(" ")[0]
    if first == "numeric":  # the column's typmod decides: shown for numeric(10,2) and unconstrained
        ten_two = scalar_type(base("numeric"), ((10 << 16) | 2) + 4).simpleString()
        plain = scalar_type(base("numeric"), -1).simpleString()
        return f"numeric(p,s) with p ≤ 38 and 0 ≤ s ≤ p: decimal(p,s) (`{ten_two}` for numeric(10,2)); otherwise `{plain}`"
    if first == "domains":
        return "as the base type"
    if first == "arrays":
        return "array of the element's type, nested per declared dimension (`int[][]`: `array<array<int>>`)"
    if all(re.fullmatch(r"[a-z0-9_]+", n) for n in names):
        cases = [(base(n), -1) for n in names]
    else:
        cases = [(e.type, e.typmod) for e in row.examples]
    shown: list[str] = []
    for t, typmod in cases:
        if t.kind == "array" and t.element is not None:
            name = f"array<{scalar_type(t.element, typmod).simpleString()}> (nested per declared dimension)"
        else:
            name = scalar_type(t, typmod).simpleString()
        if name not in shown:
            shown.append(name)
    return " / ".join(f"`{s}`" for s in shown)


def types_page() -> str:
    from cdc.typetable import DETAILS, INTRO, MAPPING

    out = [
        header("cdc/typetable.py (examples computed by cdc/typemap.py)").rstrip("\n"),
        "",
        "# Value types in the change event envelope",
        "",
        INTRO,
        "| PostgreSQL type | envelope JSON | example | Delta / Spark column |",
        "|---|---|---|---|",
    ]
    for row in MAPPING:
        out.append(
            f"| {row.types} | {row.json} | {', '.join(_example(e) for e in row.examples)} | {_delta(row)} |"
        )
    out += ["", "## Details", "", DETAILS]
    return "\n".join(out).rstrip("\n") + "\n"
