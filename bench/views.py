"""Derived views benchmark: incremental maintenance of a cut vs a full recomputation of the view.

Run from the repo root:  .venv/bin/python bench/views.py [--orders 100000,1000000] [--customers 100000]
                                                         [--changes 10000] [--repeat 1] [--json out.json]

Per size (one run covers every size, side by side):
1. customers(id, name, email, city) with `--customers` rows and orders(id, customer_id, status,
   total numeric, note, created_at) with N rows are loaded, snapshotted into the local log and
   applied once (the bootstrap, not timed) by `cdc apply` with the issue's two views:
   order_docs (orders JOIN customers) and customer_revenue (count/sum per customer over orders),
   followed by a Delta sink.
2. A cut of `--changes` row changes (30% order inserts, 30% order updates of status/total, 10%
   order deletes, 10% orders moved to another customer, 10% customers renamed, 5% customers
   inserted, 5% deleted; rows picked at random, disjoint, so the cut's net changes are exactly
   that many) is written and streamed into the log.
3. Timed: one `cdc apply --once` of that cut, in this process: the view stage (the internal base
   follower applies the cut, then each view's affected keys are recomputed and merged into its out
   table) and the Delta sink taking the views' changes. The stage and each view's maintenance are
   timed by wrapping their entry points in pipelines.views.maintain and .maintainer (StageTimer).
4. Timed, side by side: what a user's rebuild job does without incremental maintenance: the view's
   SQL over the base tables (Delta, at the same cut) written to a Delta table (overwrite). Then,
   not timed, the rebuilt table is compared with the incrementally maintained out table (they must
   hold the same rows).

Reported per size: seconds of each, the incremental cut as a share of the full recomputation, and
the growth of each from the smallest to the largest size. The issue's target: at 1M orders the
incremental cut costs at most 1/5 of a full recomputation, and grows by less than 2x from 100k to
1M while the recomputation grows with the rows.

Everything runs in this process on one SparkSession (local[2]; JVM start-up not counted) against
its own PostgreSQL (bench/harness), removed at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness.bench import Bench
from harness.inproc import MASTER, apply_job
from harness.main import main
from harness.report import Report
from harness.services import say

from cdc.ground import logsetup

TABLES = """
DROP TABLE IF EXISTS orders, customers;
CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, email text, city text);
CREATE TABLE orders (
    id bigint PRIMARY KEY, customer_id bigint NOT NULL, status text NOT NULL, total numeric(12,2),
    note text, created_at timestamptz NOT NULL)
"""
CUSTOMERS = """
INSERT INTO customers SELECT g, 'customer ' || g, 'c' || g || '@example.com', 'city ' || mod(g, 500)
FROM generate_series(1, {customers}) g
"""
ORDERS = """
INSERT INTO orders SELECT g, 1 + mod(g::bigint * 7919, {customers}), (ARRAY['new','paid','shipped','cancelled'])[1 + mod(g, 4)],
    (mod(g * 31, 100000) / 100.0)::numeric(12,2), left(md5(g::text), 20),
    timestamptz '2024-01-01 00:00:00+00' + g * interval '1 minute'
