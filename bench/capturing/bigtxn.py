"""Part 3: one transaction inserting `--rows` rows into a fresh table; `cdc stream --until current`
(peak RSS: bounded memory?) with pg_recvlogical over the same transaction for reference."""

from __future__ import annotations

import time

from harness import cdcout
from harness.bench import Bench
from harness.proc import cpu_note, dir_bytes
from harness.report import fmt_mb
from harness.services import say
from harness.workload import COLUMNS, ROW_EXPR

from capturing.profile import profile

TABLE = "public.bench_big"
PUBLICATION = "bench_big_pub"


def big_transaction(b: Bench) -> None:
    b.load("before part 3")
    say("\n== 3. one big transaction ==")
    rows = b.args.rows
    # Its own empty table, pipeline and slots, all created right before the transaction, so both
    # sides decode exactly the same WAL (an older slot would first re-decode parts 1 and 2).
    b.sql(f"CREATE TABLE {TABLE} ({COLUMNS})", f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")
    pipe = b.pipeline(
        "bench_big", [TABLE], slot="bench_big_cdc", publication=PUBLICATION, log=b.local_log("bench_big")
    )
    b.cdc("big_snapshot", "snapshot", pipe, "--no-progress")
    if b.args.profile:
        prof_pipe = b.pipeline(
            "bench_big_prof",
            [TABLE],
            slot="bench_big_prof",
            publication=PUBLICATION,
            log=b.local_log("bench_big_prof"),
        )
        b.cdc("big_prof_snapshot", "snapshot", prof_pipe, "--no-progress")
    b.create_slot("bench_big_recv")
    t0 = time.perf_counter()
    b.sql(f"INSERT INTO {TABLE} SELECT {ROW_EXPR} FROM generate_series(1, {rows}) AS g")
    seconds = time.perf_counter() - t0
    end_lsn = b.lsn()
    say(f"one transaction inserting {rows:,} rows in {seconds:.1f}s; end LSN {end_lsn}")
    b.sql("CHECKPOINT")

    recv = b.recvlogical("big_recvlogical", "bench_big_recv", end_lsn, PUBLICATION)
    say(f"  pg_recvlogical: {recv.wall_s:.2f}s, {rows / recv.wall_s:,.0f} events/s, {cpu_note(recv)}")
    b.drop_slots("bench_big_recv")
    log = b.state("bench_big") / "log"
    before = dir_bytes(log)
    run = b.cdc("big_cdc", "stream", pipe, "--until", "current")
    got = cdcout.stream(run.out)
    growth = dir_bytes(log) - before
    say(
        f"  cdc stream: {run.wall_s:.2f}s, {got['events'] / run.wall_s:,.0f} events/s, {cpu_note(run)},"
        f" peak RSS {fmt_mb(run.peak_rss_bytes)}, log +{fmt_mb(growth)}"
    )
    if got["events"] != rows:
        say(f"WARNING: cdc stream logged {got['events']:,} events, the transaction had {rows:,}")
    b.results["big_txn"] = {
        "rows": rows,
        "insert_s": seconds,
        "pg_recvlogical": {
            "wall_s": recv.wall_s,
            "events_per_s": rows / recv.wall_s,
            "cpu_s": recv.cpu_s,
            "server_cpu_s": recv.server_cpu_s or 0,
        },
        "cdc_stream": {
            "wall_s": run.wall_s,
            "events": got["events"],
            "events_per_s": got["events"] / run.wall_s,
            "cpu_s": run.cpu_s,
            "server_cpu_s": run.server_cpu_s or 0,
            "peak_rss_bytes": run.peak_rss_bytes,
            "log_growth_bytes": growth,
        },
        "ratio": recv.wall_s / run.wall_s,
    }
    b.drop_slots("bench_big_cdc")
    if b.args.profile:
        profile(b, "big_txn", prof_pipe, b.args.profile.with_suffix(".big.prof"))
        b.drop_slots("bench_big_prof")
