"""One round of the campaign: a fresh database, a pipeline with four followers (Delta, Iceberg on
the embedded SQLite catalog, Redis, tantivy) on the local or the Kafka log, `cdc run` under a
supervisor, a random workload, random faults at random moments, then convergence and the
comparison of every follower with the source.

Every random choice of a round comes from its seed (printed first), so a failing round can be run
again alone: `bench/chaos.py --replay SEED --log local|kafka`. Timing still varies between runs (a
fault lands in another place of a batch), which is what a campaign is for.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.bench import BIN
from harness.services import say

from cdc.session import run_sql
from chaosing import compare
from chaosing.faults import FAULTS, KAFKA_ONLY, LOCAL_ONLY, Rig, Supervisor
from chaosing.workload import SCHEMA, TABLES, RandomWorkload

SPARK = {
    "master": "local[2]",
    "trigger_interval_s": 2,
    "conf": {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1", "spark.sql.shuffle.partitions": 2},
    # a stalled apply ends `cdc run` (pipelines/apply/stall.py); the supervisor starts it again. Not
    # less: on 2 cores at load 14 a cut took 4 minutes, and a 120 s limit ended a run whose cut may
    # only have been slow
    "stall_timeout_s": 600,
}
LOG_FS_SIZE = "256m"  # room for a round's local log, small enough to fill in a moment


@dataclass
class RoundResult:
    seed: int
    log: str
    faults: list[tuple[str, float | None]] = field(
        default_factory=list
    )  # (kind, seconds to converge; None: did not)
    workload: dict[str, int] = field(default_factory=dict)
    rolled_back: int = 0
    tallies: dict[str, compare.Tally] = field(default_factory=dict)  # per follower
    verify_code: int | None = None
    run_exits: list[int] = field(default_factory=list)
    error: str | None = None

    @property
    def clean(self) -> bool:
        return (
            self.error is None
            and self.verify_code == 0
            and all(t.clean for t in self.tallies.values())
            and all(s is not None for _, s in self.faults)
        )


@dataclass
class Services:
    pg: Any
    redis: Any
    kafka: Any | None
    logfs: Path | None  # a small filesystem for the local logs (None: none could be mounted)


@contextlib.contextmanager
def log_filesystem(where: Path) -> Iterator[Path | None]:
    """A small tmpfs at `where` for the local logs, so that a full disk can be made; None where
    mounting is refused (not root): the disk-full fault is then left out, and said so."""
    where.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={LOG_FS_SIZE}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        say(f"no disk-full faults: mounting a tmpfs was refused ({done.stderr.strip()})")
        yield None
        return
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def play(
    work: Path,
    services: Services,
    log: str,
    seed: int,
    seconds: float,
    kinds: list[str],
    count: int | None = None,
    order: list[str] | None = None,
) -> RoundResult:
    """Run one round; every failure of the round is caught into its result. Faults are drawn for
    `seconds`, or exactly `count` of them when it is given (the same seed then injects the same
    kinds in the same order however slow the machine is), or are `order`'s kinds one after the
    other (the suite's slice: its faults fixed, their moments drawn from the seed)."""
    say(f"\n== round seed {seed} on the {log} log (replay: bench/chaos.py --replay {seed} --log {log}) ==")
    result = RoundResult(seed, log)
    rng = random.Random(seed)
    name = f"chaos_{log}_{seed}"
    db_dsn = _fresh_database(services.pg, name)
    pipeline = _pipeline_file(work, services, log, name, seed)
    env = {**os.environ, "CHAOS_DSN": db_dsn}
    _cdc(env, "snapshot", pipeline, timeout=600)
    logs = work / name / "runs"
    logs.mkdir(parents=True)
    sup = Supervisor([str(BIN / "cdc"), "run", str(pipeline)], env, logs)
    rig = Rig(
        sup,
        services.pg,
        services.redis,
        services.kafka,
        _log_dir(services, name) if log == "local" else None,
        rng,
    )
    allowed = [
        k
        for k in kinds
        if not (k in KAFKA_ONLY and log != "kafka") and not (k in LOCAL_ONLY and rig.log_dir is None)
    ]
    load = RandomWorkload(db_dsn, seed)
    sup.start()
    load.start()
    try:
        end = time.monotonic() + seconds
        planned = [k for k in order or [] if k in allowed]  # disk_full needs the small filesystem
        if planned:
            count = len(planned)
        while len(result.faults) < count if count is not None else time.monotonic() < end:
            time.sleep(rng.uniform(2, 8))
            kind = planned[len(result.faults)] if planned else rng.choice(allowed)
            before = _lsn(db_dsn)
            say(f"  fault {kind} at source position {before}")
            FAULTS[kind](rig)
            took = _converge(env, pipeline, f"--lsn={before}", timeout=600)
            result.faults.append((kind, took))
            say(
                f"    followers past {before} "
                + (f"after {took:.1f} s" if took is not None else "NOT within 600 s")
            )
        load.stop()
        _settle(db_dsn)
        took = _converge(env, pipeline, "--current", timeout=900)
        if took is None:
            result.error = "the followers did not reach the source's last position within 900 s"
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        load.halt.set()
        sup.stop()
    result.workload = dict(load.done)
    result.rolled_back = sum(load.failed.values())
    result.run_exits = sup.exits
    if result.error is None:
        _compare(result, services, db_dsn, work, name)
        result.verify_code = _cdc(env, "verify", pipeline, timeout=900, check=False).returncode
    if result.error is not None:
        _say_last_run(logs)
    _teardown(env, pipeline, services, name, work, keep=not result.clean)
    return result


def _compare(result: RoundResult, services: Services, dsn: str, work: Path, name: str) -> None:
    import redis

    client = redis.Redis.from_url(_redis_url(services, result.seed))
    for table in TABLES:
        source = compare.source_table(dsn, table)
        schema, tname = table.split(".")
        held = {
            "delta": compare.delta_table(work / name / "lake" / schema / tname),
            "iceberg": compare.iceberg_table(work / name / "ice", table),
            "redis": compare.redis_table(client, table),
            "tantivy": compare.tantivy_table(work / name / "search" / schema / tname),
        }
        for follower, (rows, doubled) in held.items():
            tally = compare.compare(f"{follower} {table}", source, rows, doubled)
            result.tallies.setdefault(follower, compare.Tally()).add(tally)
            for line in tally.examples:
                say(f"    MISMATCH {line}")


def _say_last_run(logs: Path, lines: int = 60) -> None:
    """The end of the newest `cdc run` log: a round that failed shows where the run stood, even
    where the kept directory is gone by the time someone looks (pytest keeps three)."""
    runs = sorted(logs.glob("run-*.log"), key=lambda p: int(p.stem.split("-")[1]))
    if runs:
        tail = runs[-1].read_text(errors="replace").splitlines()[-lines:]
        say(f"  the last {len(tail)} lines of {runs[-1].name}:\n" + "\n".join(f"    {line}" for line in tail))


# -- plumbing --------------------------------------------------------------------------------------------
def _fresh_database(pg: Any, name: str) -> str:
    run_sql(pg.dsn(), f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}")
    dsn = pg.dsn(name)
    run_sql(dsn, *SCHEMA)
    return dsn


def _settle(dsn: str) -> None:
    """One change to every table after the workload: a column the workload added last reaches the
    log only with its table's next change (pgoutput sends no DDL; README "Schema changes"), which
    the round would otherwise report as every row stale. A row of a key the workload never uses
    is inserted and deleted, so the tables end as the workload left them."""
    run_sql(
        dsn,
        *(f"INSERT INTO {t}(id) VALUES (-1)" for t in TABLES),
        *(f"DELETE FROM {t} WHERE id = -1" for t in TABLES),
    )


def _redis_url(services: Services, seed: int) -> str:
    return f"{services.redis.url.rsplit('/', 1)[0]}/{seed % 16}"


def _log_dir(services: Services, name: str) -> Path | None:
    return services.logfs / name if services.logfs is not None else None


def _pipeline_file(work: Path, services: Services, log: str, name: str, seed: int) -> Path:
    import redis
    import yaml

    base = work / name
    base.mkdir(parents=True)
    redis.Redis.from_url(_redis_url(services, seed)).flushdb()
    if log == "kafka":
        log_section: dict[str, Any] = {
            "kafka": {"bootstrap_servers": services.kafka.bootstrap, "topic_prefix": name}
        }
    else:
        where = _log_dir(services, name) or base / "log"
        where.mkdir(parents=True, exist_ok=True)
        log_section = {"local": {"path": str(where)}}
    doc = {
        "name": name,
        "source": {"postgres": {"dsn": "${CHAOS_DSN}", "tables": list(TABLES)}},
        "log": log_section,
        "state_dir": str(base / "state"),
        "sinks": [
            {"name": "lake", "delta": {"path": str(base / "lake")}},
            {"name": "ice", "iceberg": {"warehouse": str(base / "ice")}},
            {"name": "cache", "redis": {"url": _redis_url(services, seed), "tables": list(TABLES)}},
            {
                "name": "search",
                "search": {"engine": "tantivy", "path": str(base / "search"), "tables": list(TABLES)},
            },
        ],
        "spark": SPARK,
    }
    path = base / "pipeline.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _cdc(env: dict[str, str], *args: Any, timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(BIN / "cdc"), *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"cdc {args[0]} exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
    return done


def _lsn(dsn: str) -> str:
    for _ in range(60):  # the server may still be starting after the previous fault
        try:
            return run_sql(dsn, "SELECT pg_current_wal_lsn()::text")[0][0]
        except Exception:
            time.sleep(1)
    raise RuntimeError("the source did not answer for 60 s")


def _converge(env: dict[str, str], pipeline: Path, target: str, timeout: float) -> float | None:
    """Seconds until every follower applied the source up to target; None if not within timeout."""
    began = time.monotonic()
    while True:
        left = timeout - (time.monotonic() - began)
        if left <= 0:
            return None
        done = _cdc(
            env, "wait", pipeline, target, f"--timeout={min(left, 60):.0f}", timeout=left + 60, check=False
        )
        if done.returncode == 0:
            return time.monotonic() - began
        if done.returncode not in (1, 4):  # 1: not yet; 4: source or log briefly unreachable (a fault)
            raise RuntimeError(f"cdc wait exited {done.returncode}: {(done.stdout + done.stderr)[-1000:]}")
        time.sleep(1)


def _teardown(
    env: dict[str, str], pipeline: Path, services: Services, name: str, work: Path, keep: bool
) -> None:
    """Drop the slot and the database. A round that found something keeps everything to look at
    instead: its database, state and followers, and a copy of its local log (the campaign's
    tmpfs goes when the campaign ends); only its slot is dropped, so no WAL is held for it."""
    log_dir = _log_dir(services, name)
    if keep:
        if log_dir is not None and log_dir.exists():
            shutil.copytree(log_dir, work / name / "log", dirs_exist_ok=True)
        run_sql(
            services.pg.dsn(),
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
            params=(name,),
        )
        say(f"  kept {work / name} and database {name} for a look")
    else:
        subprocess.run(
            [str(BIN / "cdc"), "teardown", str(pipeline), "--drop-slot", "--yes"],
            env=env,
            capture_output=True,
            timeout=300,
        )
        run_sql(services.pg.dsn(), f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        shutil.rmtree(work / name, ignore_errors=True)
    if log_dir is not None:
        shutil.rmtree(log_dir, ignore_errors=True)
