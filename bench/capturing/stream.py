"""Part 1: `--rows` changes (70% inserts, 30% updates, 1000-change transactions) decoded by
pg_recvlogical to /dev/null (the ceiling) and by `cdc stream --until current` into the local log
(durable), plus the same into a log with `synchronous: normal` (diagnostic), interleaved per run."""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

from harness import cdcout
from harness.bench import Bench
from harness.proc import Timed, cpu_note, dir_bytes, medians
from harness.report import fmt_mb
from harness.services import say
from harness.workload import COLUMNS, insert_update

from capturing.profile import profile

TABLE = "public.bench_stream"
PUBLICATION = "bench_pub"
# Slots, per repetition i: bench_recv_<i> for pg_recvlogical, bench_cdc_<i> for pipeline bench_stream_<i>
# (created by its `cdc snapshot`), bench_nosync_<i> for the diagnostic; bench_prof for --profile.


def message_counts(b: Bench, slot: str, upto: str) -> dict[str, int]:
    """What the slot will send up to `upto`, by pgoutput message kind (a peek: the slot does not move)."""
    rows = b.sql(
        "SELECT chr(get_byte(data, 0)), count(*) FROM pg_logical_slot_peek_binary_changes("
        "%s, %s::pg_lsn, NULL, 'proto_version', '1', 'publication_names', %s) GROUP BY 1 ORDER BY 1",
        params=(slot, upto, PUBLICATION),
    )
    return {kind: int(n) for kind, n in rows}


def snapshotted(
    b: Bench, name: str, slot: str, synchronous: str = "full", env: dict[str, str] | None = None
) -> Path:
    """A pipeline whose `cdc snapshot` of the EMPTY table created its slot and put the table in its
    log (which `cdc stream` requires), before the workload; `env` runs it from another checkout,
    the one that streams it (the log's format is that checkout's)."""
    pipe = b.pipeline(name, [TABLE], slot=slot, publication=PUBLICATION, log=b.local_log(name, synchronous))
    b.cdc(f"snapshot_{name}", "snapshot", pipe, "--no-progress", env=env)
    return pipe


def stream(b: Bench) -> None:
    b.load("before part 1")
    say("\n== 1. stream ==")
    b.sql(f"CREATE TABLE {TABLE} ({COLUMNS})", f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {TABLE}")
    reps = range(1, b.args.repeat + 1)
    pipes: dict[int, Path] = {}
    for i in reps:
        pipes[i] = snapshotted(b, f"bench_stream_{i}", f"bench_cdc_{i}")
        b.create_slot(f"bench_recv_{i}")
        pipes[-i] = snapshotted(b, f"bench_nosync_{i}", f"bench_nosync_{i}", "normal")
    if b.args.profile:
        pipes[0] = snapshotted(b, "bench_prof", "bench_prof")
    say(
        f"{b.args.repeat} pipeline slot(s) bench_cdc_<i> (via `cdc snapshot` of the empty table) and bench_recv_<i> created"
    )

    start_lsn = b.lsn()
    inserts, updates, txns, seconds = insert_update(b.dsn, TABLE, b.args.rows)
    end_lsn = b.lsn()
    wal = int(b.sql("SELECT %s::pg_lsn - %s::pg_lsn", params=(end_lsn, start_lsn))[0][0])
    say(
        f"workload: {inserts + updates:,} changes ({inserts:,} inserts, {updates:,} updates) in {txns:,} transactions"
        f" in {seconds:.1f}s; {wal / 1e6:,.0f} MB of WAL; end LSN {end_lsn}"
    )
    b.sql("CHECKPOINT")
    t0 = time.perf_counter()
    kinds = message_counts(b, "bench_recv_1", end_lsn)
    events = sum(kinds.get(k, 0) for k in "IUDT")
    messages = sum(kinds.values())
    say(
        f"messages per slot (peek, {time.perf_counter() - t0:.1f}s): {kinds} = {events:,} events, {messages:,} messages"
    )

    recv_runs: list[Timed] = []
    cdc_runs: list[Timed] = []
    nosync_runs: list[Timed] = []
    reported: list[int] = []
    for i in reps:  # interleaved, so drift (cache, checkpoints) hits both sides alike
        recv = b.recvlogical(f"stream_recvlogical_{i}", f"bench_recv_{i}", end_lsn, PUBLICATION)
        say(
            f"  [{i}] pg_recvlogical: {recv.wall_s:.2f}s, {events / recv.wall_s:,.0f} events/s, {cpu_note(recv)}"
        )
        run = b.cdc(f"stream_cdc_{i}", "stream", pipes[i], "--until", "current")
        got = cdcout.stream(run.out)
        say(
            f"  [{i}] cdc stream:     {run.wall_s:.2f}s, {got['events'] / run.wall_s:,.0f} events/s"
            f" (self-reported {got['rate']:,}), {cpu_note(run)}, peak RSS {fmt_mb(run.peak_rss_bytes)}"
        )
        if got["events"] != events:
            say(f"WARNING: cdc stream logged {got['events']:,} events, the slot had {events:,}")
        nosync = b.cdc(f"stream_nosync_{i}", "stream", pipes[-i], "--until", "current")
        say(
            f"  [{i}] cdc stream, log synchronous=normal: {nosync.wall_s:.2f}s,"
            f" {cdcout.stream(nosync.out)['events'] / nosync.wall_s:,.0f} events/s, {cpu_note(nosync)}"
        )
        recv_runs.append(recv)
        cdc_runs.append(run)
        nosync_runs.append(nosync)
        reported.append(got["rate"])
        b.drop_slots(f"bench_recv_{i}", f"bench_nosync_{i}")
        shutil.rmtree(b.state(f"bench_nosync_{i}"), ignore_errors=True)
    log_bytes = dir_bytes(b.state("bench_stream_1") / "log")
    b.drop_slots(*(f"bench_cdc_{i}" for i in reps))
    for i in reps:
        shutil.rmtree(b.state(f"bench_stream_{i}"), ignore_errors=True)

    recv_m = medians(recv_runs, events, "events_per_s")
    cdc_m = medians(cdc_runs, events, "events_per_s")
    nosync_m = medians(nosync_runs, events, "events_per_s")
    b.results["stream"] = {
        "changes": inserts + updates,
        "inserts": inserts,
        "updates": updates,
        "transactions": txns,
        "workload_s": seconds,
        "wal_bytes": wal,
        "end_lsn": end_lsn,
        "message_kinds": kinds,
        "events": events,
        "messages": messages,
        "pg_recvlogical": {**recv_m, "messages_per_s": messages / recv_m["wall_s"]},
        "cdc_stream": {
            **cdc_m,
            "events": cdcout.stream(cdc_runs[0].out)["events"],
            "messages_per_s": messages / cdc_m["wall_s"],
            "self_reported_events_per_s": statistics.median(reported),
            "log_bytes": log_bytes,
            "log_bytes_per_event": log_bytes / max(events, 1),
        },
        "ratio": recv_m["wall_s"] / cdc_m["wall_s"],
        "cdc_stream_sync_normal": nosync_m,
        "ratio_sync_normal": recv_m["wall_s"] / nosync_m["wall_s"],
    }
    if b.args.profile:
        profile(b, "stream", pipes[0], b.args.profile)
        b.drop_slots("bench_prof")
