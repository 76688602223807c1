"""pipelines/views/sql.py: what a derived view reads, where its key comes from, whether it can be
maintained incrementally (and if not, the construct named), the rewrites the view stage runs, and
the errors (exit 2, naming the view) for views that cannot work. Pure sqlglot: no Spark."""

from __future__ import annotations

import pytest

from cdc.ground.config import ViewConfig
from cdc.ground.errors import ExitCode, UsageError
from cdc.ground.tables import TableName
from pipelines.views.plan import ViewPlan
from pipelines.views.sql import analyse

pytestmark = pytest.mark.unit

ORD, CUS, ITM = TableName("public", "orders"), TableName("public", "customers"), TableName("public", "items")
EMP = TableName("hr", "employees")
CAPTURED = [ORD, CUS, ITM, EMP]
COLUMNS = {
    ORD: ["id", "customer_id", "total", "status"],
    CUS: ["id", "name", "email", "region"],
    ITM: ["id", "order_id", "title", "qty"],
    EMP: ["id", "manager_id", "name"],
}
SOURCES = {ORD: "s_o", CUS: "s_c", ITM: "s_i", EMP: "s_e"}


def plan(sql: str, key: list[str], columns: dict | None = None) -> ViewPlan:
    return analyse(ViewConfig(name="v", sql=sql, key=key), CAPTURED, columns)


def refused(sql: str, key: list[str], columns: dict | None = None) -> UsageError:
    with pytest.raises(UsageError) as info:
        plan(sql, key, columns)
    error = info.value
    assert error.exit_code == ExitCode.USAGE
    assert str(error).startswith("view v: ") and error.fix, str(error)
    return error


def full(sql: str, key: list[str], columns: dict | None = None) -> str:
    p = plan(sql, key, columns)
    assert p.mode == "full" and p.anchor is None and p.anchor_columns == (), p
    assert p.describe() == f"view v: full recomputation each cut: {p.reason}"
    return p.reason


# ---- incremental views ---------------------------------------------------------------------------
def test_join_view_traces_the_key_to_the_anchor() -> None:
    p = plan(
        "SELECT o.id, o.status, c.name AS customer FROM public.orders o JOIN public.customers c ON c.id = o.customer_id",
        ["id"],
    )
    assert (p.mode, p.reason, p.aggregate) == ("incremental", "", False)
    assert p.tables == (ORD, CUS) and p.anchor == ORD and p.anchor_columns == ("id",)
    assert p.describe() == "view v: incremental"
    assert p.render(SOURCES) == (
        "SELECT o.id, o.status, c.name AS customer FROM s_o AS o JOIN s_c AS c ON c.id = o.customer_id"
    )
    assert p.keys_sql(SOURCES) == (
        "SELECT DISTINCT `o`.`id` AS `id` FROM s_o AS o JOIN s_c AS c ON c.id = o.customer_id"
    )
    # the anchor's changed rows give their keys directly; a customer's reach its orders by the join
    assert p.keys_sql(SOURCES, ORD, "chg") == "SELECT DISTINCT `o`.`id` AS `id` FROM chg AS `o`"
    assert p.keys_sql(SOURCES, CUS, "chg") == (
        "SELECT DISTINCT `o`.`id` AS `id` FROM chg AS `c` JOIN s_o AS `o` ON `c`.`id` = `o`.`customer_id`"
    )
    assert p.keys_sql(SOURCES, CUS) == (  # without changed_rows: sources[changed] holds them
        "SELECT DISTINCT `o`.`id` AS `id` FROM s_c AS `c` JOIN s_o AS `o` ON `c`.`id` = `o`.`customer_id`"
    )


def test_lineage_through_aliases_and_unqualified_columns() -> None:
    p = plan(
        "SELECT ord.id AS order_id, cust.name FROM public.orders AS ord INNER JOIN public.customers AS cust "
        "ON ord.customer_id = cust.id",
        ["order_id"],
    )
    assert p.mode == "incremental" and p.anchor == ORD and p.anchor_columns == ("id",)
    # unqualified columns of a multi-table view resolve with the tables' columns
    p = plan(
        "SELECT customer_id AS cid, name, total FROM public.orders JOIN public.customers ON customer_id = customers.id",
        ["cid"],
        COLUMNS,
    )
    assert p.anchor == ORD and p.anchor_columns == ("customer_id",)
    assert "FROM s_o AS orders JOIN s_c AS customers" in p.render(SOURCES)
    # a table without alias, columns qualified with schema.table
    p = plan("SELECT public.orders.id, public.orders.total FROM public.orders", ["id"])
    assert p.render(SOURCES) == "SELECT orders.id, orders.total FROM s_o AS orders"
    # key names match output names regardless of case (as Spark resolves them)
    assert plan("SELECT o.ID FROM public.orders o", ["id"]).anchor_columns == ("id",)


