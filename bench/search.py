"""Search follower benchmark: changes/s of `cdc apply` into tantivy and into OpenSearch.

One run, one machine, throwaway services it starts and removes itself: a PostgreSQL 15
cluster (pipelines.devservices.postgres.LocalPostgres, wal_level=logical, fsync off: the
capture side is not what is measured here) and a real single-node OpenSearch 2.x
(pipelines.devservices.opensearch.LocalOpenSearch).

Workload (the issue's bench): a 10-column table (the shape of bench/capture.py: bigint key,
integer, numeric(12,2), float8, text, varchar, boolean, timestamptz, date, uuid) with --keys
rows (default 100,000), snapshotted and applied to both followers (the "initial" rows), then
--changes changes (default 1,000,000) over those keys in 1000-change transactions, each
900 updates (a sliding block of keys), 50 deletes and 50 inserts (the same 50 keys deleted and
inserted back), captured by `cdc stream --until current` into the local log. Then, timed:

    cdc apply PIPELINE --once --sink tantivy
    cdc apply PIPELINE --once --sink opensearch

each once (a follower's checkpoint moves on, so a cut is applied once), as a user runs it:
the real console entry in a subprocess, wall time from spawn to exit (Spark's JVM start-up
included) and the apply time the command reports itself ("applied cut ... in X s": reading
the log, net change per key, writing the index). The rate is log changes / time; "docs" is
how many index writes the net change amounted to (+inserted ~updated -deleted).

    .venv/bin/python bench/search.py [--changes N] [--keys N] [--verify] [--keep] [--json out.json]

A third measurement, the **floor**, runs in this process on its own SparkSession (start-up not
counted): the same log range read, reduced to the net change per key and handed to Python
executors as the sinks get it (`sinks.search.documents.write_frame`), but written nowhere. It
is what any follower pays before its engine does anything; apply time minus floor is the
engine's share. `--no-floor` skips it.

--verify also runs `cdc verify --sink <name>` for both followers (not timed into the rates).
About 6-8 minutes at the default size on 2 idle cores (more when the machine is busy: the load
average is printed at the start and the end).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg2
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import COLUMNS, say  # noqa: E402

from cdc.session import libpq_options  # noqa: E402
from pipelines.devservices.opensearch import LocalOpenSearch  # noqa: E402
from pipelines.devservices.postgres import LocalPostgres  # noqa: E402

BIN = Path(sys.executable).parent  # .venv/bin: the `cdc` console entry lives next to the interpreter
DB = "bench"
TABLE = "public.bench_search"
TXN = 1000
UPDATES, DELETES = 900, 50  # per transaction; as many inserts as deletes

ROW_EXPR = """
    g, mod(g, 100000)::int, (mod(g, 10000000) / 100.0)::numeric(12,2), g * 0.731::float8,
    'note ' || left(md5(g::text), 15), 'code-' || mod(g, 9973)::text, mod(g, 3) = 0,
    timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', date '2024-01-01' + mod(g, 3650)::int,
    md5(g::text)::uuid
"""
UPDATE_SET = """
    qty = qty + 1, price = price + 0.01, score = score * 1.5, note = 'edit ' || left(md5((id + %(k)s)::text), 15),
    flag = NOT flag, updated_at = updated_at + interval '1 minute'
