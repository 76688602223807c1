"""Issue 37 item 7's question, measured: is there a way to make a small cut visible clearly below
the floor every freshness batch pays now (a bare Spark Delta MERGE of the batch's keys)?

Run from the repo root:  .venv/bin/python bench/small_cut.py [--keys 100000] [--batch 5600]
                                                             [--rounds 6] [--json out.json]

One Spark session (local[2], as the freshness bench), no PostgreSQL: three copies of one follower-
shaped table (`id bigint, ver bigint, v string`, `--keys` rows, written by Spark as the snapshot
writes it). Each round draws `--batch` random keys (the keys of one freshness batch at 2k
changes/s: about 5,600) and writes them into each copy, in alternating order:

* `spark MERGE`: the bench's floor under a freshness batch (bench/apply.py `bare_merge`), the rows
  already in the driver as cdc's freshness path holds them (ranges read in the driver);
* `delta-rs MERGE`: the same MERGE written by delta-rs (no JVM), with the cut's Delta transaction id
  looked up first and recorded in the same commit, as the apply's replay guard does;
* `tail append`: merge-on-read as item 7 describes it: the batch's rows appended by delta-rs to a
  small tail table beside the base (with the transaction id), the base left alone.

Then what merge-on-read costs elsewhere, with the tail holding every round's rows: a reader's
query through DataFusion (what `cdc sql` runs without a JVM) over the base merged with the tail
(each key's newest tail row wins, deletes drop it) against the same query over the base alone; and
the background fold (a Spark MERGE of the netted tail into the base). Every copy is read back at the
end with delta-rs and Spark and compared: the same rows in all three, so no figure is for a wrong
result. The 1-minute load average is printed: on a shared machine figures are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, write_deltalake

from pipelines.spark import spark_session

APP_ID = "bench-small-cut"

# Each key's newest tail row (highest cut) wins over the base; a delete drops the key.
MERGED = """
WITH newest AS (
    SELECT id, ver, v, op FROM (
        SELECT id, ver, v, op, row_number() OVER (PARTITION BY id ORDER BY cut DESC) AS rn FROM tail
    ) WHERE rn = 1
)
SELECT id, ver, v FROM base WHERE id NOT IN (SELECT id FROM newest)
UNION ALL
SELECT id, ver, v FROM newest WHERE op <> 'd'
"""
QUERY = "SELECT count(*) AS n, sum(ver) AS s FROM ({rows})"


def timed(fn) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def batch_rows(keys: int, n: int, cut: int) -> pa.Table:
    ids = sorted(random.Random(cut).sample(range(1, keys + 1), n))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "ver": pa.array([cut] * n, pa.int64()),
            "v": pa.array([f"v{cut}"] * n, pa.string()),
        }
    )


def guard(path: str, cut: int) -> bool:
    """The replay guard: has this cut already been written to the table?"""
    done = DeltaTable(path).transaction_version(APP_ID)
    return done is not None and done >= cut


def commit(cut: int) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(app_id=APP_ID, version=cut)])


def spark_merge(spark, path: str, rows: pa.Table) -> float:
    from delta.tables import DeltaTable as SparkDeltaTable

    source = spark.createDataFrame(rows)  # a LocalRelation: the rows are in the driver, as cdc's are

    def run() -> None:
        SparkDeltaTable.forPath(spark, path).alias("t").merge(
            source.alias("s"), "t.id = s.id"
        ).whenMatchedUpdate(set={"ver": "s.ver", "v": "s.v"}).whenNotMatchedInsertAll().execute()

    return timed(run)


def drs_merge(path: str, rows: pa.Table, cut: int) -> float:
    def run() -> None:
        if guard(path, cut):
            return
        (
            DeltaTable(path)
            .merge(rows, "t.id = s.id", source_alias="s", target_alias="t", commit_properties=commit(cut))
            .when_matched_update({"ver": "s.ver", "v": "s.v"})
            .when_not_matched_insert_all()
            .execute()
        )

    return timed(run)


def tail_append(path: str, rows: pa.Table, cut: int) -> float:
    tail = rows.append_column("op", pa.array(["u"] * rows.num_rows, pa.string())).append_column(
        "cut", pa.array([cut] * rows.num_rows, pa.int64())
    )

    def run() -> None:
        if Path(path, "_delta_log").exists() and guard(path, cut):
            return
        write_deltalake(path, tail, mode="append", commit_properties=commit(cut))

    return timed(run)


def query(base: str, tail: str | None) -> tuple[float, tuple[int, int]]:
    qb = QueryBuilder({"datafusion.execution.target_partitions": "2"})
    qb.register("base", DeltaTable(base))
    if tail:
        qb.register("tail", DeltaTable(tail))
    sql = QUERY.format(rows=MERGED if tail else "SELECT id, ver, v FROM base")
    t0 = time.monotonic()
    out = pa.table(qb.execute(sql).read_all())
    return time.monotonic() - t0, (out["n"][0].as_py(), out["s"][0].as_py())


def fold(spark, base: str, tail: str) -> float:
    """The background merge: the tail's newest row per key MERGEd into the base."""
    from delta.tables import DeltaTable as SparkDeltaTable

    newest = spark.sql(
        f"SELECT id, ver, v, op FROM (SELECT *, row_number() OVER (PARTITION BY id ORDER BY cut DESC) rn "
        f"FROM delta.`{tail}`) WHERE rn = 1"
    )

    def run() -> None:
        SparkDeltaTable.forPath(spark, base).alias("t").merge(
            newest.alias("s"), "t.id = s.id"
        ).whenMatchedDelete("s.op = 'd'").whenMatchedUpdate(
            set={"ver": "s.ver", "v": "s.v"}
        ).whenNotMatchedInsert("s.op <> 'd'", values={"id": "s.id", "ver": "s.ver", "v": "s.v"}).execute()

    return timed(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=5_600)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    spark = spark_session(master="local[2]", short_lived=False)
    work = Path(tempfile.mkdtemp(prefix="small-cut-"))
    paths = {name: str(work / name) for name in ("spark", "drs", "base")}
    tail = str(work / "tail")
    seed = spark.range(1, args.keys + 1).selectExpr("id", "0L AS ver", "'x' AS v")
    for path in paths.values():
        seed.write.format("delta").save(path)
    writers = {
        "spark MERGE": lambda rows, cut: spark_merge(spark, paths["spark"], rows),
        "delta-rs MERGE": lambda rows, cut: drs_merge(paths["drs"], rows, cut),
        "tail append": lambda rows, cut: tail_append(tail, rows, cut),
    }
    times: dict[str, list[float]] = {name: [] for name in writers}
    for cut in range(1, args.rounds + 2):  # round 1 warms each writer up, untimed
        rows = batch_rows(args.keys, args.batch, cut)
        order = list(writers) if cut % 2 else list(reversed(writers))
        for name in order:
            took = writers[name](rows, cut)
            if cut > 1:
                times[name].append(took)
    replay = drs_merge(paths["drs"], batch_rows(args.keys, args.batch, args.rounds + 1), args.rounds + 1)
    query(paths["base"], None)  # warm DataFusion up once
    base_read, _ = query(paths["base"], None)
    merged_read, merged = query(paths["base"], tail)
    fold_s = fold(spark, paths["base"], tail)
    expected = spark.read.format("delta").load(paths["spark"]).selectExpr("count(*)", "sum(ver)").first()
    results = {
        "spark MERGE": tuple(expected),
        "delta-rs MERGE (delta-rs)": query(paths["drs"], None)[1],
        "delta-rs MERGE (Spark)": tuple(
            spark.read.format("delta").load(paths["drs"]).selectExpr("count(*)", "sum(ver)").first()
        ),
        "base + tail (DataFusion)": merged,
        "base after the fold (Spark)": tuple(
            spark.read.format("delta").load(paths["base"]).selectExpr("count(*)", "sum(ver)").first()
        ),
    }
    assert len(set(results.values())) == 1, f"the copies differ: {results}"
    report = {
        "keys": args.keys,
        "batch": args.batch,
        "rounds": args.rounds,
        "per_cut_s_median": {name: round(statistics.median(v), 3) for name, v in times.items()},
        "per_cut_s": {name: [round(x, 3) for x in v] for name, v in times.items()},
        "replayed_cut_s": round(replay, 3),
        "reader_query_s": {
            "base alone": round(base_read, 3),
            f"base + tail of {args.rounds} cuts": round(merged_read, 3),
        },
        "fold_s": round(fold_s, 3),
        "rows_and_sum_of_ver": {k: list(v) for k, v in results.items()},
        "load_average_1m": {"start": round(load_at_start, 1), "end": round(os.getloadavg()[0], 1)},
    }
    floor = report["per_cut_s_median"]["spark MERGE"]
    for name, median in report["per_cut_s_median"].items():
        print(
            f"{name:15s} {median:6.3f} s per cut ({median / floor:.2f}x the Spark MERGE) rounds: {times[name]}"
        )
    print(f"a replayed cut (delta-rs guard only): {replay * 1000:.1f} ms")
    print(f"reader query: base alone {base_read:.3f} s, base + tail {merged_read:.3f} s; fold {fold_s:.2f} s")
    print(f"every copy: {results['spark MERGE']} (rows, sum of ver)")
    print(
        f"load average (1 min): {load_at_start:.1f} at start, {os.getloadavg()[0]:.1f} at end, {os.cpu_count()} CPUs"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    spark.stop()


if __name__ == "__main__":
    main()
