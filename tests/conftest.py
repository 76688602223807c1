"""Session-wide real services for the integration tests (started once, stopped at the end)."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from pipelines.devservices.postgres import LocalPostgres

# Session fixtures for the other real services live in tests/fixtures/<service>.py.
pytest_plugins = ["tests.fixtures.kafka", "tests.fixtures.redis", "tests.fixtures.opensearch", "tests.fixtures.debezium"]


@pytest.fixture(scope="session")
def pg() -> Iterator[LocalPostgres]:
    """One throwaway PostgreSQL cluster (wal_level=logical) for the whole test session."""
    # Not under pytest's tmp dir: that is private to root and the server runs as `postgres`.
    base = Path(tempfile.mkdtemp(prefix="cdc-test-pg-"))
    server = LocalPostgres(base, durable=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_db(pg: LocalPostgres) -> Iterator[str]:
    """A fresh database for one test; yields its DSN. Slots created in it are dropped afterwards."""
    name = "t_" + uuid.uuid4().hex[:10]
    admin = psycopg2.connect(pg.dsn())
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg.dsn(name)
    finally:
        with admin.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = %s AND active_pid IS NOT NULL",
                (name,),
            )
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s", (name,))
            cur.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="session")
def spark():
    """One SparkSession (local[2], Delta) for the whole test session: JVM start-up is paid once."""
    from pipelines.spark import spark_session

    session = spark_session(master="local[2]")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()
