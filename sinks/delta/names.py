"""Column names of Delta follower tables (docs/reading-the-lake.md, column names).

Plain Delta (no column mapping) cannot hold ` ,;{}()=`, tab or newline in a column name. Column
mapping can, but readers without it mis-read such tables: delta-rs 1.6's Arrow path returned
NULL for every column whose physical name differs from its logical one. So by
default a follower table has no column mapping and such a name is stored *encoded*: each of those
characters becomes `_xHHHH_` (its code point in 4 upper-case hex digits, as XML's EncodeName
writes it; `unit price` -> `unit_x0020_price`), and the column's comment keeps the source name
(`pgcdc source column: "unit price"`, the name as a JSON string). Names without such characters
are stored as they are. Two source columns whose stored names are equal (ignoring case, as
Spark does), or a stored name a table column of another source column already has, is an error
naming both (`collision`), never a shared column.

A table with column mapping (`column_mapping: name`, or made by an earlier version) stores every
new name as it is (`ColumnNames(mapped=True)`). A source column the table has already is found by
its source name first (`existing`), whichever way it was stored.

Readers through the sink (`cdc verify`, the view stage) get source names back with `decoded`;
the stored names are what every other reader (Spark SQL, delta-rs, Polars, `cdc sql`) sees.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc.ground.errors import SinkError
from cdc.ground.tables import spark_ident as q

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql import types as T

# Characters Delta refuses in a column name unless the table uses column mapping.
UNSAFE_CHARS = frozenset(" ,;{}()\n\t=")
COMMENT_PREFIX = "pgcdc source column: "


def encode(name: str) -> str:
    """The stored name of a source column on a table without column mapping."""
    if not UNSAFE_CHARS.intersection(name):
        return name
    return "".join(f"_x{ord(c):04X}_" if c in UNSAFE_CHARS else c for c in name)


def comment_for(source: str) -> str:
    return COMMENT_PREFIX + json.dumps(source, ensure_ascii=False)


def source_name(stored: str, metadata: Mapping[str, Any] | None) -> str:
    """The source name of a stored column: from its comment when the comment is ours and the
    stored name is that name encoded (a comment copied onto another column does not count)."""
    comment = (metadata or {}).get("comment")
    if isinstance(comment, str) and comment.startswith(COMMENT_PREFIX):
        try:
            source = json.loads(comment[len(COMMENT_PREFIX) :])
        except ValueError:
            return stored
        if isinstance(source, str) and encode(source) == stored:
            return source
    return stored


def source_names(schema: T.StructType) -> dict[str, str]:
    """Stored name -> source name of every column of a Delta table's schema."""
    return {f.name: source_name(f.name, f.metadata) for f in schema.fields}


def decoded(df: DataFrame) -> DataFrame:
    """The table's rows with its columns under their source names (unchanged if none is encoded)."""
    from pyspark.sql import functions as F

    names = source_names(df.schema)
    if all(s == n for n, s in names.items()):
        return df
    return df.select(*(F.col(q(n)).alias(s) for n, s in names.items()))


@dataclass(frozen=True)
class ColumnNames:
    """How one Delta table stores source column names."""

    mapped: bool  # column mapping: every new name as it is
    existing: Mapping[str, str] = field(default_factory=dict)  # source name -> the table's stored name

    @classmethod
    def of_table(cls, mapped: bool, schema: T.StructType | None) -> ColumnNames:
        have = source_names(schema) if schema is not None else {}
        return cls(mapped, {source: stored for stored, source in have.items()})

    def stored(self, source: str) -> str:
        found = self.existing.get(source)
        if found is not None:
            return found
        return source if self.mapped else encode(source)

    def metadata(self, source: str) -> dict[str, str]:
        """The stored column's metadata: the comment naming its source when the name is encoded."""
        return {"comment": comment_for(source)} if self.stored(source) != source else {}

    def check(self, table: str, path: str, sources: Iterable[str], have: Mapping[str, str]) -> None:
        """Refuse two source columns stored under one name, or a stored name the table has for
        another source column (`have`: stored -> source name of the table's columns)."""
        seen: dict[str, str] = {}
        for s in sources:
            seen.setdefault(self.stored(s).casefold(), s)
            other = seen[self.stored(s).casefold()]
            if other != s:
                raise collision(table, path, s, other, self.stored(s), "source column")
        by_fold = {stored.casefold(): (stored, src) for stored, src in have.items()}
        for s in sources:
            hit = by_fold.get(self.stored(s).casefold())
            if hit is not None and hit[1] != s:
                raise collision(table, path, s, hit[1], hit[0], "Delta table's column for source column")


def collision(table: str, path: str, name: str, other: str, stored: str, what: str) -> SinkError:
    return SinkError(
        f"Delta table {path} ({table}): source column {name!r} would be stored as {stored!r}, "
        f"the name of the {what} {other!r} (docs/reading-the-lake.md: column names)",
        f"rename one of the two columns in the source (ALTER TABLE {table} RENAME COLUMN ...), or, if "
        f"{other!r} is a column the source dropped, drop it from the Delta table (docs/schema-changes.md, "
        "DROP COLUMN) or move the table away so it is rebuilt from the log",
    )
