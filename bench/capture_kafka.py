"""Capture into Kafka: `cdc` with `log: kafka` side by side with a real Debezium connector.

One run, one throwaway PostgreSQL 15 cluster (durable: fsync and synchronous commit on), one
local Kafka 4.3.1 broker, Debezium 3.7.0.Final's PostgreSQL connector in Kafka Connect
standalone (pipelines/devservices/debezium.py), all on this machine:

  1. stream    N changes (70% inserts, 30% updates, 1000-change transactions) into a
               10-column table, then, one after the other over that same backlog:
               * pg_recvlogical to /dev/null (the ceiling: the walsender alone);
               * `cdc stream --until current` with `log: kafka` (returns only once Kafka
                 acknowledged every event and the cut);
               * Debezium (connector started after the workload on its own slot, stopped
                 before it): until its topic holds all N events (end offset watched).
  2. snapshot  an N-row table of the same shape: `cdc snapshot` with `log: kafka` (copy
               plus publishing, until Kafka acknowledged) vs Debezium's initial snapshot
               of the same table (connector started, until its topic holds N records).
  3. latency   commit-to-Kafka latency (p50/p99) of `cdc stream` at --rate single-row
               transactions/s, next to pg_recvlogical over the same transactions, with the
               publisher's old fixed 0.2 s poll and as shipped, and the CPU each uses while
               idle (bench/kafkalatency.py).

Debezium gets the settings our envelope mirrors (README "Type mapping"), transaction metadata
on (as ours writes cuts), and a producer tuned as ours is (1 MB batches, 20 ms linger; larger
Debezium queue/batches); its JVM start-up is reported separately ("after first record").
The Kafka and Debezium plumbing is in bench/kafkapeer.py, the harness in bench/harness/.

    .venv/bin/python bench/capture_kafka.py [--rows N] [--json out.json] [--keep] [--only stream|snapshot|latency]
                                            [--publisher-workers N] [--rate 200] [--seconds 30]
                                            [--idle-seconds 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from harness.bench import Bench
from harness.main import main
from harness.proc import Timed
from harness.report import Report, fmt_int
from harness.services import say
from harness.workload import COLUMNS, ROW_EXPR, TXN_SIZE, insert_update, load_table
from kafkalatency import latency
from kafkalatency import report as latency_report
from kafkapeer import DEBEZIUM_TUNING, DEBEZIUM_VERSION, Peer

STREAM_TABLE = "public.bench_stream"
SNAP_TABLE = "public.bench_snap"


def per_cpu_s(amount: int, **sides: dict[str, Any]) -> dict[str, float]:
    """Work per CPU second of each side's client plus PostgreSQL: the figure a busy machine does not distort."""
    return {name: amount / (m["cpu_s"] + (m["server_cpu_s"] or 0)) for name, m in sides.items()}


def cpu_text(per_cpu: dict[str, float]) -> str:
    return ", ".join(f"{name} {fmt_int(v)}" for name, v in per_cpu.items())


def stream(b: Bench, peer: Peer) -> None:
    b.load("before stream")
    say("\n== 1. stream into Kafka ==")
    b.sql(
        f"CREATE TABLE {STREAM_TABLE} ({COLUMNS})",
        # one seed row: `cdc snapshot` with log: kafka fails on an empty table (a publisher bug, reported)
        f"INSERT INTO {STREAM_TABLE} SELECT {ROW_EXPR} FROM generate_series(-1, -1) AS g",
        f"CREATE PUBLICATION bench_pub FOR TABLE {STREAM_TABLE}",
    )
    b.create_slot("bench_recv")
    ours = peer.pipeline("kstream", STREAM_TABLE, "bench_cdc", "bench_pub", "ours")
    b.cdc("kstream_snapshot", "snapshot", ours, "--no-progress")
    # Debezium's slot, at the same point: its connector snapshots the empty table and streams.
    dbz = peer.debezium("dbz_stream", STREAM_TABLE, "dbz_stream", "bench_pub", "dbzs")
    dbz.start()
    dbz.stop()
    inserts, updates, txns, seconds = insert_update(b.dsn, STREAM_TABLE, b.args.rows)
    end_lsn = b.lsn()
    wal = int(b.sql("SELECT %s::pg_lsn - '0/0'::pg_lsn", params=(end_lsn,))[0][0])
    events = inserts + updates
    say(
        f"workload: {events:,} changes ({inserts:,} inserts, {updates:,} updates) in {txns:,} transactions, {seconds:.1f}s"
    )

    peer.sync_load("before pg_recvlogical")
    recv = b.recvlogical("recvlogical", "bench_recv", end_lsn, "bench_pub")
    say(
        f"  pg_recvlogical > /dev/null: {recv.wall_s:.2f}s, {events / recv.wall_s:,.0f} ev/s (CPU {recv.cpu_s:.1f}s)"
    )
    peer.sync_load("before cdc stream")
    run = b.cdc("kstream_stream", "stream", ours, "--until", "current")
    in_kafka = peer.end_offset("ours.public.bench_stream") - 1  # the seed row's snapshot record
    say(
        f"  cdc stream --until current (log: kafka): {run.wall_s:.2f}s, {events / run.wall_s:,.0f} ev/s "
        f"(CPU {run.cpu_s:.1f}s, PostgreSQL CPU {run.server_cpu_s or 0:.1f}s; topic end offset {in_kafka:,})"
    )
    if in_kafka < events:
        raise RuntimeError(f"our topic holds {in_kafka:,} records, expected {events:,}")
    peer.sync_load("before Debezium")
    d = peer.watch(dbz, "dbzs.public.bench_stream", 1 + events)  # its record of the seed row, then the events
    say(
        f"  Debezium {DEBEZIUM_VERSION}: {d['wall_s']:.2f}s from start, {events / d['wall_s']:,.0f} ev/s "
        f"({d['after_first_s']:.2f}s after its first record: {events / d['after_first_s']:,.0f} ev/s; JVM CPU {d['jvm_cpu_s']:.1f}s)"
    )
    b.results["stream"] = {
        "events": events,
        "transactions": txns,
        "wal_bytes": wal,
        "pg_recvlogical": measured(recv, events, "events_per_s"),
        "cdc_stream_kafka": measured(run, events, "events_per_s"),
        "debezium": {
            **d,
            "events_per_s": events / d["wall_s"],
            "events_per_s_after_first": events / d["after_first_s"],
        },
    }
    b.drop_slots("bench_recv", "bench_cdc", "dbz_stream")


