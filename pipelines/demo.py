"""`cdc demo`: the whole path on embedded defaults, on a throwaway local PostgreSQL.

PostgreSQL (from the Debian packages, started in a temp dir) -> snapshot + WAL stream into
the local SQLite log -> Spark applies it to the three kinds of followers: Delta tables, an
embedded tantivy search index and a Redis cache (a throwaway redis-server; skipped with a
line saying so when the package is missing) -> `cdc verify` of every follower. With --iceberg an
Iceberg follower too (the embedded SQLite catalog, docs/follower-iceberg.md), read back with
pyiceberg at the end. Everything the demo writes stays under --dir (default .cdc/demo) so it can be
looked at afterwards.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

import orjson
import yaml

from cdc.ground import logsetup
from cdc.ground.errors import ServiceError
from cdc.session import run_sql
from pipelines.devservices.postgres import LocalPostgres
from sinks.registry import load_pipeline

logger = logging.getLogger(__name__)

SCHEMA = (Path(__file__).parent / "examples" / "shop.sql").read_text()

BURST = [
    (
        "new orders",
        "INSERT INTO orders (id, customer_id, product_id, qty) SELECT g, 1 + g % 2000, 1 + g % 200, 1 FROM generate_series(10001, 12000) g",
    ),
    ("orders paid", "UPDATE orders SET status = 'paid' WHERE status = 'new' AND id % 2 = 0"),
    ("orders cancelled and deleted", "DELETE FROM orders WHERE id % 97 = 0"),
    ("price changes", "UPDATE products SET price = price * 1.10 WHERE id % 10 = 0"),
    (
        "customer renamed (big bio left untouched: an unchanged TOAST value)",
        "UPDATE customers SET name = name || ' jr' WHERE id % 100 = 0",
    ),
    (
        "customer ids renumbered (primary key change)",
        "UPDATE customers SET id = id + 100000 WHERE id BETWEEN 1 AND 20",
    ),
    (
        "new customers",
        "INSERT INTO customers (id, name, email) SELECT g, 'customer ' || g, NULL FROM generate_series(2001, 2500) g",
    ),
]


def run_demo(directory: Path, keep_server: bool, iceberg: bool = False) -> int:
    from cdc.log import open_log
    from cdc.reader import StreamReader
    from pipelines.apply.job import ApplyJob
    from pipelines.devservices.redis import LocalRedis
    from pipelines.spark import spark_session
    from pipelines.verify import run_verify
    from snapshot.runner import run_snapshot

    started = time.monotonic()
    step = _Steps(7)
    directory = directory.resolve()
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    server_dir = Path(tempfile.mkdtemp(prefix="cdc-demo-pg-"))
    server = LocalPostgres(server_dir, durable=False)
    local_redis = LocalRedis(server_dir / "redis", appendonly=False)
    redis: LocalRedis | None = local_redis  # None once it could not start
    try:
        step("starting a throwaway PostgreSQL (wal_level=logical) and Redis on 127.0.0.1")
        server.start()
        admin = server.dsn()
        run_sql(admin, "CREATE DATABASE shop")
        dsn = server.dsn("shop")
        logger.info(f"      PostgreSQL listening on port {server.port}; data in {server_dir}")
        try:
            local_redis.start()
            logger.info(f"      Redis listening on port {local_redis.port}")
        except ServiceError as exc:
            redis = None
            logger.info(f"      no Redis, so the demo skips the cache follower: {exc}")

        step("creating the shop schema: customers (2,000), products (200), orders (10,000)")
        run_sql(dsn, SCHEMA)

        pipeline_file = directory / "shop.yml"
        pipeline_file.write_text(
            yaml.safe_dump(
                {
                    "name": "shop",
                    "source": {
                        "postgres": {
                            "dsn": "${SHOP_DSN}",
                            "tables": ["public.customers", "public.products", "public.orders"],
                        }
                    },
                    "state_dir": ".",
                    "sinks": _sinks(redis.url if redis else None, iceberg),
                    "spark": {"master": "local[2]"},
                },
                sort_keys=False,
            )
        )
        import os

        os.environ["SHOP_DSN"] = dsn
        pipeline = load_pipeline(pipeline_file)

        step("snapshot into the log (exported snapshot + parallel COPY)")
        with logsetup.prefixed("      "):
            snap = run_snapshot(pipeline, progress=False)
        logger.info(f"      {snap.total_rows:,} rows in {snap.seconds:.1f}s")

        step("a burst of changes on the source, then `cdc stream --until current`")
        for label, stmt in BURST:
            run_sql(dsn, stmt)
            logger.info(f"      {label}")
        log = open_log(pipeline)
        try:
            with logsetup.prefixed("      "):
                stats = StreamReader(pipeline, log, until="current", install_signal_handlers=False).run()
        finally:
            log.close()

        step("Spark applies the log to every follower (`cdc apply --once`)")
        spark = spark_session(pipeline)
        job = ApplyJob(pipeline, spark)
        with logsetup.prefixed("      "):
            runs = job.run_once()
            job.report(runs)
        if any(r.error for r in runs):
            return 4

        step("`cdc verify`: every follower against the source")
        with logsetup.prefixed("      "):
            code = run_verify(pipeline, spark, None, 0)

        step("reading the followers: a search and a cache lookup")
        _show_followers(pipeline, redis.url if redis else None)

        lake = directory / "lake"
        logger.info("")
        logger.info(
            f"done in {time.monotonic() - started:.0f}s: {stats.events:,} changes streamed, verify exit code {code}"
        )
        logger.info(f"  pipeline file: {pipeline_file}")
        logger.info(
            f"  log:           {pipeline.local_log_path} (try: cdc log read {pipeline_file} --table public.orders --limit 3)"
        )
        for table in ("customers", "products", "orders"):
            path = lake / "public" / table
            rows = spark.read.format("delta").load(str(path)).count()
            logger.info(f"  Delta table public.{table}: {rows:,} rows at {path}")
        query = f"SELECT status, count(*) AS orders FROM delta.`{lake}/public/orders` GROUP BY status ORDER BY status"
        logger.info("  query it with Spark SQL:")
        logger.info(
            f"""    .venv/bin/python -c 'from pipelines.spark import spark_session; spark_session().sql("{query}").show()'"""
        )
        logger.info("  or without Spark, with delta-rs / Polars (docs/reading-the-lake.md):")
        logger.info(
            f"""    .venv/bin/python -c 'import polars; print(polars.read_delta("{lake}/public/orders"))'"""
        )
        if iceberg:
            _show_iceberg(pipeline, directory / "ice")
        return code
    finally:
        if keep_server:
            logger.info(
                f"PostgreSQL keeps running: SHOP_DSN={server.dsn('shop')} (stop: pg_ctl -D {server.data_dir} stop as user postgres)"
            )
            if redis:
                logger.info(f"Redis keeps running: REDIS_URL={redis.url} (stop: kill {redis.pid()})")
        else:
            if redis:
                redis.stop()
            server.stop()
            shutil.rmtree(server_dir, ignore_errors=True)


def _sinks(redis_url: str | None, iceberg: bool) -> list[dict]:
    sinks: list[dict] = [
        {"name": "lake", "delta": {"path": "lake", "mode": "scd1"}},
        {
            "name": "search",
            "search": {
                "engine": "tantivy",
                "path": "search",
                "tables": ["public.products", "public.customers"],
            },
        },
    ]
    if redis_url:
        sinks.append(
            {"name": "cache", "redis": {"url": redis_url, "tables": ["public.customers", "public.products"]}}
        )
    if iceberg:  # every table, in Iceberg's JDBC catalog in the SQLite file ice/catalog.db
        sinks.append({"name": "ice", "iceberg": {"warehouse": "ice"}})
    return sinks


def _show_iceberg(pipeline, warehouse: Path) -> None:
    """Each Iceberg table's rows counted by pyiceberg (no JVM), and a pyiceberg + Polars command."""
    from sinks.iceberg.catalog import pyiceberg_catalog

    catalog = pyiceberg_catalog(next(s for s in pipeline.sinks if s.name == "ice"), pipeline)
    for table in ("customers", "products", "orders"):
        rows = catalog.load_table(f"public.{table}").scan().to_arrow().num_rows
        logger.info(f"  Iceberg table public.{table}: {rows:,} rows (catalog {warehouse}/catalog.db)")
    logger.info("  read it with pyiceberg / Polars, no Spark (docs/follower-iceberg.md):")
    logger.info(
        "    .venv/bin/python -c 'from pyiceberg.catalog.sql import SqlCatalog; "
        f"""c = SqlCatalog("ice", uri="sqlite:///{warehouse}/catalog.db", warehouse="file://{warehouse}"); """
        """print(c.load_table("public.orders").scan().to_polars())'"""
    )


