"""Capture A/B: `cdc stream --until current` of one workload by two checkouts of the code, in one run.

Both sides stream the same changes (70% inserts, 30% updates, 1000-change transactions, as
bench/capture.py part 1) from their own slots of one throwaway PostgreSQL cluster into their own
local logs; the runs alternate (A B, B A, ...) so drift hits both alike. Each side runs the real
console entry with PYTHONPATH set to its checkout, so the checkout's `cdc` package is what runs.

    .venv/bin/python bench/capture_ab.py --tree /path/to/old --tree . [--rows N] [--repeat N] [--json out.json]

The verdict line gives B's median rate as a share of A's (B within 5% of A: at least 95%).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from capturing.stream import PUBLICATION, TABLE, snapshotted
from capturing.summary import COLUMNS, _cells
from harness import cdcout
from harness.bench import BIN, Bench
from harness.main import main
from harness.proc import checked, cpu_note, medians, run_timed
from harness.report import Report
from harness.services import say
from harness.workload import COLUMNS as TABLE_COLUMNS
from harness.workload import insert_update


def body(b: Bench) -> Report:
    args = b.args
    trees: list[Path] = args.tree
    b.results["config"].update(rows=args.rows, repeat=args.repeat, trees=[str(t) for t in trees])
    b.start_postgres(durable=True)
    b.sql(f"CREATE TABLE {TABLE} ({TABLE_COLUMNS})", f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")
    reps = range(1, args.repeat + 1)
    envs = {side: {**b.cdc_env(), "PYTHONPATH": str(tree)} for side, tree in zip("ab", trees, strict=True)}
    pipes = {
        (side, i): snapshotted(b, f"ab_{side}_{i}", f"ab_{side}_{i}", env=envs[side])
        for side in "ab"
        for i in reps
    }
    inserts, updates, txns, seconds = insert_update(b.dsn, TABLE, args.rows)
    say(f"workload: {inserts + updates:,} changes in {txns:,} transactions in {seconds:.1f}s")
    b.sql("CHECKPOINT")
    for side, env in envs.items():  # each side's bytecode cached before anything is timed
        warm = [sys.executable, "-c", "import pipelines.cli, pipelines.metrics, snapshot.runner, cdc.reader"]
        checked(run_timed(warm, env, b.work, f"warm_{side}"), f"bytecode warm-up ({side})")
    runs: dict[str, list] = {"a": [], "b": []}
    events: dict[str, int] = {}
    for i in reps:
        for side in "ab" if i % 2 else "ba":
            run = checked(
                b.timed(
                    [str(BIN / "cdc"), "stream", str(pipes[side, i]), "--until", "current"],
                    envs[side],
                    f"{side}_{i}",
                ),
                f"cdc stream ({side}_{i})",
            )
            events[side] = cdcout.stream(run.out)["events"]
            runs[side].append(run)
            say(
                f"  [{i}] {side} {trees[ord(side) - 97]}: {run.wall_s:.2f}s, {events[side] / run.wall_s:,.0f} events/s, {cpu_note(run)}"
            )
    if events["a"] != events["b"]:
        raise RuntimeError(f"the two sides logged different event counts: {events}")
    m = {side: medians(runs[side], events[side], "events_per_s") for side in "ab"}
    b.results["ab"] = {"events": events["a"], **m}
    rep = Report("Capture A/B: cdc stream by two checkouts (bench/capture_ab.py)", COLUMNS)
    rep.subtitle = f"{events['a']:,} events, median of {args.repeat} run(s) each, alternating"
    for side, tree in zip("ab", trees, strict=True):
        rep.add(
            "stream",
            f"{side}: {tree}",
            m[side]["events_per_s"],
            "events/s",
            ratio=m[side]["events_per_s"] / m["a"]["events_per_s"],
            **_cells(m[side]),
        )
    share = m["b"]["events_per_s"] / m["a"]["events_per_s"]
    rep.summary.append(
        f"b streams at {share:.1%} of a's rate (median wall {m['b']['wall_s']:.2f}s vs {m['a']['wall_s']:.2f}s)"
    )
    return rep


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--tree", type=Path, action="append", required=True, help="a checkout of the code (twice: a, then b)"
    )
    p.add_argument("--rows", type=int, default=1_000_000, help="changes streamed (default 1,000,000)")
    p.add_argument("--repeat", type=int, default=3, help="runs per side; medians are reported (default 3)")
    return p


def check(args: argparse.Namespace) -> str | None:
    if len(args.tree) != 2:
        return "give --tree twice: the checkout measured first (a) and the one compared with it (b)"
    args.tree = [t.resolve() for t in args.tree]
    missing = [str(t) for t in args.tree if not (t / "cdc" / "reader.py").is_file()]
    if missing:
        return f"not a checkout of the project (no cdc/reader.py): {', '.join(missing)}"
    if args.rows < 10 or args.repeat < 1:
        return "--rows must be at least 10 and --repeat at least 1"
    return None


if __name__ == "__main__":
    sys.exit(main(parser(), body, prefix="capture-ab", check=check))