"""


@dataclass
class Run:
    name: str
    wall_s: float
    code: int
    apply_s: float | None = None
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    stale: int = 0
    changes: int = 0
    out: str = field(default="", repr=False)

    @property
    def docs(self) -> int:
        return self.inserted + self.updated + self.deleted


_APPLIED = re.compile(r"applied cut \d+ \([^)]*\) in ([0-9.]+)s: (.*)")
_COUNTS = re.compile(r"\+([0-9,]+) ~([0-9,]+) -([0-9,]+)(?: \(([0-9,]+) not newer)?")


def cdc(*args: str | Path, env: dict[str, str], timeout: float = 3600) -> tuple[int, str, float]:
    """Run the real console entry; (exit code, stdout, wall seconds from spawn to exit)."""
    started = time.monotonic()
    done = subprocess.run(
        [str(BIN / "cdc"), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        say(f"  cdc {' '.join(map(str, args))} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done.returncode, done.stdout, wall


def timed_apply(name: str, sink: str, pipeline: Path, env: dict[str, str], changes: int) -> Run:
    code, out, wall = cdc("apply", pipeline, "--once", "--sink", sink, env=env)
    run = Run(name, wall, code, changes=changes, out=out)
    m = _APPLIED.search(out)
    if m:
        run.apply_s = float(m.group(1))
        c = _COUNTS.search(m.group(2))
        if c:
            run.inserted, run.updated, run.deleted = (int(x.replace(",", "")) for x in c.groups()[:3])
            run.stale = int(c.group(4).replace(",", "")) if c.group(4) else 0
    rate = f"{changes / wall:,.0f} changes/s wall" + (
        f", {changes / run.apply_s:,.0f}/s apply" if run.apply_s else ""
    )
    say(
        f"  {name}: {wall:.1f}s wall, apply {run.apply_s or 0:.1f}s: {rate}; docs +{run.inserted:,} ~{run.updated:,} -{run.deleted:,}"
    )
    return run


def applied_end(state_dir: Path, sink: str) -> int:
    """The log offset of the bench table a follower has applied up to (from its checkpoint)."""
    ckpt = json.loads((state_dir / "checkpoints" / f"{sink}.json").read_text())
    return ckpt["tables"][TABLE][1]


def _count(rows) -> list[int]:
    return [sum(1 for _ in rows)]


def floor(pipeline: Path, after: int, upto: int, changes: int) -> Run:
    """Read (after, upto] of the log, reduce it to the net change, bring the rows to Python executors."""
    from cdc.ground.config import load_pipeline
    from cdc.ground.tables import TableName
    from cdc.log import open_log_view
    from pipelines.apply.readers import change_reader
    from pipelines.spark import spark_session
    from sinks.changes import TableBatch
    from sinks.search.documents import write_frame

    p = load_pipeline(pipeline)
    spark = spark_session(p)
    log = open_log_view(p)
    try:
        table = TableName.parse(TABLE)
        started = time.monotonic()
        schema = log.schema(table)
        state = next(t for t in log.tables() if t.table == table)
        raw = change_reader(log).read_changes(spark, table, after, upto, schema)
        batch = TableBatch(table, schema, raw, False, state.snapshot_lsn, after, upto, log.value_kind)
        net = batch.net()
        frame, _layout = write_frame(spark, batch, net)
        rows = sum(frame.rdd.mapPartitions(_count).collect())
        elapsed = time.monotonic() - started
        batch.release()
    finally:
        log.close()
    say(
        f"  floor: {elapsed:.1f}s for {changes:,} changes -> {rows:,} net rows in Python: {changes / elapsed:,.0f} changes/s"
    )
    return Run("floor (no engine)", elapsed, 0, apply_s=elapsed, changes=changes, updated=rows)


def sql(dsn: str, *statements: str, params: dict | None = None) -> None:
    conn = psycopg2.connect(dsn, options=libpq_options())
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for stmt in statements:
                cur.execute(stmt, params)
    finally:
        conn.close()


def workload(dsn: str, keys: int, changes: int) -> dict[str, int]:
    """`changes` changes in 1000-change transactions over keys 1..keys (every key exists after each)."""
    txns = changes // TXN
    conn = psycopg2.connect(dsn, options=libpq_options())
    try:
        with conn.cursor() as cur:
            for k in range(txns):
                up = (k * UPDATES) % keys
                dl = (k * DELETES * 7 + keys // 2) % keys
                block = f"SELECT mod(%(s)s + i, {keys}) + 1 FROM generate_series(0, %(n)s - 1) i"
                cur.execute(
                    f"UPDATE bench_search SET {UPDATE_SET} WHERE id IN ({block})",
                    {"k": k, "s": up, "n": UPDATES},
                )
                cur.execute(f"DELETE FROM bench_search WHERE id IN ({block})", {"s": dl, "n": DELETES})
                cur.execute(
                    f"INSERT INTO bench_search SELECT {ROW_EXPR} FROM ({block}) AS b(g)",
                    {"s": dl, "n": DELETES},
                )
                conn.commit()
    finally:
        conn.close()
    return {
        "transactions": txns,
        "updates": txns * UPDATES,
        "deletes": txns * DELETES,
        "inserts": txns * DELETES,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--verify", action="store_true", help="also `cdc verify` both followers afterwards")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (services stopped)")
    ap.add_argument("--json", type=Path, help="write every number here")
    ap.add_argument("--heap", default="1g", help="OpenSearch JVM heap (default 1g)")
    ap.add_argument("--no-floor", action="store_true", help="skip the in-process floor measurement")
    args = ap.parse_args()
    if args.changes % TXN or args.keys < UPDATES:
        ap.error(f"--changes must be a multiple of {TXN} and --keys at least {UPDATES}")

    work = Path(tempfile.mkdtemp(prefix="cdc-bench-search-"))
    os.chmod(work, 0o755)  # the PostgreSQL server runs as its own user and must reach work/pg
    say(f"search bench: {args.changes:,} changes over {args.keys:,} keys; work dir {work}")
    say(f"machine: {platform.platform()}, {os.cpu_count()} CPU(s), load {os.getloadavg()[0]:.1f}")
    pg = LocalPostgres(work / "pg", durable=False)
    node = LocalOpenSearch(work / "opensearch", heap=args.heap)
    runs: list[Run] = []
    result: dict = {"changes": args.changes, "keys": args.keys, "load_at_start": os.getloadavg()}
    try:
        t = time.monotonic()
        pg.start()
        node.start()
        say(f"services up in {time.monotonic() - t:.1f}s: PostgreSQL on {pg.port}, OpenSearch at {node.url}")
        sql(pg.dsn(), f"CREATE DATABASE {DB}")
        dsn = pg.dsn(DB)
        t = time.monotonic()
        sql(
            dsn,
            f"CREATE TABLE bench_search ({COLUMNS})",
            f"INSERT INTO bench_search SELECT {ROW_EXPR} FROM generate_series(1, {args.keys}) g",
            "VACUUM ANALYZE bench_search",
        )
        say(f"table loaded with {args.keys:,} rows in {time.monotonic() - t:.1f}s")

        pipeline = work / "bench_search.yml"
        doc = {
            "name": "bench_search",
            "source": {"postgres": {"dsn": "${BENCH_DSN}", "tables": [TABLE]}},
            "state_dir": str(work / "state"),
            "sinks": [
                {"name": "tantivy", "search": {"engine": "tantivy", "tables": [TABLE]}},
                {
                    "name": "opensearch",
                    "search": {"engine": "opensearch", "tables": [TABLE], "hosts": [node.url], "replicas": 0},
                },
            ],
            "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": 4}},
        }
        pipeline.write_text(yaml.safe_dump(doc, sort_keys=False))
        env = {**os.environ, "BENCH_DSN": dsn}

        code, out, wall = cdc("snapshot", pipeline, "--no-progress", env=env)
        if code:
            return 4
        say(f"cdc snapshot: {wall:.1f}s")
        for sink in ("tantivy", "opensearch"):
            runs.append(timed_apply(f"initial {sink}", sink, pipeline, env, args.keys))

        t = time.monotonic()
        counts = workload(dsn, args.keys, args.changes)
        say(f"workload: {counts} in {time.monotonic() - t:.1f}s")
        result["workload"] = counts
        sql(
            dsn, "SET synchronous_commit = on", "CREATE TABLE flush_marker(x int)"
        )  # make every commit durable
        code, out, wall = cdc("stream", pipeline, "--until", "current", env=env)
        if code:
            return 4
        streamed = re.search(r"streamed ([0-9,]+) events", out)
        events = int(streamed.group(1).replace(",", "")) if streamed else args.changes
        say(f"cdc stream --until current: {events:,} events in {wall:.1f}s")
        result["log_events"] = events

        state_dir = work / "state"
        before = applied_end(state_dir, "tantivy")
        for sink in ("tantivy", "opensearch"):
            runs.append(timed_apply(f"apply {sink}", sink, pipeline, env, events))
        if not args.no_floor:
            os.environ["BENCH_DSN"] = dsn
            runs.append(floor(pipeline, before, applied_end(state_dir, "tantivy"), events))

        if args.verify:
            for sink in ("tantivy", "opensearch"):
                code, out, wall = cdc("verify", pipeline, "--sink", sink, env=env)
                say(
                    f"cdc verify --sink {sink}: exit {code} in {wall:.1f}s: {out.strip().splitlines()[-1] if out.strip() else ''}"
                )
                result[f"verify_{sink}"] = code

        say("")
        say(
            f"{'measurement':<20} {'wall s':>8} {'apply s':>8} {'changes/s wall':>15} {'changes/s apply':>16} {'docs written':>13}"
        )
        for r in runs:
            apply_rate = f"{r.changes / r.apply_s:,.0f}" if r.apply_s else "-"
            say(
                f"{r.name:<20} {r.wall_s:>8.1f} {r.apply_s or 0:>8.1f} {r.changes / r.wall_s:>15,.0f} {apply_rate:>16} {r.docs:>13,}"
            )
        say("(initial: the snapshot's rows; apply: the workload's changes; wall includes Spark start-up;")
        say(" floor: reading the log + net change + rows into Python, no engine, in-process, no start-up)")
        say(f"load average at the end: {os.getloadavg()[0]:.1f}")
        result["runs"] = [{k: v for k, v in asdict(r).items() if k != "out"} for r in runs]
        result["load_at_end"] = os.getloadavg()
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0 if all(r.code == 0 for r in runs) else 4
    finally:
        node.stop()
        pg.stop()
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
