"""Redis key names of the cache follower: row keys from the `key` template, and our own keys.

* Row key: the template with `{schema}`, `{table}` and `{pk}` filled in (default
  `{schema}.{table}:{pk}`). `{pk}` is the key columns' values joined by `:`; each value is
  Spark's string cast of the typed value (`42`, `2024-01-31`, `2024-01-31 10:00:00` in UTC,
  `1.50`, the text itself; bytea as base64), with `\\` and `:` escaped by a backslash so two
  rows never share a key (`a:b` -> `a\\:b`). The encoding is unambiguous: inside `{pk}` a
  backslash is always followed by the character it escapes, and every unescaped `:` separates
  two key values, so reading left to right gives back the values (`split_pk`): `('1:1', 'x')`
  is `1\\:1:x` and `('1', '1:x')` is `1:1\\:x`. Key columns are never NULL (primary key,
  replica identity index or unique index on NOT NULL columns), so no NULL marker is needed.
  The same expression is used when writing and when `cdc verify` reads the cache back (which
  reads the row from the value, not the key).
* A table renamed by the sink's table_options (`rename: people`) has the keys `people:{pk}`.
* A table's keys are found with SCAN MATCH `<prefix>*<suffix>` (the literal parts of the
  template, glob-escaped). Two tables of one sink must not be able to share a key: templates
  whose table patterns overlap are refused before anything is written.
* Our own keys start with `__cdc:` (a template must not): `__cdc:d:<row key>` the tombstone
  of a deleted row, `__cdc:t:<table pattern>` the table's truncate position, `__cdc:s:<table
  pattern>` the columns whose fast defaults were filled into cached rows, `__cdc:m:<table
  pattern>` the follower's marker (sinks/marker.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyspark.sql import Column as SparkColumn
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.errors import SinkError
from cdc.ground.tables import TableName
from cdc.ground.tables import spark_ident as q

DEFAULT_TEMPLATE = "{schema}.{table}:{pk}"
INTERNAL = "__cdc:"
TOMBSTONE = INTERNAL + "d:"
TRUNCATED = INTERNAL + "t:"
DEFAULTS = INTERNAL + "s:"
MARKER = INTERNAL + "m:"
FENCE = INTERNAL + "f:"  # + the follower's app id: its current cut's fence (sinks/cache/sink.py)
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def glob_escape(text: str) -> str:
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def split_pk(text: str) -> list[str]:
    """The key values' texts from the `{pk}` part of a row key: split at unescaped `:`, unescape."""
    values: list[str] = []
    current: list[str] = []
    chars = iter(text)
    for c in chars:
        if c == "\\":
            current.append(next(chars, "\\"))  # the escaped character (a lone trailing `\` kept)
        elif c == ":":
            values.append("".join(current))
            current = []
        else:
            current.append(c)
    values.append("".join(current))
    return values


@dataclass(frozen=True)
class TableKeys:
    table: TableName
    prefix: str  # literal text before {pk}
    suffix: str  # literal text after {pk}

    @property
    def pattern(self) -> str:
        """SCAN MATCH pattern of every row key of the table."""
        return glob_escape(self.prefix) + "*" + glob_escape(self.suffix)

    @property
    def truncate_key(self) -> str:
        return TRUNCATED + self.pattern

    @property
    def defaults_key(self) -> str:
        return DEFAULTS + self.pattern

    @property
    def marker_key(self) -> str:
        """The follower's marker for the table (sinks/marker.py)."""
        return MARKER + self.pattern

    def row_key(self, pk_texts: list[str]) -> str:
        """The key of one row from its key values' texts (as Spark prints them); for tests and tools."""
        return self.prefix + ":".join(re.sub(r"([\\:])", r"\\\1", t) for t in pk_texts) + self.suffix

    def pk_of(self, key: str) -> list[str]:
        """The key values' texts of one row key of this table (the inverse of `row_key`)."""
        if not (key.startswith(self.prefix) and key.endswith(self.suffix)):
            raise ValueError(f"{key!r} is not a row key of {self.table}")
        return split_pk(key[len(self.prefix) : len(key) - len(self.suffix)])

    def key_column(self, schema: T.StructType, key_columns: tuple[str, ...]) -> SparkColumn:
        """The row key as a Spark expression over the typed key columns."""
        parts = []
        for name in key_columns:
            col = F.col(q(name))
            text = (
                F.base64(col) if isinstance(schema[name].dataType, T.BinaryType) else col.cast(T.StringType())
            )
            parts.append(
                F.regexp_replace(text, r"([\\:])", r"\\$1")
            )  # Java replacement: `\\` is one backslash
        return F.concat(F.lit(self.prefix), F.concat_ws(":", *parts), F.lit(self.suffix))

    def overlaps(self, other: TableKeys) -> bool:
        """Could one key match both tables' patterns?"""
        pre = self.prefix.startswith(other.prefix) or other.prefix.startswith(self.prefix)
        suf = self.suffix.endswith(other.suffix) or other.suffix.endswith(self.suffix)
        return pre and suf


class KeyTemplate:
    def __init__(self, template: str | None, sink: str, renames: dict[TableName, str] | None = None):
        self.text = template or DEFAULT_TEMPLATE
        self.sink = sink
        # table_options rename: that table's keys are `<rename>:<pk>` whatever the template says
        self.renames = renames or {}
        unknown = sorted({m for m in _PLACEHOLDER.findall(self.text) if m not in ("schema", "table", "pk")})
        if unknown or self.text.count("{pk}") != 1:
            problem = (
                f"unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}"
                if unknown
                else "it must contain {pk} exactly once"
            )
            raise SinkError(
                f"sink {sink}: redis key template {self.text!r}: {problem}",
                'use {schema}, {table} and {pk} (once), e.g. key: "{schema}.{table}:{pk}"',
            )

    def for_table(self, table: TableName) -> TableKeys:
        if table in self.renames:
            return TableKeys(table, self.renames[table] + ":", "")
        prefix, suffix = self.text.split("{pk}")
        fill = lambda s: s.replace("{schema}", table.schema).replace("{table}", table.name)  # noqa: E731
        keys = TableKeys(table, fill(prefix), fill(suffix))
        if keys.prefix.startswith(INTERNAL):
            raise SinkError(
                f"sink {self.sink}: redis keys of {table} would start with {INTERNAL!r}, which the follower keeps for itself",
                "change the `key` template of the sink",
            )
        return keys

    def check_distinct(self, tables: list[TableName]) -> list[TableKeys]:
        """Every table's keys, refusing templates under which two tables could share a key."""
        keys = [self.for_table(t) for t in tables]
        for i, a in enumerate(keys):
            for b in keys[i + 1 :]:
                if a.overlaps(b):
                    raise SinkError(
                        f"sink {self.sink}: with the key template {self.text!r}, keys of {a.table} ({a.pattern}) and "
                        f"{b.table} ({b.pattern}) can be the same",
                        'put {schema} and {table} in the `key` template, separated from {pk}, e.g. "{schema}.{table}:{pk}"',
                    )
        return keys
