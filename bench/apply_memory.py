"""Driver memory of a big cut: `cdc apply --once` of a 5M-change cut over 1M keys with Spark's
default driver heap (issue 15 item 6).

Run from the repo root:  .venv/bin/python bench/apply_memory.py [--keys 1000000] [--changes 5000000]

A table of `--keys` rows is snapshotted into the local log, then every row is updated
`--changes / --keys` times (100k-row transactions) and streamed; nothing is applied before, so
the one `cdc apply --once` that follows holds the snapshot and every change in one cut. It runs
as a user runs it (the console entry in a process of its own, `spark.driver.memory` not set:
Spark's default heap of 1 GiB on a local master), and the peak resident memory (VmHWM) of each
process of its tree is reported: `java` is Spark's JVM (driver and, on a local master, the
executors), `python3` the driver's Python process and Spark's Python workers. The Delta table is
then read with delta-rs (not Spark): every key present once, every row at its last version.
"""

from __future__ import annotations

import argparse
import sys
import time

from harness.bench import Bench
from harness.main import main
from harness.report import Report, fmt_mb
from harness.services import say
from harness.workload import connect

SPARK = {"master": "local[2]"}  # no spark.driver.memory: Spark's default heap


def write_versions(dsn: str, keys: int, rounds: int, per_txn: int = 100_000) -> int:
    """Every key updated `rounds` times (ver = round number), `per_txn` rows per transaction."""
    conn = connect(dsn)
    done = 0
    with conn.cursor() as cur:
        for ver in range(1, rounds + 1):
            for first in range(1, keys + 1, per_txn):
                cur.execute(
                    "UPDATE mem SET ver = %s WHERE id BETWEEN %s AND %s", (ver, first, first + per_txn - 1)
                )
                done += cur.rowcount
                conn.commit()
    conn.close()
    return done


def lake_check(path: str, keys: int, rounds: int) -> tuple[int, int, int]:
    """(rows, distinct keys, rows not at the last version) of the Delta table, read by delta-rs."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table(columns=["id", "ver"])
    ids = table.column("id")
    stale = table.num_rows - pc.sum(pc.equal(table.column("ver"), rounds)).as_py()
    return table.num_rows, len(pc.unique(ids)), stale


def body(b: Bench) -> Report:
    keys, rounds = b.args.keys, max(1, b.args.changes // b.args.keys)
    b.results["config"].update(keys=keys, changes=keys * rounds)
    b.start_postgres(durable=False)
    b.sql(
        "CREATE TABLE mem (id bigint PRIMARY KEY, ver bigint NOT NULL, v text)",
        f"INSERT INTO mem SELECT g, 0, 'value ' || g FROM generate_series(1, {keys}) g",
    )
    pipe = b.pipeline(
        "benchmem", ["public.mem"], sinks=[{"name": "lake", "delta": {"path": "lake"}}], spark=SPARK
    )
    b.cdc("mem_snapshot", "snapshot", pipe, "--no-progress")
    t0 = time.monotonic()
    written = write_versions(b.dsn, keys, rounds)
    say(f"memory: {written:,} updates written in {time.monotonic() - t0:.0f}s")
    streamed = b.cdc("mem_stream", "stream", pipe, "--until", "current")
    say(f"memory: streamed into the log in {streamed.wall_s:.0f}s; one `cdc apply --once` of the whole cut")
    run = b.cdc("mem_apply", "apply", pipe, "--once", tree=True)
    peaks = dict(run.tree_peak_rss)
    rows, distinct, stale = lake_check(str(b.work / "lake/public/mem"), keys, rounds)
    events = keys + written
    b.results["memory"] = {
        "events_in_cut": events,
        "apply_s": round(run.wall_s, 1),
        "cli_peak_rss_bytes": run.peak_rss_bytes,
        "tree_peak_rss_bytes": peaks,
        "delta_rows": rows,
        "delta_distinct_keys": distinct,
        "delta_rows_not_at_last_version": stale,
    }
    say(
        f"memory: apply {run.wall_s:.0f}s for {events:,} events; peak RSS `cdc` process {fmt_mb(run.peak_rss_bytes)}, "
        + ", ".join(f"{name} {fmt_mb(n)}" for name, n in sorted(peaks.items()))
        + f"; Delta (delta-rs): {rows:,} rows, {distinct:,} keys, {stale:,} not at version {rounds}"
    )
    if rows != keys or distinct != keys or stale:
        raise SystemExit(f"the Delta table is not the source: {rows} rows, {distinct} keys, {stale} stale")
    rep = Report("Driver memory of one big cut (bench/apply_memory.py)", ("seconds",))
    rep.add(
        "memory",
        "`cdc apply --once`, peak RSS of the JVM",
        peaks.get("java", 0) / 2**20,
        "MiB",
        less_is_better=True,
        seconds=f"{run.wall_s:.0f}",
        notes=f"{events:,} events in one cut, Spark's default driver heap (1 GiB)",
    )
    rep.add(
        "memory",
        "peak RSS of the `cdc` (driver Python) process",
        (run.peak_rss_bytes or 0) / 2**20,
        "MiB",
        less_is_better=True,
        seconds=f"{run.wall_s:.0f}",
    )
    rep.subtitle = f"{keys:,} keys, {written:,} updates ({rounds} per key) and the snapshot in one cut"
    return rep


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--changes", type=int, default=5_000_000, help="updates; each key gets changes // keys")
    return ap


if __name__ == "__main__":
    sys.exit(main(parser(), body, prefix="apply-memory"))
