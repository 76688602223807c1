"""What Delta's idempotent-write id costs a follower's commit: the same append and the same MERGE,
plain and carrying the follower's (txnAppId, txnVersion), side by side in one session.

Run from the repo root:  .venv/bin/python bench/delta_txn.py [--keys 100000] [--rows 10000]
                                                               [--updates 7000] [--repeat 5]

cdc writes every cut with Delta's idempotent-write id (sinks/delta/idempotent.py; an appended cut
as writer options, sinks/delta/sink.py `_append`): Delta skips a cut it already holds, which makes a
replay after a crash safe. Delta answers "which version does this app id hold" from the table's
whole state (`Snapshot.transactions`, "Compute snapshot for version N": three Spark jobs over the
log), not from the checksum file that also lists it. A MERGE builds that state anyway (it scans the
table's files), an append does not. Four tables of `--keys` rows, one per kind; each round appends
`--rows` new rows to the two append tables and MERGEs `--updates` random keys into the two MERGE
tables, in alternating order; the first round (a cold JVM) is left out of the medians. Per kind
the seconds, the Spark jobs and how many of them rebuilt the table's state. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness.inproc import MASTER, job_names, last_job_id

KINDS = ("append", "append + txn id", "MERGE", "MERGE + txn id")
APP_ID = "bench:delta_txn"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=100_000, help="rows in each table to begin with")
    ap.add_argument("--rows", type=int, default=10_000, help="rows per append")
    ap.add_argument("--updates", type=int, default=7_000, help="keys per MERGE")
    ap.add_argument("--repeat", type=int, default=5, help="rounds after the first")
    args = ap.parse_args()

    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from pipelines.spark import spark_session
    from sinks.delta.idempotent import follower_write

    spark = spark_session(master=MASTER)
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-delta-txn-"))
    paths = {kind: str(work / f"t{i}") for i, kind in enumerate(KINDS)}

    def rows(first: int, count: int, version: int):
        return spark.range(first, first + count).select(
            F.col("id"),
            F.lit(version).cast("long").alias("ver"),
            F.concat(F.lit("name "), F.col("id").cast("string")).alias("name"),
            F.current_timestamp().alias("at"),
        )

    for path in paths.values():
        rows(0, args.keys, 0).write.format("delta").save(path)

    def write(kind: str, version: int, first: int) -> None:
        path = paths[kind]
        if kind.startswith("append"):
            # the rows are in the driver as an appended cut's are (a small range is read there)
            source = spark.createDataFrame(rows(first, args.rows, version).toArrow())
            writer = source.write.format("delta").mode("append")
            if kind.endswith("txn id"):
                writer = writer.option("txnAppId", APP_ID).option("txnVersion", str(version))
            t0 = time.monotonic()
            writer.save(path)
        else:
            keys = random.Random(version).sample(range(args.keys), args.updates)
            source = spark.createDataFrame([(k, version) for k in keys], "id long, ver long")
            merge = (
                DeltaTable.forPath(spark, path)
                .alias("t")
                .merge(source.alias("s"), "t.id = s.id")
                .whenMatchedUpdate(set={"ver": "s.ver"})
            )
            t0 = time.monotonic()
            if kind.endswith("txn id"):
                with follower_write(spark, APP_ID, version):
                    merge.execute()
            else:
                merge.execute()
        seconds[kind].append(time.monotonic() - t0)

    seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
    jobs: dict[str, list[int]] = {kind: [] for kind in KINDS}
    state: dict[str, list[int]] = {kind: [] for kind in KINDS}
    first = args.keys
    for version in range(1, args.repeat + 2):
        for kind in KINDS if version % 2 else tuple(reversed(KINDS)):
            before = last_job_id(spark)
            write(kind, version, first)
            names = job_names(spark, before, last_job_id(spark))
            jobs[kind].append(len(names))
            state[kind].append(sum("Compute snapshot" in n for n in names))
        first += args.rows
        print(
            f"round {version}{' (cold, left out)' if version == 1 else ''}: "
            + ", ".join(f"{kind} {seconds[kind][-1]:.2f}s" for kind in KINDS),
            flush=True,
        )
    print(f"\n{args.keys:,}-row tables, appends of {args.rows:,} rows, MERGEs of {args.updates:,} keys;")
    print(f"medians of rounds 2-{args.repeat + 1} (local[2], cdc's session settings):")
    for kind in KINDS:
        print(
            f"  {kind:16} {statistics.median(seconds[kind][1:]):5.2f} s  "
            f"{statistics.median(jobs[kind][1:]):4.0f} Spark jobs, "
            f"{statistics.median(state[kind][1:]):.0f} of them rebuilding the table's state"
        )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
