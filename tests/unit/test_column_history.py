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


def test_renamed_again_while_columns_around_it_were_dropped() -> None:
    """v renamed to v10 (then v20) and c9 dropped before the stream read the message: many dropped
    attnums leave the order ambiguous, but attnum 2 is live now, so the previous version's v was
    renamed, and the message has exactly one name no one knows (c10 is the previous version's)."""
    previous = schema(("id", INT, 1), ("v", TEXT, 2), ("c9", INT, 0), ("c10", INT, 0))
    dropped = [(n, f"........pg.dropped.{n}........", True) for n in range(3, 22)]
    catalog = [(1, "id", False), (2, "v20", False), *dropped, (22, "c20", False)]
    assert match_attnums(["id", "v10", "c10"], previous, catalog) == [1, 2, 0]


def test_a_renamed_column_is_not_guessed_when_a_new_one_could_be_it() -> None:
    """note renamed to remark (now memo), n dropped, x added and dropped since: two unknown names for
    one live column of the previous version; which is the rename the order does not tell."""
    dropped = [(3, "........pg.dropped.3........", True), (4, "........pg.dropped.4........", True)]
    catalog = [(1, "id", False), (2, "memo", False), *dropped]
    assert match_attnums(["id", "remark", "x"], V1, catalog) == [1, 0, 0]


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


def test_verify_matches_the_followers_columns_by_attnum() -> None:
    """`cdc verify`: a follower at the version it applied last has `note` (attnum 2); the source
    renamed it, added `tier` and dropped `n`. What the follower has by another name or not at all,
    and the LSN of the log's version that brings it (None: the log has not got it)."""
    from pipelines.verify_position import follower_columns

    renamed = schema(("id", INT, 1), ("remark", TEXT, 2), ("n", INT, 3))
    added = schema(("id", INT, 1), ("remark", TEXT, 2), ("tier", TEXT, 4))
    history = [(1, 100, V1), (2, 200, renamed), (3, 300, added)]
    source = added.columns
    # the log has both (the rename at 200, the new column at 300); the follower applied up to 150
    assert follower_columns(history, 150, source) == {"remark": ("note", 200), "tier": (None, 300)}
    assert follower_columns(history, 250, source) == {"tier": (None, 300)}
    assert follower_columns(history, 300, source) == {}
    # the log lacks both: the source's columns with their catalog attnums
    assert follower_columns(history[:1], 150, source) == {"remark": ("note", None), "tier": (None, None)}
    # renamed twice in the log (note -> remark -> memo): the first version that renames it
    memo = schema(("id", INT, 1), ("memo", TEXT, 2))
    assert follower_columns([*history[:2], (3, 300, memo)], 150, memo.columns) == {"memo": ("note", 200)}
    # a log without attnums matches by name: a renamed column is not recognised, as before
    plain = TableSchema(tuple(Column(c.name, c.type_oid, -1) for c in V1.columns), ("id",), V1.types)
    assert follower_columns([(1, 100, plain)], 150, (Column("remark", TEXT, -1),)) == {"remark": (None, None)}
