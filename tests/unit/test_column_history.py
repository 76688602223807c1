"""Column identity across schema versions (cdc.log.history) and attnums of Relation messages (cdc.schema)."""

from __future__ import annotations

import pytest

from cdc.log.base import Column, TableSchema
from cdc.log.history import followed_schema
from cdc.schema import match_attnums

pytestmark = pytest.mark.unit

INT, TEXT = 23, 25


def schema(*cols: tuple[str, int, int]) -> TableSchema:
    return TableSchema(tuple(Column(n, o, -1, attnum=a) for n, o, a in cols), ("id",), {INT: {}, TEXT: {}})


V1 = schema(("id", INT, 1), ("note", TEXT, 2), ("n", INT, 3))


def test_relation_before_a_rename_read_after_it() -> None:
    """The stream reads the pre-rename Relation after the rename: the log's previous version knows the name."""
    catalog = [(1, "id", False), (2, "remark", False), (3, "n", False)]
    assert match_attnums(["id", "note", "n"], V1, catalog) == [1, 2, 3]
    assert match_attnums(["id", "remark", "n"], V1, catalog) == [1, 2, 3]


def test_rename_then_new_column_of_the_old_name() -> None:
    catalog = [(1, "id", False), (2, "remark", False), (3, "n", False), (4, "note", False)]
    assert match_attnums(["id", "remark", "n", "note"], V1, catalog) == [1, 2, 3, 4]


def test_drop_and_add_is_not_a_rename() -> None:
    catalog = [
        (1, "id", False),
        (2, "........pg.dropped.2........", True),
        (3, "n", False),
        (4, "remark", False),
    ]
    assert match_attnums(["id", "n", "remark"], V1, catalog) == [1, 3, 4]


def test_renamed_twice_before_the_stream_read_it() -> None:
    """Neither name of the middle version is known any more: the order leaves one attnum for it."""
    catalog = [(1, "id", False), (2, "memo", False), (3, "n", False)]
    assert match_attnums(["id", "remark", "n"], V1, catalog) == [1, 2, 3]
    assert match_attnums(["id", "remark"], None, [(1, "id", False), (2, "memo", False), (3, "x", False)]) == [
        1,
        0,
    ]


def test_followed_schema_renames_and_retired_columns() -> None:
    v2 = schema(("id", INT, 1), ("remark", TEXT, 2), ("n", INT, 3))
    v3 = schema(("id", INT, 1), ("remark", TEXT, 2))
    history = [(1, 100, V1), (2, 200, v2), (3, 300, v3)]
    everything = followed_schema(history)
    assert everything.schema.column_names == ["id", "remark", "n"]
    assert everything.retired == {"n"}
    assert everything.renames == {"remark": ("note",)}
    assert everything.layout(V1) == [0, 1, 2]
    assert everything.layout(v3) == [0, 1, -2]
    # A follower past the drop does not get the dropped column back.
    assert followed_schema(history, 350).schema.column_names == ["id", "remark"]
    assert followed_schema(history, 250).retired == {"n"}


def test_versions_without_attnums_match_by_name() -> None:
    old = TableSchema((Column("id", INT, -1), Column("note", TEXT, -1)), ("id",), {INT: {}, TEXT: {}})
    new = schema(("id", INT, 1), ("note", TEXT, 2), ("x", INT, 3))
    followed = followed_schema([(1, 10, old), (2, 20, new)])
    assert followed.layout(old) == [0, 1, -1]
    assert followed.renames == {}
