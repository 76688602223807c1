"""`cdc stream` once more, on its own slot, under cProfile: not part of the timings."""

from __future__ import annotations

import io
import pstats
import sys
from pathlib import Path

from harness.bench import Bench
from harness.proc import checked, run_timed
from harness.services import say


def profile(b: Bench, what: str, pipe: Path, out: Path) -> None:
    argv = [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "pipelines.cli"]
    argv += ["stream", str(pipe), "--until", "current"]
    run = checked(run_timed(argv, b.cdc_env(), b.work, f"profile_{what}"), "cdc stream under cProfile")
    say(
        f"\n-- {what}: cdc stream under cProfile: {run.wall_s:.2f}s (profiler overhead included), profile in {out}"
    )
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(str(out), stream=buf).sort_stats(key).print_stats(25)
        text = buf.getvalue()
        say(f"-- top 25 by {key} --")
        say("\n".join(line for line in text[text.index("ncalls") :].splitlines() if line.strip()))
    b.results.setdefault("profiles", {})[what] = {"path": str(out), "wall_s": run.wall_s}
