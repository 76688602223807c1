"""`cdc demo`: the whole path on embedded defaults, on a throwaway local PostgreSQL.

PostgreSQL (from the Debian packages, started in a temp dir) -> snapshot + WAL stream into
the local SQLite log -> Spark applies it to Delta tables -> verify. Everything the demo
writes stays under --dir (default .cdc/demo) so it can be looked at afterwards.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg2
import yaml

from cdc.session import libpq_options
from pipelines.config import load_pipeline
from pipelines.devservices.postgres import LocalPostgres

SCHEMA = (Path(__file__).parent / "examples" / "shop.sql").read_text()

BURST = [
    ("new orders", "INSERT INTO orders (id, customer_id, product_id, qty) SELECT g, 1 + g % 2000, 1 + g % 200, 1 FROM generate_series(10001, 12000) g"),
    ("orders paid", "UPDATE orders SET status = 'paid' WHERE status = 'new' AND id % 2 = 0"),
    ("orders cancelled and deleted", "DELETE FROM orders WHERE id % 97 = 0"),
    ("price changes", "UPDATE products SET price = price * 1.10 WHERE id % 10 = 0"),
    ("customer renamed (big bio left untouched: an unchanged TOAST value)", "UPDATE customers SET name = name || ' jr' WHERE id % 100 = 0"),
    ("customer ids renumbered (primary key change)", "UPDATE customers SET id = id + 100000 WHERE id BETWEEN 1 AND 20"),
    ("new customers", "INSERT INTO customers (id, name, email) SELECT g, 'customer ' || g, NULL FROM generate_series(2001, 2500) g"),
]


def _sql(dsn: str, statements: list[str]) -> None:
    conn = psycopg2.connect(dsn, options=libpq_options())
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for stmt in statements:
                cur.execute(stmt)
    finally:
        conn.close()


def run_demo(directory: Path, keep_server: bool, say: Callable[[str], None]) -> int:
    from cdc.log import open_log
    from cdc.reader import StreamReader
    from pipelines.apply.job import ApplyJob
    from pipelines.spark import spark_session
    from pipelines.verify import run_verify
    from snapshot.runner import run_snapshot

    started = time.monotonic()
    step = _Steps(say, 6)
    directory = directory.resolve()
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    server_dir = Path(tempfile.mkdtemp(prefix="cdc-demo-pg-"))
    server = LocalPostgres(server_dir, durable=False)
    try:
        step("starting a throwaway PostgreSQL (wal_level=logical) on 127.0.0.1")
        server.start()
        admin = server.dsn()
        _sql(admin, ["CREATE DATABASE shop"])
        dsn = server.dsn("shop")
        say(f"      listening on port {server.port}; data in {server_dir}")

        step("creating the shop schema: customers (2,000), products (200), orders (10,000)")
        _sql(dsn, [SCHEMA])

        pipeline_file = directory / "shop.yml"
        pipeline_file.write_text(
            yaml.safe_dump(
                {
                    "name": "shop",
                    "source": {"postgres": {"dsn": "${SHOP_DSN}", "tables": ["public.customers", "public.products", "public.orders"]}},
                    "state_dir": ".",
                    "sinks": [{"name": "lake", "delta": {"path": "lake", "mode": "scd1"}}],
                    "spark": {"master": "local[2]"},
                },
                sort_keys=False,
            )
        )
        import os

        os.environ["SHOP_DSN"] = dsn
        pipeline = load_pipeline(pipeline_file)

        step("snapshot into the log (exported snapshot + parallel COPY)")
        snap = run_snapshot(pipeline, progress=False, say=lambda m: say(f"      {m}"))
        say(f"      {snap.total_rows:,} rows in {snap.seconds:.1f}s")

        step("a burst of changes on the source, then `cdc stream --until current`")
        for label, stmt in BURST:
            _sql(dsn, [stmt])
            say(f"      {label}")
        log = open_log(pipeline)
        try:
            stats = StreamReader(pipeline, log, until="current", say=lambda m: say(f"      {m}"), install_signal_handlers=False).run()
        finally:
            log.close()

        step("Spark applies the log to Delta tables (`cdc apply --once`)")
        spark = spark_session(pipeline)
        job = ApplyJob(pipeline, spark, lambda m: say(f"      {m}"))
        runs = job.run_once()
        job.report(runs)
        if any(r.error for r in runs):
            return 4

        step("`cdc verify`: every Delta table against the source")
        code = run_verify(pipeline, spark, None, 0, lambda m: say(f"      {m}"))

        lake = directory / "lake"
        say("")
        say(f"done in {time.monotonic() - started:.0f}s: {stats.events:,} changes streamed, verify exit code {code}")
        say(f"  pipeline file: {pipeline_file}")
        say(f"  log:           {pipeline.local_log_path} (try: cdc log read {pipeline_file} --table public.orders --limit 3)")
        for table in ("customers", "products", "orders"):
            path = lake / "public" / table
            rows = spark.read.format("delta").load(str(path)).count()
            say(f"  Delta table public.{table}: {rows:,} rows at {path}")
        query = f"SELECT status, count(*) AS orders FROM delta.`{lake}/public/orders` GROUP BY status ORDER BY status"
        say("  query it with Spark SQL:")
        say(f"""    .venv/bin/python -c 'from pipelines.spark import spark_session; spark_session().sql("{query}").show()'""")
        return code
    finally:
        if keep_server:
            say(f"PostgreSQL keeps running: SHOP_DSN={server.dsn('shop')} (stop: pg_ctl -D {server.data_dir} stop as user postgres)")
        else:
            server.stop()
            shutil.rmtree(server_dir, ignore_errors=True)


class _Steps:
    def __init__(self, say: Callable[[str], None], total: int):
        self.say, self.total, self.n, self.t = say, total, 0, time.monotonic()

    def __call__(self, text: str) -> None:
        self.n += 1
        self.say(f"[{self.n}/{self.total}] {text}  (+{time.monotonic() - self.t:.0f}s)")
