"""What recording one cut in `_cdc_cuts` costs (sinks/delta/cuts.py record_cut): the Spark append
it used to be side by side with the delta-rs append it is on a local path, in one run, one Spark
session, alternating the two.

Run from the repo root:  .venv/bin/python bench/cut_record.py [--cuts 20] [--rounds 2]

Each round writes `--cuts` cut rows into a fresh `_cdc_cuts` with each writer (after one untimed
row that creates the table) and prints the mean per cut; both tables are read back with delta-rs
and Spark to show they hold the same rows. The 1-minute load average is printed: on a shared
machine figures are noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import sinks.delta.cuts as cuts
from pipelines.spark import spark_session

WRITERS = {"spark": lambda _path: False, "delta-rs": lambda _path: True}  # cuts._local: who writes


def one_round(spark, writer: str, n: int) -> float:
    base = tempfile.mkdtemp(prefix=f"cut-record-{writer}-")
    cuts._local = WRITERS[writer]
    cuts.record_cut(spark, base, "log", 0, 1, {"public.t": 0}, {"public.t": "public/t"}, again=False)
    start = time.monotonic()
    for i in range(1, n + 1):
        cuts.record_cut(
            spark, base, "log", i, 100 + i, {"public.t": i}, {"public.t": "public/t"}, again=False
        )
    per_cut = (time.monotonic() - start) / n
    arrow = [c.cut_id for c in cuts.list_cuts_arrow(base)]
    assert arrow == [c.cut_id for c in cuts.list_cuts(spark, base)] == list(range(n, -1, -1)), arrow
    return per_cut


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuts", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    spark = spark_session(master="local[2]")
    times: dict[str, list[float]] = {w: [] for w in WRITERS}
    for _ in range(args.rounds):
        for writer in WRITERS:
            times[writer].append(one_round(spark, writer, args.cuts))
    for writer, values in times.items():
        print(
            f"{writer:9s} {statistics.median(values) * 1000:8.1f} ms per cut (rounds: {', '.join(f'{v * 1000:.1f}' for v in values)})"
        )
    print(f"load average (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    spark.stop()


if __name__ == "__main__":
    main()
