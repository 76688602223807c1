"""`cdc sql` names and its JVM-free engine (pipelines/lakenames.py, pipelines/lakesql_df.py), no
services: Delta tables and a `_cdc_cuts` table written by delta-rs itself, read back at a cut by
DataFusion; the Spark rewrite of qualified and quoted names checked as SQL text (the Spark engine
runs in tests/integration/test_lake_sql.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

from cdc.ground.errors import UsageError
from pipelines.lakenames import datafusion_names, spark_query, spark_views
from pipelines.lakesql_df import DataFusionRefused, query_at_cut, source_header
from sinks.delta.cuts import cut_record_arrow, list_cuts_arrow

pytestmark = pytest.mark.unit

TABLES = ["public.t", "sales.t", "sales.orders", '"Sales Dept"."My Items"']
CUTS_SCHEMA = pa.schema(
    [
        ("cut_id", pa.int64()),
        ("lsn", pa.int64()),
        ("lsn_text", pa.string()),
        ("log_id", pa.string()),
        ("versions", pa.map_(pa.string(), pa.int64())),
        ("paths", pa.map_(pa.string(), pa.string())),
        ("applied_at", pa.timestamp("us", tz="UTC")),
    ]
)


def _write(path: Path, ids: list[int], v: str, mode: str) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(path), pa.table({"id": ids, "v": [f"{v}{i}" for i in ids]}), mode=mode)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    """Four tables, each with versions 0 (cut 1: ids 1-2) and 1 (cut 2: id 3 added); cut 1 recorded
    at version 0 of every table, cut 2 at version 1."""
    from deltalake import write_deltalake

    base = tmp_path_factory.mktemp("lake")
    paths = {t: f"d{i}" for i, t in enumerate(TABLES)}  # directories as a renamed table's would be
    for t, rel in paths.items():
        _write(base / rel, [1, 2], t, "overwrite")
        _write(base / rel, [3], t, "append")
    now = dt.datetime(2026, 11, 28, 8, 0, tzinfo=dt.UTC)
    rows = [
        {
            "cut_id": cut,
            "lsn": 1000 + cut,
            "lsn_text": f"0/{1000 + cut:X}",
            "log_id": "log-a",
            "versions": [(t, cut - 1) for t in TABLES],
            "paths": list(paths.items()),
            "applied_at": now + dt.timedelta(seconds=cut),
        }
        for cut in (1, 2)
    ]
    write_deltalake(str(base / "_cdc_cuts"), pa.Table.from_pylist(rows, CUTS_SCHEMA), mode="append")
    return base


def run(lake: Path, query: str, cut: int | None = None, limit: int = 100):
    return query_at_cut(lake, cut_record_arrow(lake, cut), query, limit)


def test_every_table_is_read_at_the_cut_named(lake: Path) -> None:
    both = "SELECT (SELECT count(*) FROM public.t) AS a, (SELECT count(*) FROM sales.orders) AS b"
    assert run(lake, both) == (["a", "b"], [(3, 3)])  # the latest cut: version 1 of each
    assert run(lake, both, cut=1) == (["a", "b"], [(2, 2)])  # an older cut, while a later one exists
    assert [c.cut_id for c in list_cuts_arrow(lake)] == [2, 1]


def test_qualified_bare_and_quoted_names(lake: Path) -> None:
    def ids(query: str) -> list:
        return sorted(r[0] for r in run(lake, query)[1])

    # public.t and bare t are the same table (public is the default schema, as in PostgreSQL)
    assert run(lake, "SELECT v FROM public.t WHERE id = 1")[1] == [("public.t1",)]
    assert run(lake, "SELECT v FROM t WHERE id = 1")[1] == [("public.t1",)]
    assert run(lake, "SELECT v FROM sales.t WHERE id = 1")[1] == [("sales.t1",)]
    assert run(lake, 'SELECT v FROM "sales"."t" WHERE id = 2')[1] == [("sales.t2",)]
    # a name one schema has is also bare; capitals and spaces are quoted as in PostgreSQL
    assert ids("SELECT id FROM orders") == [1, 2, 3]
    assert ids('SELECT id FROM "Sales Dept"."My Items"') == [1, 2, 3]
    assert ids('SELECT id FROM "My Items"') == [1, 2, 3]
    cols, rows = run(lake, "SELECT a.id, b.id FROM sales.orders a JOIN public.t b USING (id) ORDER BY 1")
    assert cols == ["id", "id"] and rows == [(1, 1), (2, 2), (3, 3)]  # same-named columns both kept
    with pytest.raises(DataFusionRefused) as refused:
        run(lake, 'SELECT * FROM "sales"."T"')  # quoted: case kept, so no such table
    assert refused.value.missing_table
    with pytest.raises(DataFusionRefused) as refused:
        run(lake, "SELECT nosuchfunction(id) FROM t")
    assert not refused.value.missing_table


def test_limit_and_cut_not_recorded(lake: Path) -> None:
    assert len(run(lake, "SELECT * FROM public.t", limit=2)[1]) == 2
    with pytest.raises(UsageError, match="cut 9 is not recorded"):
        cut_record_arrow(lake, 9)


def test_the_header_has_source_names_for_encoded_columns(tmp_path: Path) -> None:
    """A source column plain Delta cannot hold is stored encoded (`unit_x0020_price`) with its
    source name in the column's comment, as the Delta sink writes it: the output's header says
    `unit price`; an alias, and a comment that is not the sink's, stay as they are."""
    import json

    from deltalake import write_deltalake

    ours = {"comment": "pgcdc source column: " + json.dumps("unit price")}
    schema = pa.schema(
        [
            pa.field("id", pa.int64()),
            pa.field("unit_x0020_price", pa.int64(), metadata=ours),
            pa.field("note_x0020_x", pa.string(), metadata={"comment": "a user's own"}),
        ]
    )
    write_deltalake(str(tmp_path / "r"), pa.table([[1], [250], ["n"]], schema=schema))
    cut = {
        "cut_id": 1,
        "lsn": 1,
        "lsn_text": "0/1",
        "log_id": "log-a",
        "versions": [("public.r", 0)],
        "paths": [("public.r", "r")],
        "applied_at": dt.datetime(2026, 11, 28, tzinfo=dt.UTC),
    }
    write_deltalake(str(tmp_path / "_cdc_cuts"), pa.Table.from_pylist([cut], CUTS_SCHEMA))
    assert run(tmp_path, "SELECT * FROM public.r") == (["id", "unit price", "note_x0020_x"], [(1, 250, "n")])
    assert run(tmp_path, "SELECT unit_x0020_price AS p, unit_x0020_price FROM r")[0] == ["p", "unit price"]
    assert source_header(["a_x0020_b", "c"], {"a_x0020_b": None}) == ["a_x0020_b", "c"]  # no comment


