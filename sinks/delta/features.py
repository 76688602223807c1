"""Which Delta table features a follower table takes on, and when (README "Reading the lake").

A table feature a reader does not know makes the whole table unreadable to it, so tables are
created at the lowest protocol their data allows and take a feature on only when needed:

* column mapping (`delta.columnMapping.mode = name`): for a column name plain Delta cannot hold
  (one of ` ,;{}()\\n\\t=`), or on every new table with `column_mapping: name`. Without it a
  rename rewrites the table (sinks/delta/retype.py `rewrite_columns`); with it, metadata only.
* type widening (`delta.enableTypeWidening`): only with `on_type_change: widen`, at the first
  widening the source makes; `rewrite` rewrites the table with the new type instead.
* timestampNtz: Delta itself adds it for a `timestamp` (without time zone) column; every reader
  we test (Spark, delta-rs, Polars) reads it.

Tables created by earlier versions (both features on) keep them and keep working.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Characters Delta refuses in a column name unless the table uses column mapping.
UNSAFE_CHARS = frozenset(" ,;{}()\n\t=")

COLUMN_MAPPING = {
    "delta.columnMapping.mode": "name",
    "delta.minReaderVersion": "2",
    "delta.minWriterVersion": "5",
}
TYPE_WIDENING = {"delta.enableTypeWidening": "true"}

# Said in the apply output when a table takes a feature on: the readers it loses.
LOST_READERS = {
    "columnMapping": "delta-rs (the `deltalake` package) and what reads through it (Polars, pandas) "
    "cannot open the table any more; Spark (Delta Lake) can",
    "typeWidening": "delta-rs (the `deltalake` package) and what reads through it (Polars, pandas) "
    "cannot open the table any more, nor Spark with Delta Lake before 4.0 "
    "(on_type_change: rewrite keeps every reader)",
}


def unsafe_names(names: Iterable[str]) -> list[str]:
    """The column names a Delta table without column mapping cannot hold."""
    return [n for n in names if UNSAFE_CHARS.intersection(n)]


def has_column_mapping(properties: dict[str, Any]) -> bool:
    return properties.get("delta.columnMapping.mode", "none") != "none"


def has_type_widening(properties: dict[str, Any]) -> bool:
    return str(properties.get("delta.enableTypeWidening", "false")).lower() == "true"


def set_properties_sql(target: str, properties: dict[str, str]) -> str:
    pairs = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
    return f"ALTER TABLE {target} SET TBLPROPERTIES ({pairs})"