def measured(run: Timed, amount: int, rate_key: str) -> dict[str, Any]:
    return {
        "wall_s": run.wall_s,
        rate_key: amount / run.wall_s,
        "cpu_s": run.cpu_s,
        "server_cpu_s": run.server_cpu_s,
        "peak_rss_bytes": run.peak_rss_bytes,
    }


def snapshot(b: Bench, peer: Peer) -> None:
    b.load("before snapshot")
    say("\n== 2. snapshot into Kafka ==")
    rows = b.args.rows
    t0 = time.perf_counter()
    load_table(b.sql, SNAP_TABLE, rows, publication="bench_snap_pub")
    say(f"table {SNAP_TABLE}: {rows:,} rows, loaded in {time.perf_counter() - t0:.1f}s")
    peer.sync_load("before cdc snapshot")
    ours = peer.pipeline("ksnap", SNAP_TABLE, "bench_snap_cdc", "bench_snap_pub", "ours")
    run = b.cdc("ksnap_snapshot", "snapshot", ours, "--no-progress")
    in_kafka = peer.end_offset("ours.public.bench_snap")
    say(
        f"  cdc snapshot (log: kafka): {run.wall_s:.2f}s, {rows / run.wall_s:,.0f} rows/s "
        f"(CPU {run.cpu_s:.1f}s, PostgreSQL CPU {run.server_cpu_s or 0:.1f}s; topic end offset {in_kafka:,})"
    )
    if in_kafka < rows:
        raise RuntimeError(f"our topic holds {in_kafka:,} records, expected {rows:,}")
    peer.sync_load("before Debezium snapshot")
    dbz = peer.debezium("dbz_snap", SNAP_TABLE, "dbz_snap", "bench_snap_pub", "dbzsnap")
    d = peer.watch(dbz, "dbzsnap.public.bench_snap", rows)
    say(
        f"  Debezium {DEBEZIUM_VERSION} initial snapshot: {d['wall_s']:.2f}s from start, {rows / d['wall_s']:,.0f} rows/s "
        f"({d['after_first_s']:.2f}s after its first record: {rows / d['after_first_s']:,.0f} rows/s; JVM CPU {d['jvm_cpu_s']:.1f}s)"
    )
    b.results["snapshot"] = {
        "rows": rows,
        "cdc_snapshot_kafka": measured(run, rows, "rows_per_s"),
        "debezium": {
            **d,
            "rows_per_s": rows / d["wall_s"],
            "rows_per_s_after_first": rows / d["after_first_s"],
        },
    }
    b.drop_slots("bench_snap_cdc", "dbz_snap")