def test_datafusion_names() -> None:
    names = datafusion_names(["public.orders", "sales.orders", "sales.items", "public.sales_items"])
    assert names["public.orders"] == ['"public"."orders"', '"public"."public_orders"']
    assert names["public.sales_items"] == ['"public"."sales_items"']
    assert names["sales.orders"] == ['"sales"."orders"', '"public"."sales_orders"']
    assert names["sales.items"] == ['"sales"."items"', '"public"."items"']


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT * FROM t", "SELECT * FROM t"),  # bare plain names: Spark runs the query unchanged
        ("SELECT * FROM public.t", "SELECT * FROM t AS t"),
        ("SELECT public.t.id FROM public.t", "SELECT t.id FROM t AS t"),
        ("SELECT x.id FROM PUBLIC.T x", "SELECT x.id FROM t AS x"),
        ("SELECT * FROM `sales`.`My Items` i", "SELECT * FROM _cdc_table_1 AS i"),
        ("SELECT * FROM `My Items`", "SELECT * FROM _cdc_table_1"),
        ("WITH t AS (SELECT 1 AS id) SELECT * FROM t", "WITH t AS (SELECT 1 AS id) SELECT * FROM t"),
        ("SELECT * FROM other.t", "SELECT * FROM other.t"),  # not a follower table: Spark says so
        ("SELECT explode(", "SELECT explode("),  # not parsed: unchanged
    ],
)
def test_spark_rewrite(query: str, expected: str) -> None:
    views = spark_views(["public.t", 'sales."My Items"'])  # as _cdc_cuts names them
    assert views == {"public.t": "t", 'sales."My Items"': "_cdc_table_1"}
    assert spark_query(query, views) == expected