def test_left_joins_keep_the_preserved_side_as_anchor_and_join_inner_for_keys() -> None:
    p = plan(
        "SELECT o.id, c.name, i.title FROM public.orders o LEFT JOIN public.customers c ON c.id = o.customer_id "
        "LEFT OUTER JOIN public.items i ON i.order_id = o.id AND i.qty > 0 WHERE o.status <> 'void'",
        ["id"],
    )
    assert p.mode == "incremental" and p.anchor == ORD
    # the full keys query keeps the joins as written
    assert "LEFT JOIN s_c AS c" in p.keys_sql(SOURCES) and "WHERE o.status <> 'void'" in p.keys_sql(SOURCES)
    # an item's change touches its order only: INNER on the path, with the ON conditions of that path
    assert p.keys_sql(SOURCES, ITM, "chg") == (
        "SELECT DISTINCT `o`.`id` AS `id` FROM chg AS `i` JOIN s_o AS `o` ON `i`.`order_id` = `o`.`id` "
        "WHERE `i`.`qty` > 0"
    )


def test_chain_of_joins_finds_the_path_to_the_anchor() -> None:
    p = plan(
        "SELECT c.id, count(i.id) AS items FROM public.customers c JOIN public.orders o ON o.customer_id = c.id "
        "JOIN public.items i ON i.order_id = o.id GROUP BY c.id",
        ["id"],
    )
    assert p.aggregate and p.anchor == CUS and p.anchor_columns == ("id",)
    assert p.keys_sql(SOURCES, ITM, "chg") == (
        "SELECT DISTINCT `c`.`id` AS `id` FROM chg AS `i` JOIN s_o AS `o` ON `i`.`order_id` = `o`.`id` "
        "JOIN s_c AS `c` ON `o`.`customer_id` = `c`.`id`"
    )


def test_self_join_unions_each_occurrence() -> None:
    p = plan(
        "SELECT e.id, e.name, m.name AS manager FROM hr.employees e LEFT JOIN hr.employees m ON m.id = e.manager_id",
        ["id"],
    )
    assert p.tables == (EMP,) and p.anchor == EMP
    keys = p.keys_sql(SOURCES, EMP, "chg")
    # as the anchor (its own keys) and as the manager (the employees it manages, read in full)
    assert keys == (
        "SELECT DISTINCT `e`.`id` AS `id` FROM chg AS `e`\nUNION\n"
        "SELECT DISTINCT `e`.`id` AS `id` FROM chg AS `m` JOIN s_e AS `e` ON `m`.`id` = `e`.`manager_id`"
    )


def test_aggregates_with_having_and_group_by_forms() -> None:
    p = plan(
        "SELECT customer_id, count(*) AS orders, sum(total) AS revenue, min(total) lo, max(total) hi, avg(total) mean "
        "FROM public.orders WHERE status = 'paid' GROUP BY customer_id HAVING count(*) > 1",
        ["customer_id"],
    )
    assert (
        p.mode == "incremental" and p.aggregate and p.anchor == ORD and p.anchor_columns == ("customer_id",)
    )
    assert p.keys_sql(SOURCES) == (
        "SELECT DISTINCT `orders`.`customer_id` AS `customer_id` FROM s_o AS orders WHERE status = 'paid'"
    )
    assert "HAVING COUNT(*) > 1" in p.render(SOURCES)
    # GROUP BY an ordinal, an alias, a qualified column
    assert plan(
        "SELECT o.customer_id AS c, count(*) n FROM public.orders o GROUP BY 1", ["c"]
    ).anchor_columns == ("customer_id",)
    assert (
        plan("SELECT customer_id AS c, count(*) n FROM public.orders GROUP BY c", ["c"]).mode == "incremental"
    )
    two = plan(
        "SELECT o.customer_id, o.status, count(DISTINCT o.id) n FROM public.orders o GROUP BY o.status, o.customer_id",
        ["status", "customer_id"],
    )
    assert two.anchor_columns == ("status", "customer_id")


def test_fingerprint_follows_the_query_not_its_spelling() -> None:
    a = plan("SELECT o.id, o.total FROM public.orders o", ["id"])
    b = plan("select  O.ID,\n o.TOTAL -- the total\n from PUBLIC.orders o", ["id"])
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    assert plan("SELECT o.id, o.status FROM public.orders o", ["id"]).fingerprint != a.fingerprint
    assert plan("SELECT o.id, o.total FROM public.orders o", ["id", "total"]).fingerprint != a.fingerprint


