"""`cdc sql` over a Delta follower applied by Spark from a real PostgreSQL (issue 33 items 6, 7):
DataFusion (no JVM) returns the source's rows as of a cut, every table at the same cut while a later
cut exists; tables answer to qualified, bare and quoted names in both engines, and the output names a
column stored encoded by its source name; a query only Spark
can run goes to Spark; `cdc sql` and `cdc log read` run without importing pyspark, `cdc status` and `cdc wait` without
starting a JVM.

One lake for the module: a snapshot (cut A) and one streamed change set (cut B), two applies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from cdc.ground.lsn import format_lsn
from tests.fixtures.capture import Pipe
from tests.fixtures.lake import LAKE, apply_ok, make_pipe, snapshot, stream
from tests.fixtures.nojvm import cdc_watched
from tests.fixtures.services import throwaway_database
from tests.harness import cdc_here, source_rows, sql

pytestmark = pytest.mark.integration

TABLES = ["public.t", "sales.t", 'public."Order Items"']
SETUP = (
    "CREATE SCHEMA sales",
    "CREATE TABLE public.t(id int PRIMARY KEY, v text, n numeric(10,2))",
    "CREATE TABLE sales.t(id int PRIMARY KEY, v text)",
    # "unit price": a name plain Delta cannot hold, stored encoded (unit_x0020_price); `cdc sql` says "unit price"
    'CREATE TABLE public."Order Items"(id int PRIMARY KEY, "Qty" int, "unit price" int)',
    "INSERT INTO public.t SELECT g, 'v' || g, g * 1.5 FROM generate_series(1, 5) g",
    "INSERT INTO sales.t SELECT g, 's' || g FROM generate_series(1, 4) g",
    'INSERT INTO public."Order Items" SELECT g, g * 10, g + 100 FROM generate_series(1, 3) g',
)
CHANGES = (  # one transaction over two tables: cut B
    "BEGIN",
    "UPDATE public.t SET v = 'changed', n = 99.99 WHERE id = 2",
    "DELETE FROM public.t WHERE id = 5",
    "INSERT INTO sales.t VALUES (10, 'new')",
    'UPDATE public."Order Items" SET "Qty" = 7 WHERE id = 1',
    "COMMIT",
)


@dataclass
class Lake:
    pipe: Pipe
    cut_a: int
    cut_b: int
    lsn_b: str
    at_a: dict[str, dict]  # the source rows when cut A was taken


@pytest.fixture(scope="module")
def lake(pg, spark, tmp_path_factory) -> Iterator[Lake]:
    from sinks.delta.cuts import cut_record_arrow

    with throwaway_database(pg) as dsn:
        sql(dsn, *SETUP)
        tmp = tmp_path_factory.mktemp("lakesql")
        pipe = make_pipe(tmp, dsn, TABLES, sinks=[LAKE])
        at_a = {t: source_rows(dsn, t, ("id",)) for t in TABLES}
        snapshot(pipe)
        apply_ok(pipe, spark)
        cut_a = cut_record_arrow(tmp / "lake").cut_id
        sql(dsn, *CHANGES)
        stream(pipe)
        apply_ok(pipe, spark)
        record = cut_record_arrow(tmp / "lake")
        assert record.cut_id > cut_a
        yield Lake(pipe, cut_a, record.cut_id, format_lsn(record.lsn), at_a)


def rows_of(out: str) -> dict[tuple, dict]:
    return {
        (str(r["id"]),): {k: None if v is None else str(v) for k, v in r.items()}
        for r in map(json.loads, out.splitlines())
    }


def test_datafusion_reads_the_source_rows_at_a_cut_without_a_jvm(lake: Lake) -> None:
    f = lake.pipe.file
    cols = {"public.t": "id, v, n", "sales.t": "id, v", 'public."Order Items"': 'id, "Qty", unit_x0020_price'}
    for cut, expected in ((lake.cut_b, None), (lake.cut_a, lake.at_a)):
        for table, select in cols.items():
            run, jvm, pyspark = cdc_watched(
                "sql", f, "--json", "--engine", "datafusion", "--cut", cut, f"SELECT {select} FROM {table}"
            )
            assert run.code == 0 and not jvm and not pyspark, (run, jvm, pyspark)
            want = expected[table] if expected else source_rows(lake.pipe.dsn, table, ("id",))
            assert rows_of(run.out) == want, (cut, table, run.out)
            assert f"cut {cut} " in run.err and "engine datafusion" in run.err, run.err
    # the same cut for both tables of one transaction, while a later cut exists: A sees neither change
    both = "SELECT (SELECT v FROM public.t WHERE id = 2) AS v, (SELECT count(*) FROM sales.t) AS n"
    run, jvm, pyspark = cdc_watched("sql", f, "--cut", lake.cut_a, both)
    assert run.code == 0 and not pyspark and run.out.splitlines() == ["v\tn", "v2\t4"], run
    run, jvm, pyspark = cdc_watched("sql", f, both)  # the latest cut: both changes
    assert run.code == 0 and not pyspark and run.out.splitlines() == ["v\tn", "changed\t5"], run
    run, jvm, pyspark = cdc_watched("sql", f, "--cuts")
    assert run.code == 0 and not pyspark and len(run.out.splitlines()) == 2, run
    # a table the follower does not have: exit 2 at once, no Spark
    run, jvm, pyspark = cdc_watched("sql", f, "SELECT * FROM public.nosuch")
    assert run.code == 2 and not pyspark and "error: DataFusion refused the query" in run.err, run
    assert "Traceback" not in run.err


@pytest.mark.parametrize("engine", ["datafusion", "spark"])
def test_qualified_bare_and_quoted_names(lake: Lake, engine: str) -> None:
    q = '"' if engine == "datafusion" else "`"  # each engine's quoted identifiers
    queries = {
        "SELECT count(*) AS c FROM public.t": "4",
        "SELECT count(*) AS c FROM t": "4",  # public is the default schema: bare t is public.t
        "SELECT count(*) AS c FROM sales.t": "5",
        "SELECT count(*) AS c FROM sales_t": "5",  # the bare names of a name two schemas share
        "SELECT count(*) AS c FROM public_t": "4",
        f"SELECT sum({q}Qty{q}) AS c FROM public.{q}Order Items{q}": "57",
        f"SELECT sum(o.{q}Qty{q}) AS c FROM {q}Order Items{q} o JOIN public.t ON t.id = o.id": "57",
        "SELECT max(public.t.v) AS c FROM public.t": "v4",
    }
    for query, want in queries.items():
        run = cdc_here("sql", lake.pipe.file, "--engine", engine, query)
        assert run.code == 0 and run.out.splitlines() == ["c", want], (query, run)
        assert f"engine {engine}" in run.err, run.err
    # the header gives an encoded column its source name (queries name it as stored)
    run = cdc_here(
        "sql",
        lake.pipe.file,
        "--engine",
        engine,
        f"SELECT {q}Qty{q}, unit_x0020_price FROM {q}Order Items{q} WHERE id = 3",
    )
    assert run.code == 0 and run.out.splitlines() == ["Qty\tunit price", "30\t103"], run


def test_a_query_only_spark_runs_goes_to_spark(lake: Lake) -> None:
    # LATERAL VIEW explode is Spark SQL that DataFusion does not parse
    query = "SELECT id, x FROM sales.t LATERAL VIEW explode(array(1, 2)) e AS x WHERE id = 1 ORDER BY x"
    run = cdc_here("sql", lake.pipe.file, query)
    assert run.code == 0 and run.out.splitlines() == ["id\tx", "1\t1", "1\t2"], run
    assert "DataFusion cannot run it" in run.err and "engine spark" in run.err, run.err
    run = cdc_here("sql", lake.pipe.file, "--engine", "datafusion", query)
    assert (
        run.code == 2 and "error: DataFusion refused the query" in run.err and "--engine spark" in run.err
    ), run


def test_status_wait_and_log_read_start_no_jvm(lake: Lake) -> None:
    # (`cdc status` imports pyspark through the follower self-check's sink classes: no JVM though)
    run, jvm, _ = cdc_watched("status", lake.pipe.file, "--json")
    assert run.code == 0 and not jvm, run
    assert json.loads(run.out)["pipeline"] == "test"
    run, jvm, _ = cdc_watched("wait", lake.pipe.file, "--lsn", lake.lsn_b, "--timeout", "5")
    assert run.code == 0 and not jvm, run  # cut B's position is applied
    run, jvm, _ = cdc_watched("wait", lake.pipe.file, "--current", "--timeout", "0.5")
    assert run.code == 1 and not jvm, run  # nothing streams now: the source's position is never applied
    run, jvm, pyspark = cdc_watched("log", "read", lake.pipe.file, "--limit", "1")
    assert run.code == 0 and not pyspark and len(run.out.splitlines()) == 1, run