def versus_debezium(
    rep: Report, part: str, label: str, unit: str, ours: dict, dbz: dict, rate: str, notes: str = ""
) -> tuple[float, float]:
    """Our row and Debezium's two (from its start, and after its first record, i.e. without its JVM
    start-up); returns our ratio to each."""
    after = f"{rate}_after_first"
    rep.add(
        part,
        label,
        ours[rate],
        unit,
        ratio=ours[rate] / dbz[rate],
        notes=notes,
        wall_s=f"{ours['wall_s']:.2f}",
        CPU_s=f"{ours['cpu_s']:.1f}",
    )
    rep.add(
        part,
        "Debezium (from start)",
        dbz[rate],
        unit,
        role="peer",
        ratio=1.0,
        notes=f"first record after {dbz['first_record_s']:.1f}s",
        wall_s=f"{dbz['wall_s']:.2f}",
        CPU_s=f"{dbz['cpu_s']:.1f}",
    )
    rep.add(
        part,
        "Debezium (after first record)",
        dbz[after],
        unit,
        role="peer",
        wall_s=f"{dbz['after_first_s']:.2f}",
    )
    return ours[rate] / dbz[rate], ours[rate] / dbz[after]


def summary(r: dict[str, Any]) -> Report:
    rep = Report("Capture into Kafka: cdc next to Debezium (bench/capture_kafka.py)", ("wall s", "CPU s"))
    cfg = r["config"]
    rep.subtitle = f"{cfg['rows']:,} rows/changes, Kafka {cfg['kafka']}, Debezium {cfg['debezium']}, {cfg['postgres'].split(' on ')[0]}"
    s, n = r.get("stream"), r.get("snapshot")
    if s:
        recv, ours, dbz = s["pg_recvlogical"], s["cdc_stream_kafka"], s["debezium"]
        s["ratio_vs_pg_recvlogical"] = ours["events_per_s"] / recv["events_per_s"]
        rep.add(
            "stream",
            "pg_recvlogical > /dev/null",
            recv["events_per_s"],
            "events/s",
            role="ceiling",
            notes="ceiling",
            wall_s=f"{recv['wall_s']:.2f}",
            CPU_s=f"{recv['cpu_s']:.1f}",
        )
        s["ratio_vs_debezium"], s["ratio_vs_debezium_after_first"] = versus_debezium(
            rep,
            "stream",
            "cdc stream (log: kafka)",
            "events/s",
            ours,
            dbz,
            "events_per_s",
            notes=f"{s['ratio_vs_pg_recvlogical']:.0%} of pg_recvlogical",
        )
        s["events_per_cpu_s"] = per_cpu_s(
            s["events"], pg_recvlogical=recv, cdc_stream_kafka=ours, debezium=dbz
        )
        rep.summary.append(
            f"stream: cdc = {s['ratio_vs_debezium']:.2f}x Debezium from start ({s['ratio_vs_debezium_after_first']:.2f}x excluding"
            f" its JVM start-up; target 2x), {s['ratio_vs_pg_recvlogical']:.0%} of pg_recvlogical (target 40%);"
            f" events per CPU second (client + PostgreSQL): {cpu_text(s['events_per_cpu_s'])}"
        )
    if n:
        ours, dbz = n["cdc_snapshot_kafka"], n["debezium"]
        n["ratio_vs_debezium"], n["ratio_vs_debezium_after_first"] = versus_debezium(
            rep, "snapshot", "cdc snapshot (log: kafka)", "rows/s", ours, dbz, "rows_per_s"
        )
        n["rows_per_cpu_s"] = per_cpu_s(n["rows"], cdc_snapshot_kafka=ours, debezium=dbz)
        rep.summary.append(
            f"snapshot: cdc = {n['ratio_vs_debezium']:.2f}x Debezium from start ({n['ratio_vs_debezium_after_first']:.2f}x"
            f" excluding its JVM start-up; target 3x); rows per CPU second: {cpu_text(n['rows_per_cpu_s'])}"
        )
    if r.get("latency"):
        latency_report(rep, r["latency"])
    return rep


PARTS = {"stream": stream, "snapshot": snapshot, "latency": latency}


def body(b: Bench) -> Report:
    args = b.args
    b.results["config"].update(
        rows=args.rows,
        txn_size=TXN_SIZE,
        kafka="4.3.1",
        debezium=DEBEZIUM_VERSION,
        debezium_tuning=DEBEZIUM_TUNING,
    )
    b.start_postgres(durable=True)
    peer = Peer(b, args.publisher_workers)
    for part in args.only or list(PARTS):
        PARTS[part](b, peer)
    return summary(b.results)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--rows",
        type=int,
        default=1_000_000,
        help="changes streamed and rows snapshotted (default 1,000,000)",
    )
    p.add_argument("--only", choices=list(PARTS), action="append", help="run only these parts")
    p.add_argument(
        "--publisher-workers",
        type=int,
        help="log.kafka.publisher_workers of our pipelines (default: the product's)",
    )
    p.add_argument("--rate", type=int, default=200, help="latency: transactions per second (default 200)")
    p.add_argument(
        "--seconds", type=float, default=30, help="latency: seconds of writes per mode (default 30)"
    )
    p.add_argument(
        "--idle-seconds",
        type=float,
        default=20,
        help="latency: seconds without writes, for idle CPU (default 20)",
    )
    return p


if __name__ == "__main__":
    sys.exit(main(parser(), body, prefix="kafka"))
