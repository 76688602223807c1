"""`cdc validate` resolves a view's columns without Spark (pipelines/views/namecheck.py): the output
names when sqlglot resolves every column, None (Spark decides) for anything it cannot be sure of."""

from __future__ import annotations

import pytest

from cdc.ground.config import ViewConfig
from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName
from pipelines.views.namecheck import check_names, output_names
from pipelines.views.sql import analyse

pytestmark = pytest.mark.unit

ORD, CUS = TableName("public", "orders"), TableName("public", "customers")
ODD = TableName("Sales", "Order Items")
COLUMNS = {ORD: ["id", "customer_id", "total"], CUS: ["id", "name"], ODD: ["id", "Qty"]}


def names(sql: str, key: list[str] | None = None) -> list[str] | None:
    plan = analyse(ViewConfig(name="v", sql=sql, key=key or ["id"]), list(COLUMNS), COLUMNS)
    return output_names(plan, COLUMNS)


def test_resolved_views_give_their_output_names() -> None:
    assert names(
        "SELECT o.id, o.total, c.name AS customer FROM public.orders o JOIN public.customers c ON c.id = o.customer_id"
    ) == ["id", "total", "customer"]
    assert names("SELECT * FROM public.orders") == ["id", "customer_id", "total"]
    assert names(
        "SELECT customer_id, sum(total) AS n FROM public.orders GROUP BY customer_id", ["customer_id"]
    ) == ["customer_id", "n"]
    assert names("SELECT id, `Qty` AS qty FROM `Sales`.`Order Items`") == ["id", "qty"]


@pytest.mark.parametrize(
    ("sql", "key"),
    [
        (
            "SELECT customer_id, sum(amount) AS n FROM public.orders GROUP BY customer_id",
            ["customer_id"],
        ),  # no such column
        ("SELECT id, count(1) FROM public.orders GROUP BY id", ["id"]),  # unnamed: Spark names it
    ],
)
def test_what_sqlglot_cannot_be_sure_of_goes_to_spark(sql: str, key: list[str]) -> None:
    assert names(sql, key) is None


def test_check_names() -> None:
    plan = analyse(
        ViewConfig(name="v", sql="SELECT id FROM public.orders", key=["id"]), list(COLUMNS), COLUMNS
    )
    check_names(plan, ["id", "n"])
    with pytest.raises(UsageError, match="outputs the column N twice"):
        check_names(plan, ["id", "n", "N"])
    with pytest.raises(UsageError, match="no plain name"):
        check_names(plan, ["id", "count(1)"])
    with pytest.raises(UsageError, match="key column 'id' is not a column"):
        check_names(plan, ["n"])
