"""Source-side column lists and row filters, the pure parts (cdc/filters.py, config table_options)."""

from __future__ import annotations

import pytest

from cdc.filters import (
    CaptureFilter,
    filter_problems,
    predicate_columns,
    predicate_shape_problem,
    publication_member,
    resolve_filter,
    select_query,
)
from cdc.ground.errors import PipelineFileError
from cdc.ground.source_config import SourceTableOptions
from cdc.ground.tables import TableName
from sinks.registry import parse_pipeline

pytestmark = pytest.mark.unit

T = TableName("public", "users")
COLS = ["id", "tenant_id", "email", "password_hash", "Note"]


def _pipeline(options: dict) -> dict:
    return {
        "name": "p",
        "source": {
            "postgres": {
                "dsn": "dbname=x",
                "tables": ["public.users", "public.orders"],
                "table_options": options,
            }
        },
    }


def test_table_options_parse_and_reject_typos() -> None:
    p = parse_pipeline(
        _pipeline({"public.users": {"exclude_columns": ["password_hash"], "where": "tenant_id = 7"}})
    )
    assert p.source.postgres.options_for(T) == SourceTableOptions(
        exclude_columns=["password_hash"], where="tenant_id = 7"
    )
    assert p.source.postgres.options_for(TableName("public", "orders")) is None
    with pytest.raises(PipelineFileError) as bad:
        parse_pipeline(_pipeline({"public.user": {"columns": ["id"]}}))
    assert "public.user is not among `tables` (did you mean 'public.users'?)" in bad.value.problem
    with pytest.raises(PipelineFileError) as both:
        parse_pipeline(_pipeline({"public.users": {"columns": ["id"], "exclude_columns": ["email"]}}))
    assert "give `columns` or `exclude_columns`, not both" in both.value.problem


def test_resolve_keeps_table_order() -> None:
    assert resolve_filter(T, None, COLS) == CaptureFilter(T)
    picked = resolve_filter(T, SourceTableOptions(columns=["email", "id"]), COLS)
    assert picked.columns == ("id", "email") and picked.where is None
    dropped = resolve_filter(
        T, SourceTableOptions(exclude_columns=["password_hash"], where="tenant_id = 7"), COLS
    )
    assert dropped.columns == ("id", "tenant_id", "email", "Note") and dropped.where == "tenant_id = 7"
    assert dropped.keeps("email") and not dropped.keeps("password_hash")


def test_predicate_columns_skip_literals_and_fold_case() -> None:
    text = """TENANT_ID = 7 AND lower(email) <> 'id = 1' AND "Note" IS NOT NULL AND note = 'it''s'"""
    assert predicate_columns(text, COLS) == ["tenant_id", "email", "Note"]


@pytest.mark.parametrize(
    ("predicate", "why"),
    [
        ("id = 1; DROP TABLE x", "';'"),
        ("(id = 1", "'(' without"),
        ("id = 1)", "')' without"),
        ("id = 'x", "unterminated quote"),
        ("id = $$x$$", "dollar-quoted"),
    ],
)
def test_predicate_shape(predicate: str, why: str) -> None:
    assert why in (predicate_shape_problem(predicate) or "")
    assert predicate_shape_problem("id IN (1, 2) AND tenant_id = ';'") is None


def test_rules_name_table_column_and_rule() -> None:
    def problems(
        options: SourceTableOptions, ri: str = "d", identity: tuple[str, ...] = ("id",)
    ) -> list[str]:
        return [
            what + " | " + fix for what, fix in filter_problems(T, options, COLS, ["full_name"], ri, identity)
        ]

    assert problems(SourceTableOptions(exclude_columns=["password_hash"], where="id > 10")) == []
    [typo] = problems(SourceTableOptions(columns=["id", "emial"]))
    assert "table public.users has no column 'emial' (did you mean 'email'?)" in typo and "rule:" in typo
    [gen] = problems(SourceTableOptions(exclude_columns=["full_name"]))
    assert "full_name of table public.users is a generated column" in gen
    [key] = problems(SourceTableOptions(exclude_columns=["id"]))
    assert "column id of table public.users is a key (replica identity) column and cannot be left out" in key
    assert "remove it from source.postgres.table_options.public.users.exclude_columns" in key
    [listed] = problems(SourceTableOptions(columns=["email"]))
    assert "add it to source.postgres.table_options.public.users.columns" in listed
    [where] = problems(SourceTableOptions(where="tenant_id = 7"))
    assert (
        "row filter of table public.users uses column tenant_id, which is not part of its replica identity (id)"
        in where
    )
    assert "may use replica identity columns only" in where
    assert problems(SourceTableOptions(where="tenant_id = 7"), "f", tuple(COLS)) == []
    [full] = problems(SourceTableOptions(exclude_columns=["email"]), "f", tuple(COLS))
    assert "REPLICA IDENTITY FULL" in full and "left out: email" in full


def test_sql_shapes() -> None:
    from psycopg2 import sql

    f = CaptureFilter(T, ("id", "Note"), "tenant_id = 7")
    member = publication_member(f)
    parts = [type(p).__name__ for p in member.seq]
    assert parts == ["Identifier", "Composed", "Composed"]
    query = select_query(T, ["id"], "id > 1", [sql.SQL("ctid >= '(0,0)'::tid")])
    assert "AND" in repr(query) and "id > 1" in repr(query)
    assert "WHERE" not in repr(select_query(T, ["id"]))
