"""Apply benchmark: how fast does `cdc apply` move the log into Delta, and how fresh is Delta?

Run from the repo root:  .venv/bin/python bench/apply.py [--changes 1000000] [--keys 100000]
                                                          [--rate 2000] [--seconds 60] [--json out.json]
                                                          [--tables 1,10,100 [--parallelism N]]

1. Throughput. A 10-column table with `--keys` rows is snapshotted, then `--changes` updates
   over those keys (1000-row transactions) are streamed into the local log. One
   `cdc apply --once` then applies everything to a fresh Delta table (one batch: the
   snapshot plus every change). Side by side, the ceiling: a plain Delta MERGE of the same
   final rows (already netted, read from Parquet) into an equally fresh table — what Spark and
   Delta cost without the log read, the net-change computation and the checks. (The chart
   draws it as the events/s apply would reach if it cost only that MERGE.)
2. Freshness. `cdc stream` runs continuously (as `cdc run` runs it) and the apply loop runs
   with a 1 s trigger while a writer commits `--rate` changes/s for `--seconds`. Every
   transaction stamps its rows with its number and notes the WAL position after its commit;
   after each applied batch, the transactions before the batch's cut LSN became visible then
   (checked at the end against the newest number in the Delta table). Freshness of a transaction =
   visible time - commit time; p50/p99 are reported.

3. Cost vs tables touched (`--tables 1,10,100`, only with that option). For each N: N tables
   holding `--keys` rows between them, snapshotted and applied to two fresh Delta followers
   (not timed); then `--changes` updates spread evenly over the N tables (one per key) are
   streamed, and one `cdc apply --once` per follower applies that same cut: one with
   `spark.apply_parallelism: 1` (the tables one after another), one side by side
   (`--parallelism`, default the automatic one). Reported: seconds per cut and each against
   the 1-table cut of the same mode.

4. A cut of inserts alone (`--only inserts`, only with that option): `--inserts` new rows (default
   10,000, 1000-row transactions) into a table of `--keys` rows, applied by two Delta followers of
   the same log, each with one `cdc apply --once`: one as shipped (the cut appended,
   sinks/delta/sink.py `_appends`), one with every cut MERGEd as before (DeltaSink.append_inserts
   off). Beside them, the floor: a bare Delta append of the same rows (read back once, kept in
   Parquet) into a copy of the table. `--repeat` rounds (default 3), the followers' order
   alternating; medians. Target: the appended cut <= 1.3x the bare append. `--profile DIR`
   writes a cProfile of each cut's apply (where its time goes, in shares).

All apply in this process (pipelines.apply.job.ApplyJob on one SparkSession, start-up not
counted). It starts its own PostgreSQL (bench/harness) and removes it.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from harness.bench import BIN, Bench
from harness.inproc import MASTER, apply_job, job_names, last_job_id
from harness.main import main
from harness.report import Report
from harness.services import say
from harness.workload import connect

TABLE = """
CREATE TABLE bench (
    id bigint PRIMARY KEY, ver bigint NOT NULL, qty int, price numeric(12,2), ratio float8,
    name text, code varchar(20), active bool, updated_at timestamptz, day date)