FROM generate_series(1, {orders}) g
"""

# The two views; {orders}/{customers} are the table names (the pipeline file names the
# captured tables, the rebuild job its temp views over the Delta base tables).
VIEWS = {
    "order_docs": (
        "SELECT o.id, o.status, o.total, c.name AS customer, c.email "
        "FROM {orders} o JOIN {customers} c ON c.id = o.customer_id",
        ["id"],
    ),
    "customer_revenue": (
        "SELECT customer_id, count(*) AS orders, sum(total) AS revenue FROM {orders} GROUP BY customer_id",
        ["customer_id"],
    ),
}
CAPTURED = {"orders": "public.orders", "customers": "public.customers"}

# The cut: shares of --changes per kind of change (disjoint rows: exactly that many net changes).
MIX = {
    "order_insert": 0.30,
    "order_update": 0.30,
    "order_delete": 0.10,
    "order_move": 0.10,
    "customer_rename": 0.10,
    "customer_insert": 0.05,
    "customer_delete": 0.05,
}


def load(b: Bench, customers: int, orders: int) -> float:
    t0 = time.monotonic()
    b.sql(TABLES, CUSTOMERS.format(customers=customers), ORDERS.format(customers=customers, orders=orders))
    b.sql("VACUUM ANALYZE customers", "VACUUM ANALYZE orders")
    return time.monotonic() - t0


def write_cut(b: Bench, customers: int, orders: int, changes: int) -> dict[str, int]:
    """One cut of `changes` row changes (MIX), rows picked at random with a fixed seed; returns the
    rows each statement changed."""
    n = {kind: int(changes * share) for kind, share in MIX.items()}
    picked_orders = n["order_update"] + n["order_delete"] + n["order_move"]
    picked_customers = n["customer_rename"] + n["customer_delete"]
    counts: dict[str, int] = {}
    statements = {
        "order_insert": f"""
            INSERT INTO orders SELECT {orders} + g, 1 + mod(g * 104729, {customers}), 'new',
                (mod(g * 17, 50000) / 100.0)::numeric(12,2), 'added', now()
            FROM generate_series(1, {n["order_insert"]}) g""",
        "order_update": f"""
            UPDATE orders o SET status = 'paid', total = o.total + 1 FROM pick_o p
            WHERE p.id = o.id AND p.r <= {n["order_update"]}""",
        "order_delete": f"""
            DELETE FROM orders o USING pick_o p
            WHERE p.id = o.id AND p.r > {n["order_update"]} AND p.r <= {n["order_update"] + n["order_delete"]}""",
        "order_move": f"""
            UPDATE orders o SET customer_id = 1 + mod(o.customer_id + 1000, {customers}) FROM pick_o p
            WHERE p.id = o.id AND p.r > {n["order_update"] + n["order_delete"]}""",
        "customer_rename": f"""
            UPDATE customers c SET name = c.name || ' (renamed)' FROM pick_c p
            WHERE p.id = c.id AND p.r <= {n["customer_rename"]}""",
        "customer_delete": f"""
            DELETE FROM customers c USING pick_c p WHERE p.id = c.id AND p.r > {n["customer_rename"]}""",
        "customer_insert": f"""
            INSERT INTO customers SELECT {customers} + g, 'new customer ' || g, 'n' || g || '@example.com', 'city 1'
            FROM generate_series(1, {n["customer_insert"]}) g""",
    }
    import psycopg2

    from cdc.session import libpq_options

    conn = psycopg2.connect(b.dsn, options=libpq_options())
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT setseed(0.42)")
            cur.execute(
                "CREATE TEMP TABLE pick_o AS SELECT id, row_number() OVER () AS r "
                f"FROM (SELECT id FROM orders ORDER BY random() LIMIT {picked_orders}) s"
            )
            cur.execute(
                "CREATE TEMP TABLE pick_c AS SELECT id, row_number() OVER () AS r "
                f"FROM (SELECT id FROM customers ORDER BY random() LIMIT {picked_customers}) s"
            )
            for kind, stmt in statements.items():
                cur.execute(stmt)
                counts[kind] = cur.rowcount
    finally:
        conn.close()
    return counts


def view_sql(name: str, tables: dict[str, str]) -> str:
    return VIEWS[name][0].format(**tables)


def pipeline(b: Bench, name: str) -> Path:
    views = [{"name": v, "sql": view_sql(v, CAPTURED), "key": key} for v, (_sql, key) in VIEWS.items()]
    return b.pipeline(
        name,
        list(CAPTURED.values()),
        views=views,
        sinks=[{"name": "lake", "delta": {"path": f"{name}-lake", "views": list(VIEWS)}}],
        spark={"master": MASTER},
    )


def base_paths(state_dir: Path) -> dict[str, Path]:
    """The view stage's internal Delta copy of each base table (pipelines/views: <state_dir>/views/base)."""
    return {t: state_dir / "views" / "base" / "public" / t for t in CAPTURED}


def out_path(state_dir: Path, view: str) -> Path:
    return state_dir / "views" / "out" / view


