"""A table's schema versions seen as one history of columns, for followers.

A column is the same column across versions when its attnum is (a rename keeps the attnum, a
drop + add does not); versions written before attnums were recorded match by name. From that:

* the columns a follower gets for a batch: the newest schema's, plus columns dropped by a
  version the batch spans ("retired": the follower keeps them, with the last value the source
  had; events written after the drop leave them as they are);
* per version, where each of those columns sits in it (a row written before a rename carries
  the value under the old name);
* per column, the older names it had in those versions, newest first, so a follower can rename
  its column;
* per fast-default column of the newest version, the LSN it appeared at (rows last written
  before that hold the default without any event saying so).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from cdc.log.base import Column, TableSchema

# (version, since LSN, schema), oldest first: what LocalLog.schema_history returns.
History = Sequence[tuple[int, int, TableSchema]]


def same_column(a: Column, b: Column) -> bool:
    if a.attnum and b.attnum:
        return a.attnum == b.attnum
    return a.name == b.name


def position_in(schema: TableSchema, column: Column) -> int:
    """Index of `column` in `schema`'s columns, -1 when that version does not have it."""
    return next((i for i, c in enumerate(schema.columns) if same_column(c, column)), -1)


@dataclass(frozen=True)
class FollowedSchema:
    schema: TableSchema  # the newest columns, then retired ones
    retired: frozenset[str] = frozenset()
    renames: dict[str, tuple[str, ...]] = field(default_factory=dict)  # column -> older names, newest first

    def layout(self, version_schema: TableSchema) -> list[int]:
        """For rows written under `version_schema`: the index of each followed column in it, -1 when
        absent (a column added later: its fast default or NULL), -2 for a retired column the version
        no longer has (the follower keeps its value)."""
        out = []
        for c in self.schema.columns:
            i = position_in(version_schema, c)
            out.append(-2 if i < 0 and c.name in self.retired else i)
        return out


def followed_schema(history: History, from_lsn: int | None = None) -> FollowedSchema:
    """The columns to apply events after `from_lsn` with (None: the whole history)."""
    if not history:
        raise ValueError("no schema versions")
    newest = history[-1][2]
    spanned = [
        schema
        for i, (_v, _since, schema) in enumerate(history)
        if from_lsn is None or i == len(history) - 1 or history[i + 1][1] > from_lsn
    ]
    columns = list(newest.columns)
    types = dict(newest.types)
    retired: list[str] = []
    for schema in reversed(spanned):  # newest first: a retired column keeps its last name
        for c in schema.columns:
            if any(same_column(c, have) for have in columns) or any(c.name == have.name for have in columns):
                continue
            columns.append(dataclasses.replace(c, missing=None))
            types.setdefault(c.type_oid, schema.types[c.type_oid])
            retired.append(c.name)
    # Renames within the span only: a follower that has applied up to `from_lsn` already renamed
    # for older ones (and a cache or search follower need not scan its rows for them again).
    renames: dict[str, tuple[str, ...]] = {}
    for c in columns:
        older: list[str] = []
        for schema in reversed(spanned):
            i = position_in(schema, c)
            if i >= 0 and schema.columns[i].name != c.name and schema.columns[i].name not in older:
                older.append(schema.columns[i].name)
        if older:
            renames[c.name] = tuple(older)
    return FollowedSchema(
        dataclasses.replace(newest, columns=tuple(columns), types=types), frozenset(retired), renames
    )


def column_defaults(history: Sequence[tuple[int, TableSchema]]) -> dict[str, tuple[int, str]]:
    """From (since LSN, schema) versions, oldest first: fast-default columns of the newest schema
    -> (LSN the column appeared at, default text)."""
    if not history:
        return {}
    out = {}
    for col in history[-1][1].columns:
        if col.missing is None:
            continue
        # The newest unbroken run of versions that have the column tells when it was added.
        since = history[-1][0]
        for lsn, schema in reversed(history):
            if position_in(schema, col) < 0:  # by attnum: a rename does not make the column new
                break
            since = lsn
        out[col.name] = (since, col.missing)
    return out
