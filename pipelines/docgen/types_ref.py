"""docs/reference/types.md from cdc/typetable.py, each example's output computed by cdc.typemap."""

from __future__ import annotations

import orjson

from pipelines.docgen.common import header


def _example(ex) -> str:
    from cdc.typemap import to_json_value

    out = orjson.dumps(to_json_value(ex.type, ex.text, ex.typmod)).decode()
    shown = f"`{ex.text}` → `{out}`".replace("|", "\\|")
    return f"{ex.note}: {shown}" if ex.note else shown


def types_page() -> str:
    from cdc.typetable import DETAILS, INTRO, MAPPING

    out = [
        header("cdc/typetable.py (examples computed by cdc/typemap.py)").rstrip("\n"),
        "",
        "# Value types in the change event envelope",
        "",
        INTRO,
        "| PostgreSQL type | envelope JSON | example |",
        "|---|---|---|",
    ]
    for row in MAPPING:
        out.append(f"| {row.types} | {row.json} | {', '.join(_example(e) for e in row.examples)} |")
    out += ["", "## Details", "", DETAILS]
    return "\n".join(out).rstrip("\n") + "\n"
