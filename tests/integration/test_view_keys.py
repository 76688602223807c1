"""The rewrites of pipelines/views/plan.py run by Spark: for random changes to small base
tables, the view keys `keys_sql(sources, changed=T, changed_rows=...)` finds from T's changed rows
(old rows with the tables before, new rows with the tables after) hold every key whose view rows
differ between the view's SQL before and after, for joins (inner, left, a chain, a self-join), WHERE,
GROUP BY and HAVING; and a customer renamed touches exactly its own orders, not every row of a LEFT
join. No services but the session's Spark."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import types as T

from cdc.ground.config import ViewConfig
from cdc.ground.tables import TableName
from pipelines.views.sql import analyse

# two Spark actions over a few dozen small queries (joins, unions, DISTINCT) unioned into one
pytestmark = [pytest.mark.integration]

CUS, ORD, ITM, EMP = (
    TableName("public", "customers"),
    TableName("public", "orders"),
    TableName("public", "items"),
    TableName("hr", "employees"),
)
SCHEMAS = {
    CUS: T.StructType([T.StructField("id", T.IntegerType()), T.StructField("name", T.StringType())]),
    ORD: T.StructType(
        [
            T.StructField("id", T.IntegerType()),
            T.StructField("customer_id", T.IntegerType()),
            T.StructField("total", T.IntegerType()),
            T.StructField("status", T.StringType()),
        ]
    ),
    ITM: T.StructType([T.StructField("id", T.IntegerType()), T.StructField("order_id", T.IntegerType())]),
    EMP: T.StructType(
        [
            T.StructField("id", T.IntegerType()),
            T.StructField("manager_id", T.IntegerType()),
            T.StructField("name", T.StringType()),
        ]
    ),
}
VIEWS = [
    ViewConfig(
        name="docs",
        sql="SELECT o.id, o.status, c.name AS customer FROM public.orders o LEFT JOIN public.customers c "
        "ON c.id = o.customer_id WHERE o.status <> 'void'",
        key=["id"],
    ),
    ViewConfig(
        name="revenue",
        sql="SELECT c.id, c.name, count(o.id) AS n, sum(o.total) AS revenue FROM public.customers c "
        "LEFT JOIN public.orders o ON o.customer_id = c.id AND o.status <> 'void' GROUP BY c.id, c.name",
        key=["id", "name"],
    ),
    ViewConfig(
        name="busy",
        sql="SELECT c.id, count(i.id) AS items FROM public.customers c JOIN public.orders o ON o.customer_id = c.id "
        "JOIN public.items i ON i.order_id = o.id GROUP BY c.id HAVING count(i.id) > 1",
        key=["id"],
    ),
    ViewConfig(
        name="bosses",
        sql="SELECT e.id, m.name AS boss FROM hr.employees e LEFT JOIN hr.employees m ON m.id = e.manager_id",
        key=["id"],
    ),
]
PLANS = [analyse(v, SCHEMAS) for v in VIEWS]


def random_row(rng: random.Random, table: TableName, pk: int) -> tuple:
    if table == CUS:
        return (pk, rng.choice(["ann", "bob", "cy", None]))
    if table == ORD:
        return (pk, rng.randint(1, 6), rng.randint(1, 9), rng.choice(["new", "paid", "void"]))
    if table == ITM:
        return (pk, rng.randint(1, 14))
    return (pk, rng.choice([None, 1, 2, 3, 4, 5]), rng.choice(["x", "y", "z"]))


SIZES = {CUS: 5, ORD: 12, ITM: 20, EMP: 6}


def change(rng: random.Random, state: dict[TableName, dict[int, tuple]]) -> dict[TableName, dict[int, tuple]]:
    new = {t: dict(rows) for t, rows in state.items()}
    for table in state:  # every table changes: each view sees changes on each side of its joins
        for _ in range(rng.randint(2, 4)):
            pk = rng.randint(1, SIZES[table] + 2)
            if pk in new[table] and rng.random() < 0.3:
                del new[table][pk]
            else:
                new[table][pk] = random_row(rng, table, pk)
    return new


def register(spark, rows: dict[TableName, list[tuple]], tag: str) -> dict[TableName, str]:
    names = {}
    for table, data in rows.items():
        names[table] = f"_k_{tag}_{table.name}"
        spark.createDataFrame(data, SCHEMAS[table]).createOrReplaceTempView(names[table])
    return names


def test_keys_sql_finds_every_changed_view_row(spark) -> None:
    rng = random.Random(20)
    state = {t: {pk: random_row(rng, t, pk) for pk in range(1, n + 1)} for t, n in SIZES.items()}
    # one round, every table changed: each view sees changes on each side of its joins (the stage's
    # randomized test has more). Two Spark actions in all: each costs a fixed second or more.
    new = change(rng, state)
    changed = {
        t: {pk for pk in state[t].keys() | new[t].keys() if state[t].get(pk) != new[t].get(pk)} for t in state
    }
    old_src = register(spark, {t: list(state[t].values()) for t in state}, "o")
    new_src = register(spark, {t: list(new[t].values()) for t in new}, "n")
    old_chg = register(spark, {t: [state[t][pk] for pk in changed[t] if pk in state[t]] for t in state}, "co")
    new_chg = register(spark, {t: [new[t][pk] for pk in changed[t] if pk in new[t]] for t in new}, "cn")
    # every view's rows before ('o') and after ('n'), and the keys keys_sql finds ('k'), as one
    # query: (view, side, key as JSON, row as JSON)
    parts = []
    for plan in PLANS:
        keys = ", ".join(f"`{k}`" for k in plan.key)
        for side, src in (("o", old_src), ("n", new_src)):
            parts.append(
                f"SELECT '{plan.name}' AS v, '{side}' AS side, to_json(struct({keys})) AS k,"
                f" to_json(struct(*)) AS r FROM ({plan.render(src)})"
            )
        for table in plan.tables:
            if changed[table]:
                for src, chg in ((old_src, old_chg), (new_src, new_chg)):
                    parts.append(
                        f"SELECT '{plan.name}', 'k', to_json(struct({keys})), '' FROM"
                        f" ({plan.keys_sql(src, table, chg[table])})"
                    )
    rows = spark.sql(" UNION ALL ".join(f"({p})" for p in parts)).collect()
    for plan in PLANS:
        by_key: dict[str, dict[str, set]] = {}
        found = set()
        for v, side, k, r in rows:
            if v != plan.name:
                continue
            if side == "k":
                found.add(k)
            else:
                by_key.setdefault(k, {"o": set(), "n": set()})[side].add(r)
        differing = {k for k, sides in by_key.items() if sides["o"] != sides["n"]}
        assert differing <= found, (plan.name, differing - found, changed)
    state = new

    # a customer renamed touches its own orders' documents only (not every order of the LEFT join)
    docs = PLANS[0]
    base = {t: list(rows.values()) for t, rows in state.items()}
    src = register(spark, base, "r")
    renamed = [(cid, "zed") for cid, _ in base[CUS][:1]]
    chg = register(spark, {CUS: renamed}, "rc")
    found_ids = {r[0] for r in spark.sql(docs.keys_sql(src, CUS, chg[CUS])).collect()}
    assert found_ids == {o[0] for o in base[ORD] if o[1] == renamed[0][0]}