# ---- what falls back to full recomputation, and why ----------------------------------------------
@pytest.mark.parametrize(
    ("sql", "key", "reason"),
    [
        ("SELECT id FROM public.orders UNION SELECT id FROM public.items", ["id"], "UNION"),
        ("SELECT id FROM public.orders EXCEPT SELECT order_id FROM public.items", ["id"], "EXCEPT"),
        ("WITH t AS (SELECT id FROM public.orders) SELECT id FROM t", ["id"], "WITH"),
        ("SELECT DISTINCT customer_id FROM public.orders", ["customer_id"], "SELECT DISTINCT"),
        (
            "SELECT id FROM public.orders WHERE customer_id IN (SELECT id FROM public.customers)",
            ["id"],
            "a subquery",
        ),
        ("SELECT o.id FROM (SELECT * FROM public.orders) o", ["id"], "a subquery"),
        ("SELECT id, rank() OVER (ORDER BY total) AS r FROM public.orders", ["id"], "a window function"),
        ("SELECT id FROM public.orders ORDER BY total DESC LIMIT 10", ["id"], "LIMIT/OFFSET"),
        (
            "SELECT o.id, t.x FROM public.orders o LATERAL VIEW explode(array(1, 2)) t AS x",
            ["id"],
            "LATERAL VIEW",
        ),
        ("SELECT id, explode(array(1, 2)) AS x FROM public.orders", ["id"], "a generator function"),
        ("SELECT id, rand() AS r FROM public.orders", ["id"], "a function whose value changes by itself"),
        ("SELECT id, now() AS t FROM public.orders", ["id"], "a function whose value changes by itself"),
        (
            "SELECT o.id FROM public.orders o RIGHT JOIN public.customers c ON c.id = o.customer_id",
            ["id"],
            "RIGHT OUTER JOIN of public.customers",
        ),
        (
            "SELECT o.id FROM public.orders o FULL JOIN public.customers c ON c.id = o.customer_id",
            ["id"],
            "FULL OUTER JOIN",
        ),
        (
            "SELECT o.id FROM public.orders o LEFT ANTI JOIN public.customers c ON c.id = o.customer_id",
            ["id"],
            "LEFT ANTI JOIN",
        ),
        ("SELECT o.id FROM public.orders o CROSS JOIN public.customers c", ["id"], "without ON"),
        (
            "SELECT o.id FROM public.orders o, public.customers c WHERE c.id = o.customer_id",
            ["id"],
            "without ON",
        ),
        ("SELECT o.id FROM public.orders o NATURAL JOIN public.customers c", ["id"], "NATURAL JOIN"),
        (
            "SELECT o.id FROM public.orders o JOIN public.customers c ON c.id > o.customer_id",
            ["id"],
            "non-equi join",
        ),
        (
            "SELECT customer_id, status, count(*) n FROM public.orders GROUP BY ROLLUP(customer_id, status)",
            ["customer_id", "status"],
            "ROLLUP",
        ),
        (
            "SELECT customer_id, collect_list(status) s FROM public.orders GROUP BY customer_id",
            ["customer_id"],
            "the aggregate",
        ),
        ("SELECT count(*) AS n FROM public.orders", ["n"], "an aggregate without GROUP BY"),
        (
            "SELECT o.id || '-' || c.id AS k FROM public.orders o JOIN public.customers c ON c.id = o.customer_id",
            ["k"],
            "the key column k is computed",
        ),
        (
            "SELECT o.id AS oid, c.id AS cid FROM public.orders o JOIN public.customers c ON c.id = o.customer_id",
            ["oid", "cid"],
            "the key columns come from several tables",
        ),
    ],
)
def test_full_recomputation_names_the_construct(sql: str, key: list[str], reason: str) -> None:
    assert reason in full(sql, key)


def test_full_views_render_and_key_over_the_whole_result() -> None:
    p = plan("SELECT DISTINCT customer_id FROM public.orders", ["customer_id"])
    assert p.render(SOURCES) == "SELECT DISTINCT customer_id FROM s_o AS orders"
    assert p.keys_sql(SOURCES) == (
        "SELECT DISTINCT `customer_id` FROM (SELECT DISTINCT customer_id FROM s_o AS orders) AS _v"
    )
    # a CTE's name is not a table; the tables it reads are
    p = plan("WITH paid AS (SELECT * FROM public.orders WHERE status = 'paid') SELECT id FROM paid", ["id"])
    assert (
        p.tables == (ORD,) and "FROM s_o AS orders" in p.render(SOURCES) and "FROM paid" in p.render(SOURCES)
    )


