"""Capture benchmark: `cdc stream` and `cdc snapshot` next to PostgreSQL's own tools.

One run, one machine, one throwaway PostgreSQL 15 cluster (durable settings by default):

  1. stream    1M changes (70% inserts, 30% updates, 1000-change transactions) decoded by
               pg_recvlogical to /dev/null (the ceiling: the walsender alone) and by
               `cdc stream --until current` into the local log; rate, ratio, peak RSS, log size.
               Diagnostic: the same into a log with `synchronous: normal` (no fsync per commit).
  2. snapshot  a 1M-row table: `COPY t TO STDOUT` by psql to /dev/null (the ceiling) and
               `cdc snapshot` into a fresh log (default workers, then --parallel 1, 2, 4).
  3. big txn   one transaction inserting 1M rows into a fresh table: `cdc stream --until
               current` peak RSS (pg_recvlogical over the same transaction for reference).

Every cdc command runs as a user runs it: the real console entry (.venv/bin/cdc) in a
subprocess, timed from spawn to exit; client CPU comes from wait4, the cluster's CPU from
/proc. Parts 1 and 2 run --repeat times (default 3), interleaved with their ceiling, and
report medians. The parts live in bench/capturing/, the harness in bench/harness/; see
bench/README.md for how to read the output.

    .venv/bin/python bench/capture.py [--rows N] [--repeat N] [--keep] [--json out.json] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from capturing.bigtxn import big_transaction
from capturing.snapshot import snapshot
from capturing.stream import stream
from capturing.summary import summary
from harness.bench import Bench
from harness.main import main
from harness.report import Report
from harness.services import say
from harness.workload import INSERT_SHARE, TXN_SIZE

PARTS = {"stream": stream, "snapshot": snapshot, "big": big_transaction}


def body(b: Bench) -> Report:
    args = b.args
    b.results["config"].update(
        rows=args.rows, repeat=args.repeat, txn_size=TXN_SIZE, insert_share=INSERT_SHARE
    )
    b.start_postgres(durable=True)
    b.warm_bytecode("pipelines.cli", "pipelines.metrics", "snapshot.runner", "cdc.reader")
    r = b.cdc("cdc_version", "--version")
    b.results["config"]["cdc_version_s"] = r.wall_s
    say(f"bare `cdc --version` process: {r.wall_s:.2f}s")
    for part in args.only or list(PARTS):
        PARTS[part](b)
    return summary(b.results)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--rows",
        type=int,
        default=1_000_000,
        help="changes streamed, rows snapshotted, rows in the big transaction (default 1,000,000)",
    )
    p.add_argument(
        "--repeat", type=int, default=3, help="timed runs per measurement; medians are reported (default 3)"
    )
    p.add_argument(
        "--profile",
        type=Path,
        help="also run cdc stream under cProfile (own slot, untimed); write OUT and OUT.big.prof, print the top functions",
    )
    p.add_argument("--only", choices=list(PARTS), action="append", help="run only these parts (repeatable)")
    return p


def check(args: argparse.Namespace) -> str | None:
    if args.rows < 10 or args.repeat < 1:
        return "--rows must be at least 10 and --repeat at least 1"
    if args.profile:
        args.profile = args.profile.resolve()
        args.profile.parent.mkdir(parents=True, exist_ok=True)
    return None


if __name__ == "__main__":
    sys.exit(main(parser(), body, prefix="capture", check=check))
