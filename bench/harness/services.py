"""The throwaway services a benchmark runs against, from pipelines.devservices (the same code as
`cdc dev up` and the test fixtures), started in one place and stopped by the run's ExitStack."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from cdc.session import run_sql
from pipelines.devservices.postgres import LocalPostgres

DB = "bench"


def say(message: str) -> None:
    print(message, flush=True)


def load_check(loads: dict[str, float], where: str) -> float:
    """The 1-minute load average, kept in `loads`; a warning when other work keeps the CPUs busy
    (the figures are then not comparable with an idle run)."""
    load = os.getloadavg()[0]
    loads[where] = load
    if load > 0.5 * (os.cpu_count() or 1):
        say(
            f"WARNING: 1-min load average is {load:.2f} {where} on {os.cpu_count()} CPUs:"
            " other work is running, expect noisy numbers"
        )
    return load


def postgres(stack: contextlib.ExitStack, work: Path, *, durable: bool) -> tuple[LocalPostgres, str]:
    """A PostgreSQL 15 cluster in work/pg with a `bench` database; (server, version string)."""
    t0 = time.perf_counter()
    pg = LocalPostgres(work / "pg", durable=durable)
    stack.callback(pg.stop)
    pg.start()
    run_sql(pg.dsn(), f"CREATE DATABASE {DB}")
    version = run_sql(pg.dsn(DB), "SELECT version()")[0][0]
    say(f"PostgreSQL up on port {pg.port} in {time.perf_counter() - t0:.1f}s ({version.split(' on ')[0]})")
    return pg, version


def started(stack: contextlib.ExitStack, service: Any, what: str) -> Any:
    """Start a devservices server (LocalRedis, LocalOpenSearch, LocalKafka); stopped with the run."""
    t0 = time.perf_counter()
    stack.callback(service.stop)
    service.start()
    say(f"{what} up in {time.perf_counter() - t0:.1f}s")
    return service