"""
SEED = """
INSERT INTO bench SELECT g, 0, g %% 100, g * 1.5, g / 7.0, 'name ' || g, 'c' || (g %% 1000), g %% 2 = 0, now(), current_date
FROM generate_series(1, %(keys)s) g
"""
UPDATE = """
UPDATE bench SET ver = %(ver)s, qty = qty + 1, price = price + 0.01, updated_at = clock_timestamp()
WHERE id IN (SELECT 1 + floor(random() * %(keys)s)::bigint FROM generate_series(1, %(n)s))
"""
SPARK = {"master": MASTER}


def write_changes(dsn: str, keys: int, changes: int, per_txn: int = 1000) -> int:
    """`changes` row updates over `keys` keys, `per_txn` per transaction; returns rows updated."""
    conn = connect(dsn)
    done, ver = 0, 0
    with conn.cursor() as cur:
        while done < changes:
            ver += 1
            cur.execute(UPDATE, {"ver": ver, "keys": keys, "n": min(per_txn, changes - done)})
            done += cur.rowcount
            conn.commit()
    conn.close()
    return done


def throughput(b: Bench) -> dict:
    keys, changes = b.args.keys, b.args.changes
    say(f"throughput: {changes:,} changes over {keys:,} keys, one `cdc apply --once`")
    b.sql(TABLE, SEED % {"keys": keys})
    pipe = b.pipeline(
        "benchapply", ["public.bench"], sinks=[{"name": "lake", "delta": {"path": "lake"}}], spark=SPARK
    )
    b.cdc("apply_snapshot", "snapshot", pipe, "--no-progress")
    t0 = time.monotonic()
    written = write_changes(b.dsn, keys, changes)
    write_s = time.monotonic() - t0
    stream_s = b.cdc("apply_stream", "stream", pipe, "--until", "current").wall_s
    say(f"  {written:,} changes written in {write_s:.1f}s, streamed into the log in {stream_s:.1f}s")

    spark, job = apply_job(pipe)
    t0 = time.monotonic()
    runs = job.run_once()
    apply_s = time.monotonic() - t0
    assert not any(r.error for r in runs), [r.error for r in runs]

    # The ceiling: MERGE of the same final rows (netted already) from Parquet into a fresh table.
    from delta.tables import DeltaTable

    final = spark.read.format("delta").load(str(b.work / "lake/public/bench"))
    parquet = str(b.work / "net.parquet")
    final.write.mode("overwrite").parquet(parquet)
    target_path = str(b.work / "ceiling")
    final.limit(0).write.format("delta").save(target_path)
    source = spark.read.parquet(parquet)
    t0 = time.monotonic()
    (
        DeltaTable.forPath(spark, target_path)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    ceiling_s = time.monotonic() - t0
    total = written + keys
    r = {
        "keys": keys,
        "changes": written,
        "events_applied": total,
        "apply_once_s": round(apply_s, 2),
        "apply_changes_per_s": round(total / apply_s),
        "ceiling_merge_s": round(ceiling_s, 2),
        "ceiling_rows_per_s_of_net": round(keys / ceiling_s),
        "stream_s": round(stream_s, 2),
    }
    say(
        f"apply: cdc apply --once {r['apply_changes_per_s']:,} events/s ({total:,} in {r['apply_once_s']}s) "
        f"| ceiling: plain MERGE of the netted rows {r['ceiling_merge_s']}s"
    )
    return r


def freshness(b: Bench) -> dict:
    keys, rate, seconds = b.args.keys, b.args.rate, b.args.seconds
    say(f"freshness: {rate:,} changes/s for {seconds}s, 1 s trigger")
    b.sql(
        "CREATE TABLE fresh (id bigint PRIMARY KEY, ver bigint NOT NULL, v text)",
        f"INSERT INTO fresh SELECT g, 0, 'x' FROM generate_series(1, {keys}) g",
    )
    iceberg = b.args.follower == "iceberg"  # merge-on-read (the default), SQLite catalog
    sink = {"name": "ice", "iceberg": {"warehouse": "fresh-ice"}} if iceberg else None
    pipe = b.pipeline(
        "benchfresh",
        ["public.fresh"],
        sinks=[sink or {"name": "lake", "delta": {"path": "fresh-lake"}}],
        spark={**SPARK, "trigger_interval_s": 1},
        stream={"batch_max_seconds": 0.2},
    )
    b.cdc("fresh_snapshot", "snapshot", pipe, "--no-progress")
    confs = dict(c.split("=", 1) for c in b.args.conf)
    spark, job = apply_job(pipe, confs)
    if b.args.steps:
        from pipelines.stages import Stages, activate

        activate(Stages(tty=False))
    job.run_once()  # bootstrap outside the measured window
    batch_s: list[float] = []
    batch_jobs: list[int] = []  # Spark jobs each batch started: the per-cut cost that sets freshness
    stream = subprocess.Popen(
        [str(BIN / "cdc"), "stream", str(pipe)], stdout=subprocess.DEVNULL, env=b.cdc_env()
    )
    commits: dict[
        int, tuple[float, int]
    ] = {}  # transaction number -> (commit time, WAL position after its commit)
    stop = threading.Event()

    def writer() -> None:
        c = connect(b.dsn)
        c.autocommit = True
        per_txn = max(1, rate // 20)  # 20 transactions per second
        ver = 0
        with c.cursor() as cur:
            next_at = time.monotonic()
            while not stop.is_set():
                ver += 1
                cur.execute(
                    "UPDATE fresh SET ver = %s WHERE id IN (SELECT 1 + floor(random() * %s)::bigint FROM generate_series(1, %s))",
                    (ver, keys, per_txn),
                )
                committed = time.time()
                cur.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint")  # at or after its commit record
                commits[ver] = (committed, cur.fetchone()[0])
                next_at += 1 / 20
                time.sleep(max(0.0, next_at - time.monotonic()))
        c.close()

    thread = threading.Thread(target=writer, daemon=True)
    samples: list[float] = []
    seen = 0
    thread.start()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            started, jobs_before = time.monotonic(), last_job_id(spark)
            (run,) = job.run_once()
            visible_at = time.time()
            batch_s.append(time.monotonic() - started)
            batch_jobs.append(last_job_id(spark) - jobs_before)
            if b.args.steps:  # the profile of this batch: which Spark jobs it started
                for line in job_names(spark, jobs_before, jobs_before + batch_jobs[-1]):
                    print(f"  job {line}", file=sys.stderr)
            # The applied cut holds every transaction committed before its LSN: those are visible
            # now. (Reading the table here instead would delay the next batch, which `cdc apply`
            # does not do; the table is checked once at the end.)
            while seen + 1 in commits and commits[seen + 1][1] <= (run.lsn or 0):
                seen += 1
                samples.append(visible_at - commits[seen][0])
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    finally:
        stop.set()
        thread.join()
        stream.send_signal(signal.SIGTERM)
        stream.wait(60)
    lake = str(b.work / "fresh-lake/public/fresh")
    table = spark.table("ice.public.fresh") if iceberg else spark.read.format("delta").load(lake)
    newest = table.agg({"ver": "max"}).first()[0] or 0
    assert newest >= seen, f"transactions up to {seen} counted as visible, but the table's newest is {newest}"
    updates = rate * statistics.median(batch_s) if batch_s else 0
    if not batch_s:
        floor_s = None
    elif iceberg:  # the same floor in Iceberg: a bare MERGE of as many keys into the follower table
        floor_s = statistics.median(
            bare_merge_keys(spark, "ice.public.fresh", keys, int(updates), i + 1) for i in range(3)
        )
    else:
        floor_s = plain_merge_s(spark, lake, updates, keys)
    samples.sort()
    f = {
        "rate_changes_per_s": rate,
        "seconds": seconds,
        "transactions_measured": len(samples),
        "freshness_p50_s": round(statistics.median(samples), 2) if samples else None,
        "freshness_p99_s": round(samples[int(len(samples) * 0.99) - 1], 2) if samples else None,
        "freshness_max_s": round(samples[-1], 2) if samples else None,
        "batches": len(batch_s),
        "batch_s_p50": round(statistics.median(batch_s), 2) if batch_s else None,
        "batch_s_max": round(max(batch_s), 2) if batch_s else None,
        "batch_spark_jobs_p50": statistics.median(batch_jobs) if batch_jobs else None,
        "plain_merge_of_a_batch_s": round(floor_s, 2) if floor_s is not None else None,
        "confs": confs,
        "follower": b.args.follower,
    }
    batches = (
        f"{f['batches']} batches, apply per batch p50 {f['batch_s_p50']}s, max {f['batch_s_max']}s, "
        f"{f['batch_spark_jobs_p50']} Spark jobs; a plain MERGE of as many updates {f['plain_merge_of_a_batch_s']}s"
    )
    if samples:
        say(
            f"freshness: p50 {f['freshness_p50_s']}s, p99 {f['freshness_p99_s']}s, max {f['freshness_max_s']}s ({batches})"
        )
    else:  # the stream had not brought a transaction into an applied cut before the window ended
        say(f"freshness: no transaction became visible within {seconds}s ({batches}); try a longer --seconds")
    return f


def bare_merge(session, path: str, source) -> None:
    """A bare Delta MERGE into a follower table: match on id, update `ver` from `source`; nothing
    read from a log, checked or recorded (the floor the benchmarks put beside cdc's apply)."""
    from delta.tables import DeltaTable

    DeltaTable.forPath(session, path).alias("t").merge(source.alias("s"), "t.id = s.id").whenMatchedUpdate(
        set={"ver": "s.ver"}
    ).execute()


def bare_merges_s(spark, paths: list[str], updates: int, parallelism: int) -> float:
    """The floor under a cut over N tables: a bare MERGE of `updates` keys into each table,
    `parallelism` tables at a time in the apply's own thread pool (run after the measured cuts:
    it changes `ver`)."""
    from pyspark.sql import functions as F

    from pipelines.apply.parallel import run_tasks

    def merge(slot) -> None:
        source = slot.spark.range(1, updates + 1).select(F.col("id"), F.lit(-1).cast("long").alias("ver"))
        bare_merge(slot.spark, slot.item, source)

    t0 = time.monotonic()
    run_tasks(paths, merge, parallelism, spark, "bench")
    return round(time.monotonic() - t0, 2)


def plain_merge_s(spark, path: str, updates: float, keys: int, repeat: int = 3) -> float:
    """The floor under one apply batch: a bare MERGE of `updates` random keys into the follower
    table itself; median of `repeat` (run after the measured window: it changes `ver`)."""
    from pyspark.sql import functions as F

    times = []
    for seed in range(repeat):
        source = (
            spark.range(int(updates))
            .select(
                (F.floor(F.rand(seed) * keys) + 1).cast("long").alias("id"),
                F.lit(-1).cast("long").alias("ver"),
            )
            .dropDuplicates(["id"])
        )
        t0 = time.monotonic()
        bare_merge(spark, path, source)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def bare_merge_keys(spark, target: str, keys: int, n: int, seed: int) -> float:
    """MERGE `n` random keys (update `ver`) into the table `target` (a Spark SQL name): the floor
    under a small cut. The keys are drawn here, not by rand() in Spark: a copy-on-write MERGE
    refuses a non-deterministic source."""
    rows = [(k, -seed) for k in random.Random(seed).sample(range(1, keys + 1), min(n, keys))]
    spark.createDataFrame(rows, "id long, ver long").createOrReplaceTempView("_bench_keys")
    t0 = time.monotonic()
    spark.sql(
        f"MERGE INTO {target} t USING _bench_keys s ON t.id = s.id WHEN MATCHED THEN UPDATE SET t.ver = s.ver"
    )
    return time.monotonic() - t0


def make_tables(b: Bench, names: list[str], keys: int) -> None:
    statements = []
    for name in names:
        statements += [
            f"CREATE TABLE {name} (id bigint PRIMARY KEY, ver bigint NOT NULL, v text)",
            f"INSERT INTO {name} SELECT g, 0, 'x' || g FROM generate_series(1, {keys}) g",
        ]
    b.sql(*statements)


def update_tables(dsn: str, names: list[str], per_table: int, per_txn: int = 1000) -> int:
    """`per_table` updates of distinct keys in every table, at most `per_txn` rows per transaction."""
    conn = connect(dsn)
    done = 0
    with conn.cursor() as cur:
        for name in names:
            for first in range(1, per_table + 1, per_txn):
                last = min(per_table, first + per_txn - 1)
                cur.execute(f"UPDATE {name} SET ver = ver + 1 WHERE id BETWEEN %s AND %s", (first, last))
                done += cur.rowcount
                conn.commit()
    conn.close()
    return done


def with_parallelism(pipe: Path, parallelism: int | None):
    from sinks.registry import load_pipeline

    pipeline = load_pipeline(pipe)
    return pipeline.model_copy(
        update={"spark": pipeline.spark.model_copy(update={"apply_parallelism": parallelism})}
    )


def tables_cost(b: Bench) -> dict:
    """The same number of changes in one cut, spread over N tables: seconds per cut, the tables
    one after another (apply_parallelism 1) and side by side."""
    from pipelines.apply.job import ApplyJob
    from pipelines.apply.parallel import auto_parallelism

    changes, keys = b.args.changes, b.args.keys
    out: dict = {}
    for n in b.args.tables:
        names = [f"tb{n}_{i}" for i in range(n)]
        per_keys = max(1, keys // n)
        per_table = min(per_keys, max(1, changes // n))
        say(f"tables: {n} table(s) of {per_keys:,} rows, {per_table:,} updates each")
        make_tables(b, names, per_keys)
        pipe = b.pipeline(
            f"benchtables{n}",
            [f"public.{t}" for t in names],
            sinks=[
                {"name": "seq", "delta": {"path": f"t{n}-seq"}},
                {"name": "par", "delta": {"path": f"t{n}-par"}},
            ],
            spark=SPARK,
        )
        b.cdc(f"tables{n}_snapshot", "snapshot", pipe, "--no-progress")
        spark, job = apply_job(pipe)
        bootstrap = job.run_once()  # both followers, not measured
        assert not any(r.error for r in bootstrap), [r.error for r in bootstrap]
        written = update_tables(b.dsn, names, per_table)
        b.cdc(f"tables{n}_stream", "stream", pipe, "--until", "current")
        parallel = b.args.parallelism or auto_parallelism(spark.sparkContext.defaultParallelism)
        row = {"tables": n, "changes": written, "parallelism": parallel}
        for sink, parallelism in (("seq", 1), ("par", parallel)):
            job = ApplyJob(with_parallelism(pipe, parallelism), spark)
            t0 = time.monotonic()
            (run,) = job.run_once(sink)
            row[f"{sink}_s"] = round(time.monotonic() - t0, 2)
            assert run.error is None and not run.up_to_date, (run.error, run.up_to_date)
        paths = [str(b.work / f"t{n}-par/public/{t}") for t in names]
        row["bare_merges_s"] = bare_merges_s(spark, paths, per_table, parallel)
        say(
            f"  {n} table(s), {written:,} changes: one after another {row['seq_s']}s, "
            f"side by side ({parallel} threads) {row['par_s']}s; "
            f"floor: a bare MERGE per table, side by side {row['bare_merges_s']}s"
        )
        out[str(n)] = row
    return out


def insert_rows(dsn: str, first: int, count: int, per_txn: int = 1000) -> None:
    """Rows first .. first + count - 1 of the bench table's shape into `ev`, `per_txn` per transaction."""
    conn = connect(dsn)
    with conn.cursor() as cur:
        for lo in range(first, first + count, per_txn):
            hi = min(first + count, lo + per_txn) - 1
            cur.execute(
                SEED.replace("bench", "ev").replace("1, %(keys)s", "%(lo)s, %(hi)s"), {"lo": lo, "hi": hi}
            )
            conn.commit()
    conn.close()


@contextlib.contextmanager
def _profiled(where: str | None, name: str) -> Iterator[None]:
    """cProfile of the block into WHERE/NAME.prof (`--profile`; read with `python -m pstats`);
    nothing when WHERE is None. The profiler slows the block: its times are for shares, not figures."""
    if where is None:
        yield
        return
    import cProfile

    Path(where).mkdir(parents=True, exist_ok=True)
    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        profile.dump_stats(str(Path(where) / f"{name}.prof"))


def inserts_cost(b: Bench) -> dict:
    """A cut of inserts alone: seconds per cut appended, MERGEd (as before), and the bare append."""
    from sinks.delta.sink import DeltaSink

    keys, count, repeat = b.args.keys, b.args.inserts, b.args.repeat
    say(f"inserts: cuts of {count:,} new rows into a table of {keys:,}, {repeat} round(s)")
    b.sql(TABLE.replace("bench", "ev"), SEED.replace("bench", "ev") % {"keys": keys})
    pipe = b.pipeline(
        "benchinserts",
        ["public.ev"],
        sinks=[
            {"name": "append", "delta": {"path": "ins-append"}},
            {"name": "merge", "delta": {"path": "ins-merge"}},
        ],
        spark=SPARK,
    )
    b.cdc("inserts_snapshot", "snapshot", pipe, "--no-progress")
    spark, job = apply_job(pipe)
    if b.args.steps:
        from pipelines.stages import Stages, activate

        activate(Stages(tty=False))
    first_runs = job.run_once()  # both followers' first base: not measured
    assert not any(r.error for r in first_runs), [r.error for r in first_runs]
    paths = {sink: str(b.work / f"ins-{sink}/public/ev") for sink in ("append", "merge")}
    floor = str(b.work / "ins-floor")
    spark.read.format("delta").load(paths["append"]).write.format("delta").save(floor)
    seconds: dict[str, list[float]] = {"append": [], "merge": [], "bare": []}
    jobs: dict[str, list[int]] = {"append": [], "merge": []}
    first = keys + 1
    for r in range(repeat):
        insert_rows(b.dsn, first, count)
        b.cdc(f"inserts_stream{r}", "stream", pipe, "--until", "current")
        for sink in ("append", "merge") if r % 2 == 0 else ("merge", "append"):
            DeltaSink.append_inserts = sink == "append"
            try:
                before = last_job_id(spark)
                t0 = time.monotonic()
                with _profiled(b.args.profile, f"{sink}-{r + 1}"):
                    (run,) = job.run_once(sink)
                seconds[sink].append(time.monotonic() - t0)
                jobs[sink].append(last_job_id(spark) - before)
            finally:
                DeltaSink.append_inserts = True
            assert run.error is None and not run.up_to_date, (run.error, run.up_to_date)
            ops = [
                c["operation"]
                for c in delta_commits(paths[sink])
                if c["txn"] and c["txn"]["version"] == run.cut_id
            ]
            assert ops == (["WRITE"] if sink == "append" else ["MERGE"]), (sink, ops)
        parquet = str(b.work / f"ins-rows-{r}.parquet")
        added = spark.read.format("delta").load(paths["append"]).where(f"id >= {first}")
        added.write.parquet(parquet)  # the same rows, typed: what the bare append writes
        rows = spark.read.parquet(parquet)
        t0 = time.monotonic()
        rows.write.format("delta").mode("append").save(floor)
        seconds["bare"].append(time.monotonic() - t0)
        first += count
        say(
            f"  round {r + 1}: appended {seconds['append'][-1]:.2f}s, MERGEd {seconds['merge'][-1]:.2f}s, "
            f"bare append {seconds['bare'][-1]:.2f}s"
        )
    out: dict = {"keys": keys, "inserts": count, "rounds": repeat}
    for what, values in seconds.items():
        out[f"{what}_s"] = round(statistics.median(values), 2)
        out[f"{what}_s_all"] = [round(v, 2) for v in values]
    for what, values in jobs.items():
        out[f"{what}_spark_jobs"] = statistics.median(values)
    say(
        f"inserts: a cut of {count:,} inserts appended {out['append_s']}s ({out['append_spark_jobs']} Spark jobs), "
        f"MERGEd {out['merge_s']}s ({out['merge_spark_jobs']} jobs); a bare append {out['bare_s']}s "
        f"(appended = {out['append_s'] / out['bare_s']:.2f}x the bare append)"
    )
    return out


def delta_commits(path: str) -> list[dict]:
    """Each commit of a Delta table: its operation and idempotent-write txn (from its JSON log)."""
    import json

    out = []
    for f in sorted(Path(path, "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        out.append(
            {"operation": info.get("operation"), "txn": next((a["txn"] for a in actions if "txn" in a), None)}
        )
    return out


def body(b: Bench) -> Report:
    args = b.args
    b.results["config"].update(changes=args.changes, keys=args.keys, rate=args.rate, seconds=args.seconds)
    b.start_postgres(durable=True)
    into = (
        "Delta, freshness into Iceberg" if args.follower == "iceberg" else "Delta"
    )  # --follower: freshness only
    rep = Report(f"Apply into {into} (bench/apply.py)", ("seconds",))
    rep.subtitle = f"{args.changes:,} changes over {args.keys:,} keys; freshness at {args.rate:,} changes/s for {args.seconds}s"
    if args.only in (None, "throughput") and not (args.tables and args.only is None):
        t = b.results["throughput"] = throughput(b)
        rep.add(
            "throughput",
            "cdc apply --once",
            t["apply_changes_per_s"],
            "events/s",
            ratio=t["ceiling_merge_s"] / t["apply_once_s"],
            seconds=f"{t['apply_once_s']:.2f}",
            notes="log read + net change + MERGE + checks, in-process",
        )
        rep.add(
            "throughput",
            "plain MERGE of the netted rows",
            t["events_applied"] / t["ceiling_merge_s"],
            "events/s",
            role="ceiling",
            ratio=1.0,
            seconds=f"{t['ceiling_merge_s']:.2f}",
            notes="events / the MERGE's time",
        )
    if args.tables:
        rows = b.results["tables"] = tables_cost(b)
        first = rows[str(args.tables[0])]
        for n in args.tables:
            row = rows[str(n)]
            for key, role, how in (
                ("par_s", "cdc", f"side by side, apply_parallelism {row['parallelism']}"),
                ("seq_s", "peer", "one after another, apply_parallelism 1"),
            ):
                rep.add(
                    "tables",
                    f"{n} table(s), {how}",
                    row[key],
                    "s",
                    role=role,
                    ratio=row[key] / first[key],
                    less_is_better=True,
                    seconds=f"{row[key]:.2f}",
                    notes=f"{row['changes']:,} changes in one cut; ratio: x the {args.tables[0]}-table cut",
                )
            rep.add(
                "tables",
                f"{n} table(s), a bare MERGE per table, side by side",
                row["bare_merges_s"],
                "s",
                role="ceiling",
                ratio=row["bare_merges_s"] / first["bare_merges_s"],
                less_is_better=True,
                seconds=f"{row['bare_merges_s']:.2f}",
                notes="the floor: no log, no checks, no markers or cut records",
            )
    if args.only == "inserts":
        rep.subtitle = (
            f"cuts of {args.inserts:,} inserts into a table of {args.keys:,} rows, {args.repeat} round(s)"
        )
        i = b.results["inserts"] = inserts_cost(b)
        rep.targets["inserts"] = (1.3, "target: the appended cut <= 1.3x a bare append")
        for key, name, role in (
            ("append_s", "cdc apply --once, the cut appended", "cdc"),
            ("merge_s", "cdc apply --once, the cut MERGEd (before)", "peer"),
            ("bare_s", "a bare Delta append of the same rows", "ceiling"),
        ):
            rep.add(
                "inserts",
                name,
                i[key],
                "s",
                role=role,
                ratio=i[key] / i["bare_s"],
                less_is_better=True,
                seconds=f"{i[key]:.2f}",
                notes=f"{i['inserts']:,} inserts into {i['keys']:,} rows; median of {i['rounds']}; ratio: x the bare append",
            )
    if args.only in (None, "freshness") and not (args.tables and args.only is None):
        f = b.results["freshness"] = freshness(b)
        rep.targets["freshness"] = (3.0, "target: p99 < 3 s (issue 15 item 5)")
        for key, name in (("freshness_p50_s", "p50"), ("freshness_p99_s", "p99"), ("freshness_max_s", "max")):
            if f[key] is not None:
                rep.add(
                    "freshness",
                    f"commit to visible in {'Iceberg' if args.follower == 'iceberg' else 'Delta'}, {name}",
                    f[key],
                    "s",
                    less_is_better=True,
                    seconds=f"{f[key]:.2f}",
                    notes="target p99 < 3 s" if name == "p99" else "",
                )
        if f["batch_s_p50"] is not None:
            rep.add(
                "freshness",
                f"plain {'Iceberg' if args.follower == 'iceberg' else 'Delta'} MERGE of one batch's updates",
                f["plain_merge_of_a_batch_s"],
                "s",
                role="ceiling",
                less_is_better=True,
                seconds=f"{f['plain_merge_of_a_batch_s']:.2f}",
                notes="the floor under a batch: no log, no checks",
            )
            rep.add(
                "freshness",
                "one apply batch, p50",
                f["batch_s_p50"],
                "s",
                role="diag",
                less_is_better=True,
                seconds=f"{f['batch_s_p50']:.2f}",
                notes=f"{f['batches']} batches",
            )
    return rep


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--only", choices=["throughput", "freshness", "inserts"])
    ap.add_argument(
        "--follower",
        choices=["delta", "iceberg"],
        default="delta",
        help="freshness: the follower measured (iceberg: merge-on-read, SQLite catalog; its floor a bare Iceberg MERGE)",
    )
    ap.add_argument("--inserts", type=int, default=10_000, help="inserts: rows in each cut of inserts alone")
    ap.add_argument("--repeat", type=int, default=3, help="inserts: rounds (medians are reported)")
    ap.add_argument(
        "--tables",
        type=lambda text: [int(n) for n in text.split(",")],
        help="cost vs tables touched: the same --changes spread over each number of tables (e.g. 1,10,100); "
        "runs only this part unless --only names another",
    )
    ap.add_argument("--parallelism", type=int, help="--tables: apply_parallelism of the side-by-side runs")
    ap.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="freshness: a runtime Spark SQL conf to try (repeatable)",
    )
    ap.add_argument(
        "--profile",
        metavar="DIR",
        help="inserts: a cProfile of each cut's `cdc apply --once` step into DIR (append-N.prof, merge-N.prof)",
    )
    ap.add_argument(
        "--steps",
        action="store_true",
        help="freshness, inserts: print each step of every apply batch with its time on stderr (pipelines/stages.py)",
    )
    return ap


if __name__ == "__main__":
    sys.exit(main(parser(), body, prefix="apply"))
