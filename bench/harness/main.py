"""The common frame of every bench script: its command line gets --json and --keep, it runs in a
fresh work dir that is removed afterwards (unless --keep), its services stop whatever happens, and
its side-by-side result is printed, written as JSON and drawn as a PNG next to the JSON."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness.bench import Bench
from harness.report import Report
from harness.services import say


def footer(loads: dict[str, float], started: str = "", command: str = "") -> str:
    """The machine line of a result: when, how, CPUs and the load seen. The load at its start is
    other work (a run is busy when that is over half the CPUs); later samples include its own."""
    seen = list(loads.values()) or [os.getloadavg()[0]]
    cpus = os.cpu_count() or 1
    busy = " (other work was running: not performance figures)" if seen[0] > 0.5 * cpus else ""
    when = f"{started}, " if started else ""
    how = f"\n{command}" if command else ""
    return (
        f"{when}{cpus} CPUs, 1-min load average {seen[0]:.1f} at its start, {min(seen):.1f}-{max(seen):.1f}"
        f" during the run (its own work included){busy}{how}"
    )


def main(
    parser: argparse.ArgumentParser,
    body: Callable[[Bench], Report],
    *,
    prefix: str,
    argv: list[str] | None = None,
    check: Callable[[argparse.Namespace], str | None] = lambda _args: None,
) -> int:
    parser.add_argument(
        "--json", type=Path, help="also write every number to this JSON file, and the chart next to it (.png)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work dir (services stopped)")
    args = parser.parse_args(argv)
    problem = check(args)
    if problem:
        parser.error(problem)
    if args.json:
        args.json.resolve().parent.mkdir(parents=True, exist_ok=True)
    # Not under a root-private dir: the PostgreSQL server runs as `postgres` and must reach its data dir.
    work = Path(tempfile.mkdtemp(prefix=f"cdc-bench-{prefix}-"))
    os.chmod(work, 0o755)
    say(f"work dir {work}")
    results: dict = {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join([".venv/bin/python", os.path.relpath(sys.argv[0]), *(argv or sys.argv[1:])]),
        "loadavg": {},
        "config": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "machine": platform.platform(),
        },
    }
    started = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            bench = Bench(args, work, stack, results)
            bench.load("at start")
            report = body(bench)
            bench.load("at the end")
        results["total_s"] = time.perf_counter() - started
        results["table"] = report.as_json()
        results["footer"] = footer(results["loadavg"], results["started"], results["command"])
        say("")
        report.print(results["footer"])
        say(f"\ntotal {results['total_s']:.0f}s")
        if args.json:
            args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
            chart = args.json.with_suffix(".png")
            report.chart(chart, results["footer"])
            say(f"numbers written to {args.json}, chart to {chart}")
        return 0
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
