"""Where a source table's Delta table lives: <path>/<schema>/<table>, or <path>/<rename> when the
sink's table_options rename it (tantivy indexes use the same layout).

Names are used as they are (capitals, spaces, unicode) except characters a Hadoop path cannot
carry, which become _xHH_ ('/', '\\', ':', '%', control characters).
"""

from __future__ import annotations

import re
from pathlib import Path

from cdc.ground.tables import TableName

_UNSAFE = re.compile(r"[/\\:%\x00-\x1f\x7f]|^\.{1,2}$")


def path_component(name: str) -> str:
    return _UNSAFE.sub(lambda m: "".join(f"_x{ord(c):02x}_" for c in m.group(0)), name)


def table_path(base: Path, table: TableName, rename: str | None = None) -> Path:
    if rename:  # checked by the pipeline file: [a-z0-9][a-z0-9_.-]*, never a followed schema's name
        return base / rename
    return base / path_component(table.schema) / path_component(table.name)
