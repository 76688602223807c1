"""Search follower benchmark: changes/s of `cdc apply` into tantivy and into OpenSearch.

One run, one machine, throwaway services it starts and removes itself: a PostgreSQL 15
cluster (pipelines.devservices.postgres.LocalPostgres, wal_level=logical, fsync off: the
capture side is not what is measured here) and a real single-node OpenSearch 2.x
(pipelines.devservices.opensearch.LocalOpenSearch).

Workload (the issue's bench): a 10-column table (the shape of bench/capture.py: bigint key,
integer, numeric(12,2), float8, text, varchar, boolean, timestamptz, date, uuid) with --keys
rows (default 100,000), snapshotted and applied to both followers (the "initial" rows), then
--changes changes (default 1,000,000) over those keys in 1000-change transactions, each
900 updates (a sliding block of keys), 50 deletes and 50 inserts (the same 50 keys deleted and
inserted back), captured by `cdc stream --until current` into the local log. Then, timed:

    cdc apply PIPELINE --once --sink tantivy
    cdc apply PIPELINE --once --sink opensearch

each once (a follower's checkpoint moves on, so a cut is applied once), as a user runs it:
the real console entry in a subprocess, wall time from spawn to exit (Spark's JVM start-up
included) and the apply time the command reports itself ("applied cut ... in X s": reading
the log, net change per key, writing the index). The rate is log changes / time; "docs" is
how many index writes the net change amounted to (+inserted ~updated -deleted).

    .venv/bin/python bench/search.py [--changes N] [--keys N] [--verify] [--keep] [--json out.json]

A third measurement, the **floor**, runs in this process on its own SparkSession (start-up not
counted): the same log range read, reduced to the net change per key and handed to Python
executors as the sinks get it (`sinks.search.rows.write_frame`), but written nowhere. It
is what any follower pays before its engine does anything; apply time minus floor is the
engine's share. `--no-floor` skips it.

--verify also runs `cdc verify --sink <name>` for both followers (not timed into the rates).
About 6-8 minutes at the default size on 2 idle cores (more when the machine is busy: the load
average is printed at the start and the end).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from harness import cdcout
from harness.bench import Bench
from harness.main import main
from harness.report import Report
from harness.services import say, started
from harness.workload import COLUMNS, TXN_SIZE, WORD_NOTE, connect, row_expr, update_set

from pipelines.devservices.opensearch import LocalOpenSearch

TABLE = "public.bench_search"
UPDATES, DELETES = 900, 50  # per transaction; as many inserts as deletes
ROW_EXPR = row_expr(WORD_NOTE)
UPDATE_SET = update_set(note="'edit ' || left(md5((id + %(k)s)::text), 15)")
SINKS = ("tantivy", "opensearch")


def timed_apply(b: Bench, name: str, sink: str, pipeline: Path, changes: int) -> dict[str, Any]:
    run = b.cdc(name.replace(" ", "_"), "apply", pipeline, "--once", "--sink", sink)
    apply_s, detail = cdcout.applied(run.out, sink)
    inserted, updated, deleted, stale = cdcout.doc_counts(detail)
    say(
        f"  {name}: {run.wall_s:.1f}s wall, apply {apply_s:.1f}s: {changes / run.wall_s:,.0f} changes/s wall,"
        f" {changes / apply_s:,.0f}/s apply; docs +{inserted:,} ~{updated:,} -{deleted:,}"
    )
    return {
        "name": name,
        "wall_s": run.wall_s,
        "apply_s": apply_s,
        "changes": changes,
        "inserted": inserted,
        "updated": updated,
        "deleted": deleted,
        "stale": stale,
        "docs": inserted + updated + deleted,
    }


def applied_end(state_dir: Path, sink: str) -> int:
    """The log offset of the bench table a follower has applied up to (from its checkpoint)."""
    ckpt = json.loads((state_dir / "checkpoints" / f"{sink}.json").read_text())
    return ckpt["tables"][TABLE][1]


def _count(rows) -> list[int]:
    return [sum(1 for _ in rows)]


def floor(pipeline: Path, after: int, upto: int, changes: int) -> dict[str, Any]:
    """Read (after, upto] of the log, reduce it to the net change, bring the rows to Python executors."""
    from cdc.ground.tables import TableName
    from cdc.log import open_log_view
    from pipelines.apply.readers import change_reader
    from pipelines.spark import spark_session
    from sinks.changes import TableBatch
    from sinks.registry import load_pipeline
    from sinks.search.rows import write_frame

    p = load_pipeline(pipeline)
    spark = spark_session(p)
    log = open_log_view(p)
    try:
        table = TableName.parse(TABLE)
        started_at = time.monotonic()
        schema = log.schema(table)
        state = next(t for t in log.tables() if t.table == table)
        raw = change_reader(log).read_changes(spark, table, after, upto, schema)
        batch = TableBatch(table, schema, raw, False, state.snapshot_lsn, after, upto, log.value_kind)
        net = batch.net()
        frame, _layout = write_frame(spark, batch, net)
        rows = sum(frame.rdd.mapPartitions(_count).collect())
        elapsed = time.monotonic() - started_at
        batch.release()
    finally:
        log.close()
    say(
        f"  floor: {elapsed:.1f}s for {changes:,} changes -> {rows:,} net rows in Python: {changes / elapsed:,.0f} changes/s"
    )
    return {
        "name": "floor (no engine)",
        "wall_s": elapsed,
        "apply_s": elapsed,
        "changes": changes,
        "docs": rows,
    }


def workload(dsn: str, keys: int, changes: int) -> dict[str, int]:
    """`changes` changes in 1000-change transactions over keys 1..keys (every key exists after each)."""
    txns = changes // TXN_SIZE
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            for k in range(txns):
                up = (k * UPDATES) % keys
                dl = (k * DELETES * 7 + keys // 2) % keys
                block = f"SELECT mod(%(s)s + i, {keys}) + 1 FROM generate_series(0, %(n)s - 1) i"
                cur.execute(
                    f"UPDATE bench_search SET {UPDATE_SET} WHERE id IN ({block})",
                    {"k": k, "s": up, "n": UPDATES},
                )
                cur.execute(f"DELETE FROM bench_search WHERE id IN ({block})", {"s": dl, "n": DELETES})
                cur.execute(
                    f"INSERT INTO bench_search SELECT {ROW_EXPR} FROM ({block}) AS b(g)",
                    {"s": dl, "n": DELETES},
                )
                conn.commit()
    finally:
        conn.close()
    return {
        "transactions": txns,
        "updates": txns * UPDATES,
        "deletes": txns * DELETES,
        "inserts": txns * DELETES,
    }


def body(b: Bench) -> Report:
    args = b.args
    b.results["config"].update(changes=args.changes, keys=args.keys)
    say(f"search bench: {args.changes:,} changes over {args.keys:,} keys")
    b.start_postgres(durable=False)
    node = started(b.stack, LocalOpenSearch(b.work / "opensearch", heap=args.heap), "OpenSearch")
    t = time.monotonic()
    b.sql(
        f"CREATE TABLE bench_search ({COLUMNS})",
        f"INSERT INTO bench_search SELECT {ROW_EXPR} FROM generate_series(1, {args.keys}) g",
        "VACUUM ANALYZE bench_search",
    )
    say(f"table loaded with {args.keys:,} rows in {time.monotonic() - t:.1f}s")
    pipeline = b.pipeline(
        "bench_search",
        [TABLE],
        sinks=[
            {"name": "tantivy", "search": {"engine": "tantivy", "tables": [TABLE]}},
            {
                "name": "opensearch",
                "search": {"engine": "opensearch", "tables": [TABLE], "hosts": [node.url], "replicas": 0},
            },
        ],
        spark={"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": 4}},
    )
    say(f"cdc snapshot: {b.cdc('search_snapshot', 'snapshot', pipeline, '--no-progress').wall_s:.1f}s")
    runs = [timed_apply(b, f"initial {sink}", sink, pipeline, args.keys) for sink in SINKS]

    t = time.monotonic()
    b.results["workload"] = counts = workload(b.dsn, args.keys, args.changes)
    say(f"workload: {counts} in {time.monotonic() - t:.1f}s")
    b.sql("SET synchronous_commit = on", "CREATE TABLE flush_marker(x int)")  # make every commit durable
    run = b.cdc("search_stream", "stream", pipeline, "--until", "current")
    events = cdcout.stream(run.out)["events"]
    say(f"cdc stream --until current: {events:,} events in {run.wall_s:.1f}s")
    b.results["log_events"] = events

    state_dir = b.state("bench_search")
    before = applied_end(state_dir, "tantivy")
    runs += [timed_apply(b, f"apply {sink}", sink, pipeline, events) for sink in SINKS]
    if not args.no_floor:
        runs.append(floor(pipeline, before, applied_end(state_dir, "tantivy"), events))
    if args.verify:
        for sink in SINKS:
            v = b.cdc(f"verify_{sink}", "verify", pipeline, "--sink", sink, check=False)
            say(
                f"cdc verify --sink {sink}: exit {v.code} in {v.wall_s:.1f}s: {(v.out.strip().splitlines() or [''])[-1]}"
            )
            b.results[f"verify_{sink}"] = v.code
    b.results["runs"] = runs

    return summary(b.results)


def summary(r: dict) -> Report:
    """The side-by-side table of a run's results: each engine's apply against the floor (the log
    read and net change alone, the most any follower could reach)."""
    rep = Report(
        "Search followers: cdc apply into tantivy and OpenSearch (bench/search.py)",
        ("wall s", "apply s", "docs"),
    )
    rep.subtitle = (
        f"{r['config']['changes']:,} changes over {r['config']['keys']:,} keys;"
        " rates in the apply's own time (wall includes Spark start-up)"
    )
    floors = [run for run in r["runs"] if run["name"].startswith("floor")]
    floor_rate = floors[0]["changes"] / floors[0]["apply_s"] if floors else None
    for run in r["runs"]:
        initial = run["name"].startswith("initial")
        rate = run["changes"] / run["apply_s"]
        rep.add(
            "initial rows (the snapshot)" if initial else "the workload's changes",
            run["name"],
            rate,
            "changes/s",
            role="ceiling" if run in floors else "cdc",
            ratio=None if initial or not floor_rate else rate / floor_rate,
            wall_s=f"{run['wall_s']:.1f}",
            apply_s=f"{run['apply_s']:.1f}",
            docs=f"{run['docs']:,}",
            notes=f"{run['changes'] / run['wall_s']:,.0f}/s wall",
        )
    rep.summary.append(
        "floor: reading the log + net change + rows into Python, no engine, in-process, no start-up"
    )
    return rep


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--verify", action="store_true", help="also `cdc verify` both followers afterwards")
    ap.add_argument("--heap", default="1g", help="OpenSearch JVM heap (default 1g)")
    ap.add_argument("--no-floor", action="store_true", help="skip the in-process floor measurement")
    return ap


def check(args: argparse.Namespace) -> str | None:
    if args.changes % TXN_SIZE or args.keys < UPDATES:
        return f"--changes must be a multiple of {TXN_SIZE} and --keys at least {UPDATES}"
    return None


if __name__ == "__main__":
    sys.exit(main(parser(), body, prefix="search", check=check))