def full_recompute(spark: Any, bases: dict[str, Path], view: str, target: Path) -> float:
    """A user's rebuild job: the view SQL over the base tables (Delta) written to a Delta table."""
    t0 = time.monotonic()
    names = {}
    for table, path in bases.items():
        names[table] = f"bench_base_{table}"
        spark.read.format("delta").load(str(path)).createOrReplaceTempView(names[table])
    df = spark.sql(view_sql(view, names))
    df.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(str(target))
    return time.monotonic() - t0


def bare_merge_s(spark: Any, target: Path, key: list[str], rows: int) -> float:
    """The floor under any incremental cut of a view: one bare Delta MERGE (match on the key,
    update every column) of `rows` of the view's own rows into the rebuilt view table; nothing
    computed, read from a log or checked. Run after the comparison (it rewrites those rows)."""
    from delta.tables import DeltaTable

    source = spark.read.format("delta").load(str(target)).limit(rows).localCheckpoint(eager=True)
    on = " AND ".join(f"t.{k} = s.{k}" for k in key)
    t0 = time.monotonic()
    DeltaTable.forPath(spark, str(target)).alias("t").merge(
        source.alias("s"), on
    ).whenMatchedUpdateAll().execute()
    return round(time.monotonic() - t0, 2)


def same_rows(spark: Any, left: Path, right: Path, columns: list[str]) -> int:
    """Rows in one Delta table and not the other (both ways, with multiplicity): 0 when equal."""
    a = spark.read.format("delta").load(str(left)).select(*columns)
    b = spark.read.format("delta").load(str(right)).select(*columns)
    return a.exceptAll(b).count() + b.exceptAll(a).count()


class StageTimer:
    """Times the view stage of an apply run from outside: the whole stage (base follower + every
    view) and each view's maintenance (pipelines.views.maintain.run_view_stage,
    pipelines.views.maintainer.ViewMaintainer.run)."""

    def __init__(self) -> None:
        import pipelines.views.maintain as maintain
        from pipelines.views.maintainer import ViewMaintainer

        self.stage_s = 0.0
        self.view_s: dict[str, float] = {}
        self.stage_jobs = 0
        self.stage_cpu = 0.0
        self.view_jobs: dict[str, int] = {}
        stage, run = maintain.run_view_stage, ViewMaintainer.run

        def timed_stage(job: Any, *args: Any, **kwargs: Any) -> Any:
            t0, j0, c0 = time.monotonic(), spark_jobs(job.spark), cpu_s(job.spark)
            try:
                return stage(job, *args, **kwargs)
            finally:
                self.stage_s += time.monotonic() - t0
                self.stage_jobs += spark_jobs(job.spark) - j0
                self.stage_cpu += cpu_s(job.spark) - c0

        def timed_run(maintainer: Any, view: Any, *args: Any, **kwargs: Any) -> Any:
            t0, j0 = time.monotonic(), spark_jobs(maintainer.spark)
            try:
                return run(maintainer, view, *args, **kwargs)
            finally:
                self.view_s[view.name] = self.view_s.get(view.name, 0.0) + time.monotonic() - t0
                self.view_jobs[view.name] = (
                    self.view_jobs.get(view.name, 0) + spark_jobs(maintainer.spark) - j0
                )

        maintain.run_view_stage = timed_stage  # ApplyJob._run_views imports it at call time
        ViewMaintainer.run = timed_run
        self._originals = (maintain, stage, run)

    def close(self) -> None:
        """Unwrap (the next size's timer must not count into this one's figures)."""
        from pipelines.views.maintainer import ViewMaintainer

        maintain, stage, run = self._originals
        maintain.run_view_stage, ViewMaintainer.run = stage, run

    def reset(self) -> None:
        self.stage_s, self.view_s, self.stage_jobs, self.view_jobs = 0.0, {}, 0, {}
        self.stage_cpu = 0.0


def cpu_s(spark: Any) -> float:
    """CPU seconds (user + system) of this process and of its Spark JVM so far (/proc/<pid>/stat)."""
    import os
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    pid = spark.sparkContext._gateway.proc.pid
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return me.ru_utime + me.ru_stime + (int(fields[11]) + int(fields[12])) / ticks


def spark_jobs(spark: Any) -> int:
    """Spark jobs started so far in this application (the DAG scheduler's next job id)."""
    counter = spark.sparkContext._jsc.sc().dagScheduler().nextJobId()
    return int(counter if isinstance(counter, int) else counter.get())  # py4j may give the number