def _show_followers(pipeline, redis_url: str | None) -> None:
    from sinks.search.query import run_search

    logger.info('      $ cdc search shop.yml public.products "oak lamp" --limit 3')
    for line in run_search(pipeline, "public.products", "oak lamp", "search", 3):
        logger.info(f"      {line}")
    if redis_url:
        import redis as redis_client

        client = redis_client.Redis.from_url(redis_url)
        try:
            value = client.get("public.customers:100")
        finally:
            client.close()
        logger.info(
            "      $ redis-cli GET public.customers:100   (renamed; its long bio is a TOAST value the update left unchanged)"
        )
        logger.info(f"      {_shorten(value)}")


def _shorten(value: bytes | str | None) -> str:
    """The cached JSON with long strings cut, so a 6 kB bio fits on a line."""
    if value is None:
        return "(missing)"
    row = orjson.loads(value)
    for k, v in row.items():
        if isinstance(v, str) and len(v) > 40:
            row[k] = f"{v[:24]}... ({len(v):,} chars)"
    return orjson.dumps(row).decode()


class _Steps:
    def __init__(self, total: int):
        self.total, self.n, self.t = total, 0, time.monotonic()

    def __call__(self, text: str) -> None:
        self.n += 1
        logger.info(f"[{self.n}/{self.total}] {text}  (+{time.monotonic() - self.t:.0f}s)")
