"""Spark's code generation and small MERGEs: compiled (Spark's defaults, as cdc ships) against
interpreted (whole-stage code generation off and `spark.sql.codegen.factoryMode=NO_CODEGEN`, as the
tests run, tests/conftest.py TEST_SQL_CONF), each in a fresh JVM.

Run from the repo root:  .venv/bin/python bench/codegen.py [--rows 100] [--targets 1000,1000000]
                                                             [--merges 3] [--repeat 2]

For each target size and mode, a process of its own starts a session as cdc does
(pipelines.spark.spark_session, local[2]), writes a Delta table of that many rows (4 columns), then
times `--merges` MERGEs of `--rows` rows (updates and inserts) into it: the first one pays the cold
JVM, the later ones show a warm one. Modes alternate, `--repeat` rounds; every MERGE time is printed.
Nothing is asserted: it shows where interpreting pays (small tables: the tests) and where it does not
(a small cut into a large table, where the MERGE scans the table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, sys, time
mode, rows, merges, size, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
from delta.tables import DeltaTable
from pipelines.spark import spark_session
spark = spark_session(master="local[2]", short_lived=False)
spark.range(size).selectExpr("id", "id AS v", "cast(id AS string) AS s", "id * 1.5 AS d").write.format("delta").save(path)
if mode == "interpreted":
    spark.conf.set("spark.sql.codegen.wholeStage", "false")
    spark.conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN")
times = []
for i in range(merges):
    source = spark.range(rows).selectExpr(f"(id * 7 + {i}) % {size * 2} AS id", f"{i} AS v", "'x' AS s", "2.5 AS d")
    t0 = time.monotonic()
    (DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdate(condition="t.v <= s.v", set={"v": "s.v", "s": "s.s", "d": "s.d"})
        .whenNotMatchedInsertAll().execute())
    times.append(round(time.monotonic() - t0, 2))
print("RESULT " + json.dumps(times), flush=True)
"""
MODES = ("compiled", "interpreted")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100, help="rows per MERGE")
    ap.add_argument("--targets", default="1000,1000000", help="target table sizes, comma-separated")
    ap.add_argument("--merges", type=int, default=3, help="MERGEs per process (the first in a cold JVM)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    results: dict[tuple[int, str], list[list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="cdc-bench-codegen-") as work:
        for size in (int(t) for t in args.targets.split(",")):
            for round_ in range(args.repeat):
                for mode in MODES if round_ % 2 == 0 else reversed(MODES):
                    path = str(Path(work) / f"t-{size}-{mode}-{round_}")
                    argv = [
                        sys.executable,
                        "-c",
                        CHILD,
                        mode,
                        str(args.rows),
                        str(args.merges),
                        str(size),
                        path,
                    ]
                    done = subprocess.run(argv, capture_output=True, text=True, check=True)
                    times = json.loads(done.stdout.rpartition("RESULT ")[2])
                    results.setdefault((size, mode), []).append(times)
                    print(f"target {size:>9,} rows  {mode:11}  MERGE s: {times}", flush=True)
    print(f"\nmedians over {args.repeat} rounds, {args.rows}-row MERGEs:")
    for (size, mode), runs in results.items():
        first = statistics.median(r[0] for r in runs)
        later = statistics.median(t for r in runs for t in r[1:]) if args.merges > 1 else float("nan")
        print(f"target {size:>9,} rows  {mode:11}  first (cold JVM) {first:5.2f} s   later {later:5.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