def size_run(b: Bench, orders: int) -> dict[str, Any]:
    customers, changes = b.args.customers, b.args.changes
    name = f"views{orders}"
    say(f"{orders:,} orders, {customers:,} customers")
    load_s = load(b, customers, orders)
    pipe = pipeline(b, name)
    b.cdc(f"{name}_snapshot", "snapshot", pipe, "--no-progress")
    spark, job = apply_job(pipe)
    timer = StageTimer()
    t0 = time.monotonic()
    runs = job.run_once()
    bootstrap_s = time.monotonic() - t0
    assert not any(r.error for r in runs), [r.error for r in runs]
    say(f"  loaded in {load_s:.1f}s, bootstrap apply (not timed) {bootstrap_s:.1f}s")

    counts = write_cut(b, customers, orders, changes)
    b.cdc(f"{name}_stream", "stream", pipe, "--until", "current")
    written = sum(counts.values())
    say(f"  cut: {written:,} row changes ({', '.join(f'{k} {v:,}' for k, v in counts.items())})")

    with logsetup.collected() as lines:  # the apply's output, kept in the result
        timer.reset()
        profiler = cProfile.Profile() if b.args.profile else None
        t0, j0, c0 = time.monotonic(), spark_jobs(spark), cpu_s(spark)
        if profiler is not None:
            profiler.enable()
        runs = job.run_once()
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{b.args.profile}.{orders}")
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
        cut_s, cut_jobs, cut_cpu = time.monotonic() - t0, spark_jobs(spark) - j0, cpu_s(spark) - c0
        timer.close()
        assert not any(r.error for r in runs), [r.error for r in runs]
        assert not any(v.error for v in job.view_runs), [v.line() for v in job.view_runs]
        modes = {v.view: v.mode for v in job.view_runs}
        job.report(runs)

    state_dir = b.state(name)
    bases = base_paths(state_dir)
    row: dict[str, Any] = {
        "orders": orders,
        "customers": customers,
        "changes": written,
        "cut": counts,
        "apply_cut_s": round(cut_s, 2),
        "apply_cut_jobs": cut_jobs,
        "apply_cut_cpu_s": round(cut_cpu, 2),
        "stage_jobs": timer.stage_jobs,
        "stage_cpu_s": round(timer.stage_cpu, 2),
        "view_jobs": timer.view_jobs,
        "stage_s": round(timer.stage_s, 2),
        "base_follower_s": round(timer.stage_s - sum(timer.view_s.values()), 2),
        "view_s": {k: round(v, 2) for k, v in timer.view_s.items()},
        "modes": modes,
        "apply_output": lines[:40],
        "views": {},
    }
    for view in VIEWS:
        target = b.work / f"{name}-rebuild-{view}"
        c0 = cpu_s(spark)
        times = [full_recompute(spark, bases, view, target) for _ in range(b.args.repeat)]
        full_cpu = (cpu_s(spark) - c0) / b.args.repeat
        columns = spark.read.format("delta").load(str(target)).columns
        diff = same_rows(spark, out_path(state_dir, view), target, columns)
        rows = spark.read.format("delta").load(str(target)).count()
        floor_s = bare_merge_s(spark, target, VIEWS[view][1], changes)
        row["views"][view] = {
            "bare_merge_s": floor_s,
            "full_s": round(statistics.median(times), 2),
            "full_cpu_s": round(full_cpu, 2),
            "rows": rows,
            "differing_rows": diff,
        }
        say(
            f"  {view}: full recomputation {statistics.median(times):.2f}s, {full_cpu:.1f} CPU s ({rows:,} rows); "
            f"floor: a bare MERGE of {changes:,} of its rows {floor_s:.2f}s; "
            f"incremental out table {'equals it' if diff == 0 else f'DIFFERS in {diff:,} rows'}"
        )
    say(
        f"  incremental cut: view stage {timer.stage_s:.2f}s, {timer.stage_cpu:.1f} CPU s (base follower "
        f"{row['base_follower_s']:.2f}s, {', '.join(f'{k} {v:.2f}s ({modes.get(k)})' for k, v in timer.view_s.items())}); "
        f"whole cdc apply --once incl. the Delta sink {cut_s:.2f}s ({cut_cpu:.1f} CPU s of this process and its JVM)"
    )
    say(
        f"  Spark jobs: view stage {timer.stage_jobs} ({', '.join(f'{k} {v}' for k, v in timer.view_jobs.items())}); "
        f"whole cdc apply --once {cut_jobs}"
    )
    b.sql("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots")
    return row


