"""Where a source table's Delta table lives: <path>/<schema>/<table>.

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


def table_path(base: Path, table: TableName) -> Path:
    return base / path_component(table.schema) / path_component(table.name)
