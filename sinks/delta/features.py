"""Which Delta table features a follower table takes on, and when (docs/reading-the-lake.md).

A table feature a reader does not know makes the whole table unreadable to it, so tables are
created at the lowest protocol their data allows and take a feature on only when needed:

* column mapping (`delta.columnMapping.mode = name`): only on every new table of a sink with
  `column_mapping: name`. A column name plain Delta cannot hold is stored encoded instead
  (sinks/delta/names.py), and a rename rewrites the table (sinks/delta/retype.py
  `rewrite_columns`); with column mapping a rename is metadata only. A table with column mapping
  lists its reader features (reader version 3, `delta.feature.timestampNtz = supported` forces
  it): with Delta's legacy reader version 2 instead, delta-rs 1.6's Arrow path opened such a
  table and read NULL for every column whose physical name differs from its name; with the
  list it refuses the table (measured, README). Tables made by earlier versions with reader
  version 2 get the list at their next apply (`LIST_READER_FEATURES`).
* type widening (`delta.enableTypeWidening`): only with `on_type_change: widen`, at the first
  widening the source makes; `rewrite` rewrites the table with the new type instead.
* timestampNtz: Delta itself adds it for a `timestamp` (without time zone) column; every reader
  we test (Spark, delta-rs, Polars) reads it.

Tables created by earlier versions (both features on) keep them and keep working.
"""

from __future__ import annotations

from typing import Any

# Reader version 3 with an explicit reader-feature list: Delta writes the legacy reader version 2
# for column mapping alone, which delta-rs's Arrow path does not check. timestampNtz is a feature
# every reader of version 3 knows, and it changes nothing in a table without such a column.
LIST_READER_FEATURES = {"delta.feature.timestampNtz": "supported"}
COLUMN_MAPPING = {"delta.columnMapping.mode": "name"} | LIST_READER_FEATURES
TYPE_WIDENING = {"delta.enableTypeWidening": "true"}

# Said in the apply output when a table takes a feature on: the readers it loses.
LOST_READERS = {
    "columnMapping": "delta-rs's Arrow reader (`DeltaTable.to_pyarrow_table()`, `to_pyarrow_dataset()`, "
    "`to_pandas()`) and Polars refuse the table; delta-rs's DataFusion readers (`QueryBuilder`, "
    "`DeltaTable.scan()`) and Spark read it; a reader that ignores column mapping reads NULL for renamed "
    "and added columns",
    "typeWidening": "delta-rs (the `deltalake` package) and what reads through it (Polars, pandas) "
    "cannot open the table any more, nor Spark with Delta Lake before 4.0 "
    "(on_type_change: rewrite keeps every reader)",
}


def has_column_mapping(properties: dict[str, Any]) -> bool:
    return properties.get("delta.columnMapping.mode", "none") != "none"


def has_type_widening(properties: dict[str, Any]) -> bool:
    return str(properties.get("delta.enableTypeWidening", "false")).lower() == "true"


def set_properties_sql(target: str, properties: dict[str, str]) -> str:
    pairs = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
    return f"ALTER TABLE {target} SET TBLPROPERTIES ({pairs})"