def body(b: Bench) -> Report:
    args = b.args
    b.results["config"].update(orders=args.orders, customers=args.customers, changes=args.changes)
    b.start_postgres(durable=False)
    rep = Report("Derived views: incremental cut vs full recomputation (bench/views.py)", ("seconds",))
    rep.subtitle = (
        f"{args.customers:,} customers, orders {', '.join(f'{n:,}' for n in args.orders)}; "
        f"a cut of {args.changes:,} changes"
    )
    sizes = b.results["sizes"] = {}
    for orders in args.orders:
        r = sizes[str(orders)] = size_run(b, orders)
        full_total = sum(v["full_s"] for v in r["views"].values())
        part = f"{orders:,} orders"

        def add(
            name: str, seconds: float, role: str, ref: float | None, notes: str, part: str = part
        ) -> None:
            rep.add(
                part,
                name,
                seconds,
                "s",
                role=role,
                ratio=None if ref is None else seconds / ref,
                less_is_better=True,
                seconds=f"{seconds:.2f}",
                notes=notes,
            )

        add(
            "incremental cut: view stage",
            r["stage_s"],
            "cdc",
            full_total,
            f"{r['changes']:,} changes; base follower {r['base_follower_s']:.2f}s + both views; ratio: x both rebuilds",
        )
        for view, v in r["views"].items():
            add(
                f"incremental cut: {view} alone",
                r["view_s"][view],
                "cdc",
                v["full_s"],
                f"{r['modes'].get(view)}; ratio: x its rebuild",
            )
        for view, v in r["views"].items():
            add(
                f"floor: a bare MERGE of {r['changes']:,} rows into {view}",
                v["bare_merge_s"],
                "ceiling",
                v["full_s"],
                "no view SQL, no log, no checks; ratio: x its rebuild",
            )
        for view, v in r["views"].items():
            same = "equal" if v["differing_rows"] == 0 else f"DIFFERS in {v['differing_rows']:,} rows"
            add(
                f"full recomputation: {view}",
                v["full_s"],
                "peer",
                None,
                f"{v['rows']:,} rows; out table {same}",
            )
        add(
            "full recomputation: both views",
            full_total,
            "peer",
            full_total,
            "what a rebuild job costs per cut",
        )
        add(
            "cdc apply --once of the cut",
            r["apply_cut_s"],
            "diag",
            None,
            "the view stage + a Delta sink following both views",
        )
    if len(args.orders) > 1:
        first, last = sizes[str(args.orders[0])], sizes[str(args.orders[-1])]
        grow_inc = last["stage_s"] / first["stage_s"]
        full = [sum(v["full_s"] for v in s["views"].values()) for s in (first, last)]
        rep.summary.append(
            f"growth {args.orders[0]:,} -> {args.orders[-1]:,} orders: incremental cut x{grow_inc:.2f}, "
            f"full recomputation x{full[1] / full[0]:.2f} (target: incremental < 2x; at the largest size "
            f"incremental / full = {last['stage_s'] / full[1]:.2f}, target <= 0.20)"
        )
        b.results["growth"] = {"incremental": grow_inc, "full": full[1] / full[0]}
    return rep


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--orders",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[100_000, 1_000_000],
        help="order counts, one size each (default 100000,1000000)",
    )
    ap.add_argument("--customers", type=int, default=100_000)
    ap.add_argument("--changes", type=int, default=10_000, help="row changes in the measured cut")
    ap.add_argument("--repeat", type=int, default=1, help="full recomputations per view (median reported)")
    ap.add_argument("--profile", help="cProfile the measured cut: stats to PROFILE.<orders>, top 40 printed")
    return ap


if __name__ == "__main__":
    sys.exit(main(parser(), body, prefix="views"))
