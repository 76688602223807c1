"""Keyless (insert-only) tables: capture and apply of an event table without a primary key, next to
pg_recvlogical and to a keyed table of the same rows.

One run, one machine, one throwaway PostgreSQL 15 cluster (durable settings):

  1. capture  `--rows` inserts (1000-row transactions) into a table without a key
              (bench_events: the workload's 10 columns, no PRIMARY KEY, default replica identity,
              so it goes into the pipeline's insert-only publication) and the same rows into a
              keyed table (bench_keyed: `id` the primary key). Each decoded by pg_recvlogical to
              /dev/null (the ceiling: the walsender alone, over a publication of that table) and by
              `cdc stream --until current` into the local log (each record keyed by its position,
              resp. by its key). Both slots read the same WAL (both tables' inserts).
  2. apply    one `cdc apply --once` of those rows into a Delta table that exists already (made by an
              untimed apply of one seed row), in this process on one SparkSession: a MERGE on the
              position (`_cdc_lsn`, `_cdc_seq`) for the keyless table, on `id` for the keyed one.

Parts run --repeat times (default 3) with their own slots and logs, interleaved (the keyless side
first in odd runs, the keyed side first in even ones); medians are reported.

    .venv/bin/python bench/keyless.py [--rows N] [--repeat N] [--keep] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from harness import cdcout
from harness.bench import Bench
from harness.inproc import MASTER, apply_job
from harness.main import main
from harness.proc import Timed, cpu_note, medians
from harness.report import Report
from harness.services import say
from harness.workload import COLUMNS, ROW_EXPR, TXN_SIZE, connect

KEYLESS, KEYED = "public.bench_events", "public.bench_keyed"
SIDES = {"keyless": KEYLESS, "keyed": KEYED}
PUBLICATIONS = {"keyless": "bench_events_pub", "keyed": "bench_keyed_pub"}


def insert_both(dsn: str, rows: int) -> tuple[int, float]:
    """`rows` new rows into each table, TXN_SIZE per transaction, the same rows in both (ids from 1);
    (transactions, seconds)."""
    conn = connect(dsn)
    txns = 0
    t0 = time.perf_counter()
    try:
        with conn.cursor() as cur:
            for first in range(1, rows + 1, TXN_SIZE):
                last = min(first + TXN_SIZE - 1, rows)
                for table in (KEYLESS, KEYED):
                    cur.execute(
                        f"INSERT INTO {table} SELECT {ROW_EXPR} FROM generate_series(%s, %s) AS g",
                        (first, last),
                    )
                    conn.commit()
                    txns += 1
    finally:
        conn.close()
    return txns, time.perf_counter() - t0


def pipe_name(side: str, i: int) -> str:
    return f"bench_{side}_{i}"


def order(i: int) -> list[str]:
    return ["keyless", "keyed"] if i % 2 else ["keyed", "keyless"]


def applied_rows(runs: list) -> int:
    assert not any(r.error for r in runs), [r.error for r in runs]
    return sum(t.inserted + t.updated for r in runs for t in r.tables)


def body(b: Bench) -> Report:
    args = b.args
    rows, reps = args.rows, range(1, args.repeat + 1)
    b.results["config"].update(rows=rows, repeat=args.repeat, txn_size=TXN_SIZE)
    b.start_postgres(durable=True)
    b.warm_bytecode("pipelines.cli", "pipelines.metrics", "snapshot.runner", "cdc.reader")
    keyless_columns = COLUMNS.replace("bigint PRIMARY KEY", "bigint")
    b.sql(
        f"CREATE TABLE {KEYLESS} ({keyless_columns})",
        f"CREATE TABLE {KEYED} ({COLUMNS})",
        # one seed row each, so the first (untimed) apply makes the Delta tables the timed one merges into
        *(f"INSERT INTO {t} SELECT {ROW_EXPR} FROM generate_series(0, 0) AS g" for t in (KEYLESS, KEYED)),
        f"CREATE PUBLICATION {PUBLICATIONS['keyless']} FOR TABLE {KEYLESS} WITH (publish = 'insert, truncate')",
        f"CREATE PUBLICATION {PUBLICATIONS['keyed']} FOR TABLE {KEYED}",
    )
    pipes: dict[tuple[str, int], Path] = {}
    say("== set-up: per run and side, `cdc snapshot` of the seed row and an untimed apply ==")
    for i in reps:
        for side, table in SIDES.items():
            name = pipe_name(side, i)
            pipe = pipes[side, i] = b.pipeline(
                name,
                [table],
                log=b.local_log(name),
                sinks=[{"name": "lake", "delta": {"path": str(b.state(name) / "lake")}}],
                spark={"master": MASTER},
            )
            b.cdc(f"snapshot_{name}", "snapshot", pipe, "--no-progress")
            _, job = apply_job(pipe)
            applied_rows(job.run_once())
            b.create_slot(f"recv_{side}_{i}")
    b.load("before the workload")
    txns, seconds = insert_both(b.dsn, rows)
    end_lsn = b.lsn()
    say(
        f"workload: {rows:,} rows into each table in {txns:,} transactions in {seconds:.1f}s; end LSN {end_lsn}"
    )
    b.sql("CHECKPOINT")

    b.load("before capture")
    say("\n== 1. capture ==")
    recv: dict[str, list[Timed]] = {s: [] for s in SIDES}
    stream: dict[str, list[Timed]] = {s: [] for s in SIDES}
    for i in reps:
        for side in order(i):
            r = b.recvlogical(f"recv_{side}_{i}", f"recv_{side}_{i}", end_lsn, PUBLICATIONS[side])
            say(
                f"  [{i}] pg_recvlogical, {side}: {r.wall_s:.2f}s, {rows / r.wall_s:,.0f} rows/s, {cpu_note(r)}"
            )
            s = b.cdc(f"stream_{side}_{i}", "stream", pipes[side, i], "--until", "current")
            got = cdcout.stream(s.out)
            say(
                f"  [{i}] cdc stream, {side}: {s.wall_s:.2f}s, {rows / s.wall_s:,.0f} rows/s"
                f" (self-reported {got['rate']:,} events/s), {cpu_note(s)}"
            )
            if got["events"] != rows:
                say(f"WARNING: cdc stream of the {side} table logged {got['events']:,} events, not {rows:,}")
            recv[side].append(r)
            stream[side].append(s)
        b.drop_slots(*(f"recv_{side}_{i}" for side in SIDES))

    b.load("before apply")
    say("\n== 2. apply ==")
    apply_s: dict[str, list[float]] = {s: [] for s in SIDES}
    for i in reps:
        for side in order(i):
            _, job = apply_job(pipes[side, i])
            t0 = time.perf_counter()
            done = applied_rows(job.run_once())
            took = time.perf_counter() - t0
            say(
                f"  [{i}] cdc apply --once, {side}: {took:.2f}s, {rows / took:,.0f} rows/s ({done:,} rows written)"
            )
            if done != rows:
                say(f"WARNING: apply of the {side} table wrote {done:,} rows, not {rows:,}")
            apply_s[side].append(took)
    b.drop_slots(*(f"cdc_{pipe_name(side, i)}" for side in SIDES for i in reps))

    out: dict = {}
    for side in SIDES:
        r_m, s_m = medians(recv[side], rows, "rows_per_s"), medians(stream[side], rows, "rows_per_s")
        a_wall = statistics.median(apply_s[side])
        out[side] = {
            "pg_recvlogical": r_m,
            "cdc_stream": s_m,
            "stream_ratio": r_m["wall_s"] / s_m["wall_s"],
            "apply": {"wall_s": a_wall, "rows_per_s": rows / a_wall, "runs_s": apply_s[side]},
        }
    b.results["keyless"] = out

    rep = Report("Keyless insert-only table: capture and apply (bench/keyless.py)", ("seconds", "CPU"))
    rep.subtitle = f"{rows:,} inserted rows per table, {TXN_SIZE}-row transactions, median of {args.repeat}"
    for side in SIDES:
        what = "keyless table" if side == "keyless" else "keyed table, same rows"
        r_m, s_m = out[side]["pg_recvlogical"], out[side]["cdc_stream"]
        rep.add(
            "capture",
            f"pg_recvlogical, {what}",
            r_m["rows_per_s"],
            "events/s",
            role="ceiling",
            ratio=1.0,
            seconds=f"{r_m['wall_s']:.2f}",
            CPU=f"{r_m['cpu_s']:.1f}s",
            notes="walsender to /dev/null",
        )
        rep.add(
            "capture",
            f"cdc stream, {what}",
            s_m["rows_per_s"],
            "events/s",
            role="cdc" if side == "keyless" else "diag",
            ratio=out[side]["stream_ratio"],
            seconds=f"{s_m['wall_s']:.2f}",
            CPU=f"{s_m['cpu_s']:.1f}s",
            notes="vs its pg_recvlogical; local log, durable",
        )
    keyed_apply = out["keyed"]["apply"]
    for side in SIDES:
        a = out[side]["apply"]
        rep.add(
            "apply",
            "cdc apply --once, keyless table"
            if side == "keyless"
            else "cdc apply --once, keyed table, same rows",
            a["rows_per_s"],
            "events/s",
            role="cdc" if side == "keyless" else "diag",
            ratio=keyed_apply["wall_s"] / a["wall_s"],
            seconds=f"{a['wall_s']:.2f}",
            notes="MERGE on (_cdc_lsn, _cdc_seq)" if side == "keyless" else "MERGE on id; the reference",
        )
    rep.summary.append(
        f"capture: cdc stream of the keyless table at {out['keyless']['stream_ratio'] * 100:.0f}% of pg_recvlogical, "
        f"the keyed one at {out['keyed']['stream_ratio'] * 100:.0f}%; apply: keyless "
        f"{out['keyless']['apply']['rows_per_s']:,.0f} rows/s, keyed {keyed_apply['rows_per_s']:,.0f} rows/s"
    )
    return rep


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--rows", type=int, default=1_000_000, help="rows inserted into each table (default 1,000,000)"
    )
    p.add_argument(
        "--repeat", type=int, default=3, help="timed runs per measurement; medians reported (default 3)"
    )
    return p


def check(args: argparse.Namespace) -> str | None:
    if args.rows < 10 or args.repeat < 1:
        return "--rows must be at least 10 and --repeat at least 1"
    return None


if __name__ == "__main__":
    sys.exit(main(parser(), body, prefix="keyless", check=check))