# ---- views that cannot work: UsageError, exit 2 ---------------------------------------------------
def test_not_sql_or_not_one_query() -> None:
    assert "its SQL does not parse at line 1" in str(refused("SELEC id FROM public.orders", ["id"]))
    assert "its SQL holds 2 statements" in str(refused("SELECT 1 AS id; SELECT 2 AS id", ["id"]))
    assert "is a INSERT statement, not a query" in str(refused("INSERT INTO public.orders SELECT 1", ["id"]))
    assert "reads no table" in str(refused("SELECT 1 AS id", ["id"]))


def test_tables_must_be_captured_and_named_schema_table() -> None:
    error = refused("SELECT o.id FROM public.order o", ["id"])
    assert "it reads public.order, which the pipeline does not capture (did you mean public.orders?)" in str(
        error
    )
    assert error.fix == "add public.order to source.postgres.tables, or correct the name in the view's SQL"
    error = refused("SELECT id FROM orders", ["id"])
    assert "it reads orders, which is not a schema.table name" in str(error) and "public.orders" in str(
        error.fix
    )
    assert "another derived view" in str(refused("SELECT id FROM views.order_docs", ["id"]))
    # case does not matter to Spark: a capitalised name finds the table
    assert plan("SELECT id FROM Public.Orders", ["id"]).tables == (ORD,)


def test_key_must_be_an_output_column_once() -> None:
    error = refused("SELECT o.id AS order_id, o.total FROM public.orders o", ["ordr_id"])
    assert (
        "key column 'ordr_id' is not a column of the view (it outputs order_id, total) (did you mean 'order_id'?)"
        in str(error)
    )
    assert "key column 'id' is output 2 times" in str(
        refused(
            "SELECT o.id, c.id FROM public.orders o JOIN public.customers c ON c.id = o.customer_id", ["id"]
        )
    )


def test_aggregate_key_must_be_the_group_columns() -> None:
    error = refused(
        "SELECT customer_id, status, count(*) n FROM public.orders GROUP BY customer_id, status",
        ["customer_id"],
    )
    assert "its key (customer_id) is not its GROUP BY columns (customer_id, status)" in str(error)
    assert error.fix == "set key: [customer_id, status]"
    error = refused("SELECT count(*) AS n FROM public.orders GROUP BY customer_id", ["n"])
    assert "it groups by customer_id, which is not among its output columns" in str(error)


def test_key_from_the_optional_side_of_a_left_join() -> None:
    error = refused(
        "SELECT c.id, o.id AS order_id FROM public.orders o LEFT JOIN public.customers c ON c.id = o.customer_id",
        ["id"],
    )
    assert "its key comes from public.customers, the optional side of a LEFT JOIN" in str(error)


def test_columns_that_cannot_be_traced() -> None:
    error = refused(
        "SELECT id, status FROM public.orders o JOIN public.customers c ON c.id = o.customer_id", ["id"]
    )
    assert "column id is not qualified and the view reads several tables" in str(error)
    assert error.fix == "qualify it with its table's alias (o.id, c.id)"
    error = refused(
        "SELECT id, status FROM public.orders o JOIN public.customers c ON c.id = o.customer_id",
        ["id"],
        COLUMNS,
    )
    assert "column id: several tables it reads have it" in str(error)
    assert "no table of its FROM/JOIN is called x" in str(refused("SELECT x.id FROM public.orders o", ["id"]))
    error = refused("SELECT o.idd AS id FROM public.orders o", ["id"], COLUMNS)
    assert "o.idd: public.orders has no column idd" in str(error)


def test_output_columns_spark_reports_are_checked() -> None:
    """pipelines/views/check.py on the schema Spark gives the view (no JVM needed for the check)."""
    from pyspark.sql import types as T

    from pipelines.views.check import check_columns

    p = plan("SELECT o.customer_id, count(1) FROM public.orders o GROUP BY o.customer_id", ["customer_id"])

    def schema(*names: str) -> T.StructType:
        return T.StructType([T.StructField(n, T.LongType()) for n in names])

    check_columns(p, schema("customer_id", "n"))
    with pytest.raises(UsageError, match=r"its output column 'count\(1\)' has no plain name") as info:
        check_columns(p, schema("customer_id", "count(1)"))
    assert info.value.fix == "name it with AS, e.g. count(1) AS count_1"
    with pytest.raises(UsageError, match="it outputs the column N twice"):
        check_columns(p, schema("customer_id", "n", "N"))
    with pytest.raises(UsageError, match="key column 'customer_id' is not a column of the view"):
        check_columns(p, schema("id", "n"))
