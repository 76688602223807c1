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

Debezium gets the settings our envelope mirrors (README "Type mapping"), transaction metadata
on (as ours writes cuts), and a producer tuned as ours is (1 MB batches, 20 ms linger; larger
Debezium queue/batches); its JVM start-up is reported separately ("after first record").

    .venv/bin/python bench/capture_kafka.py [--rows N] [--json out.json] [--keep] [--only stream|snapshot]
                                            [--publisher-workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg2
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capture import ROW_EXPR, UPDATE_SET, Timed, checked, cluster_cpu_s, fmt_int, run_timed
from common import COLUMNS, say

from cdc.session import libpq_options, run_sql
from pipelines.devservices.debezium import DEBEZIUM_VERSION, LocalDebezium
from pipelines.devservices.kafka import LocalKafka
from pipelines.devservices.postgres import LocalPostgres, pg_bin_dir

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DB = "bench"
TXN_SIZE = 1000
INSERT_SHARE = 0.7
STREAM_TABLE = "public.bench_stream"
SNAP_TABLE = "public.bench_snap"
# Debezium tuned like our publisher's producer (acks=all, 1 MB batches, 20 ms linger) and with
# room to batch: the fair peer, not the out-of-the-box one.
DEBEZIUM_TUNING = {
    "max.batch.size": "20480",
    "max.queue.size": "81920",
    "producer.override.batch.size": str(1 << 20),
    "producer.override.linger.ms": "20",
    "producer.override.acks": "all",
    "producer.override.compression.type": "none",
    "worker.connector.client.config.override.policy": "All",
    "worker.offset.flush.interval.ms": "10000",
}


class KafkaBench:
    def __init__(self, rows: int, work: Path):
        self.rows = rows
        self.work = work
        self.pg = LocalPostgres(work / "pg", durable=True)
        self.kafka = LocalKafka(work / "kafka", heap="1g")
        self.results: dict[str, Any] = {"loadavg": {}}
        self.publisher_workers: int | None = None
        self._consumer = None

    # -- plumbing ------------------------------------------------------------------------------------
    @property
    def dsn(self) -> str:
        return self.pg.dsn(DB)

    def sql(self, *statements: str, params: tuple | None = None) -> list[tuple]:
        return run_sql(self.dsn, *statements, params=params)

    def load(self, where: str) -> float:
        # Dirty pages of the previous step (Kafka segments, WAL) written back now, not while the
        # next one is timed: its fsyncs (PostgreSQL, the staging log) would wait behind them.
        os.sync()
        load = float(Path("/proc/loadavg").read_text().split()[0])
        self.results["loadavg"][where] = load
        if load > 0.5 * (os.cpu_count() or 1):
            say(
                f"WARNING: 1-min load average is {load:.2f} {where} on {os.cpu_count()} CPUs: other work is running, expect noisy numbers"
            )
        return load

    def timed(self, argv: list[str], env: dict[str, str], name: str, stdout_null: bool = False) -> Timed:
        postmaster = self.pg.pid()
        before = cluster_cpu_s(postmaster) if postmaster else None
        result = run_timed(argv, env, self.work, name, stdout_null=stdout_null)
        if before is not None:
            time.sleep(0.2)
            result.server_cpu_s = cluster_cpu_s(postmaster) - before
        return result

    def pipeline(self, name: str, table: str, slot: str, publication: str, prefix: str) -> Path:
        doc = {
            "name": name,
            "source": {
                "postgres": {
                    "dsn": "${BENCH_DSN}",
                    "tables": [table],
                    "slot": slot,
                    "publication": publication,
                }
            },
            "log": {"kafka": {"bootstrap_servers": self.kafka.bootstrap, "topic_prefix": prefix, **self.kafka_extra}},
            "state_dir": str(self.work / "state" / name),
        }
        path = self.work / f"{name}.yml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    @property
    def kafka_extra(self) -> dict[str, Any]:
        return {} if self.publisher_workers is None else {"publisher_workers": self.publisher_workers}

    def cdc(self, name: str, *args: str | Path) -> Timed:
        return self.timed([str(BIN / "cdc"), *map(str, args)], {**os.environ, "BENCH_DSN": self.dsn}, name)

    def end_offset(self, topic: str) -> int:
        from kafka import KafkaConsumer, TopicPartition

        if self._consumer is None:
            self._consumer = KafkaConsumer(bootstrap_servers=[self.kafka.bootstrap], client_id="bench-watch")
        tp = TopicPartition(topic, 0)
        if topic not in self._consumer.topics():
            return 0
        return self._consumer.end_offsets([tp]).get(tp, 0)

    def debezium(self, name: str, table: str, slot: str, publication: str, prefix: str) -> LocalDebezium:
        return LocalDebezium(
            self.work / name,
            self.kafka.bootstrap,
            self.dsn,
            prefix,
            [table],
            slot,
            publication,
            extra=DEBEZIUM_TUNING,
            name=name,
            heap="1g",
            start_timeout=180,
        )

    def watch_debezium(
        self, dbz: LocalDebezium, topic: str, target: int, timeout: float = 900
    ) -> dict[str, float]:
        """Start the connector and time until `topic` holds `target` records."""
        postmaster = self.pg.pid()
        cpu0 = cluster_cpu_s(postmaster) if postmaster else 0.0
        initial = self.end_offset(topic)  # records from before this start (the stream part's seed row)
        t0 = time.perf_counter()
        dbz.start(wait=False)
        first = None
        deadline = t0 + timeout
        while True:
            n = self.end_offset(topic)
            now = time.perf_counter()
            if n > initial and first is None:
                first = now
            if n >= target:
                break
            if now > deadline:
                raise RuntimeError(
                    f"Debezium wrote {n:,} of {target:,} records to {topic} in {timeout:.0f}s\n{dbz.log_tail()}"
                )
            if not dbz.running():
                raise RuntimeError(f"Kafka Connect exited\n{dbz.log_tail()}")
            time.sleep(0.05)
        done = time.perf_counter()
        jvm_cpu = _proc_cpu_s(dbz.pid())
        server_cpu = (cluster_cpu_s(postmaster) - cpu0) if postmaster else None
        dbz.stop()
        return {
            "wall_s": done - t0,
            "first_record_s": (first or done) - t0,
            "after_first_s": done - (first or t0),
            "jvm_cpu_s": jvm_cpu,
            "server_cpu_s": server_cpu,
            "records": target,
        }

    # -- set-up ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self.load("at start")
        self.pg.start()
        admin = psycopg2.connect(self.pg.dsn())
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {DB}")
            cur.execute("SELECT version()")
            version = cur.fetchone()[0]
        admin.close()
        self.kafka.start()
        self.results["config"] = {
            "rows": self.rows,
            "txn_size": TXN_SIZE,
            "postgres": version.split(" on ")[0],
            "kafka": "4.3.1",
            "debezium": DEBEZIUM_VERSION,
            "debezium_tuning": DEBEZIUM_TUNING,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "machine": platform.platform(),
        }
        say(f"PostgreSQL on port {self.pg.port}, Kafka on {self.kafka.bootstrap}; work dir {self.work}")

    # -- 1. stream ---------------------------------------------------------------------------------------
    def stream(self) -> None:
        self.load("before stream")
        say("\n== 1. stream into Kafka ==")
        self.sql(
            f"CREATE TABLE {STREAM_TABLE} ({COLUMNS})",
            # one seed row: `cdc snapshot` with log: kafka fails on an empty table (a publisher bug, reported)
            f"INSERT INTO {STREAM_TABLE} SELECT {ROW_EXPR} FROM generate_series(-1, -1) AS g",
            f"CREATE PUBLICATION bench_pub FOR TABLE {STREAM_TABLE}",
            "SELECT pg_create_logical_replication_slot('bench_recv', 'pgoutput')",
        )
        ours = self.pipeline("kstream", STREAM_TABLE, "bench_cdc", "bench_pub", "ours")
        checked(self.cdc("kstream_snapshot", "snapshot", ours, "--no-progress"), "cdc snapshot (empty table)")
        # Debezium's slot, at the same point: its connector snapshots the empty table and streams.
        dbz = self.debezium("dbz_stream", STREAM_TABLE, "dbz_stream", "bench_pub", "dbzs")
        dbz.start()
        dbz.stop()
        t0 = time.perf_counter()
        inserts, updates, txns = self.workload()
        end_lsn = self.sql("SELECT pg_current_wal_lsn()::text")[0][0]
        wal = int(self.sql("SELECT %s::pg_lsn - '0/0'::pg_lsn", params=(end_lsn,))[0][0])
        events = inserts + updates
        say(
            f"workload: {events:,} changes ({inserts:,} inserts, {updates:,} updates) in {txns:,} transactions, {time.perf_counter() - t0:.1f}s"
        )

        self.load("before pg_recvlogical")
        recv = checked(
            self.timed(
                [
                    str(pg_bin_dir() / "pg_recvlogical"),
                    "--start",
                    "-S",
                    "bench_recv",
                    "-d",
                    DB,
                    "--no-loop",
                    "-o",
                    "proto_version=1",
                    "-o",
                    "publication_names=bench_pub",
                    "-E",
                    end_lsn,
                    "-f",
                    "/dev/null",
                ],
                {
                    **os.environ,
                    "PGHOST": "127.0.0.1",
                    "PGPORT": str(self.pg.port),
                    "PGUSER": "postgres",
                    "PGPASSWORD": self.pg.password,
                    "PGOPTIONS": libpq_options(),
                },
                "recvlogical",
            ),
            "pg_recvlogical",
        )
        say(
            f"  pg_recvlogical > /dev/null: {recv.wall_s:.2f}s, {events / recv.wall_s:,.0f} ev/s (CPU {recv.cpu_s:.1f}s)"
        )

        self.load("before cdc stream")
        run = checked(
            self.cdc("kstream_stream", "stream", ours, "--until", "current"), "cdc stream --until current"
        )
        in_kafka = self.end_offset("ours.public.bench_stream") - 1  # the seed row's snapshot record
        say(
            f"  cdc stream --until current (log: kafka): {run.wall_s:.2f}s, {events / run.wall_s:,.0f} ev/s "
            f"(CPU {run.cpu_s:.1f}s, PostgreSQL CPU {run.server_cpu_s or 0:.1f}s; topic end offset {in_kafka:,})"
        )
        if in_kafka < events:
            raise RuntimeError(f"our topic holds {in_kafka:,} records, expected {events:,}")

        self.load("before Debezium")
        d = self.watch_debezium(
            dbz, "dbzs.public.bench_stream", 1 + events
        )  # its snapshot record of the seed row, then the events
        say(
            f"  Debezium {DEBEZIUM_VERSION}: {d['wall_s']:.2f}s from start, {events / d['wall_s']:,.0f} ev/s "
            f"({d['after_first_s']:.2f}s after its first record: {events / d['after_first_s']:,.0f} ev/s; JVM CPU {d['jvm_cpu_s']:.1f}s)"
        )
        self.results["stream"] = {
            "events": events,
            "transactions": txns,
            "wal_bytes": wal,
            "pg_recvlogical": {
                "wall_s": recv.wall_s,
                "events_per_s": events / recv.wall_s,
                "cpu_s": recv.cpu_s,
            },
            "cdc_stream_kafka": {
                "wall_s": run.wall_s,
                "events_per_s": events / run.wall_s,
                "cpu_s": run.cpu_s,
                "server_cpu_s": run.server_cpu_s,
                "peak_rss_bytes": run.peak_rss_bytes,
            },
            "debezium": {
                **d,
                "events_per_s": events / d["wall_s"],
                "events_per_s_after_first": events / d["after_first_s"],
            },
        }
        self.sql(
            "SELECT pg_drop_replication_slot(s) FROM unnest(ARRAY['bench_recv', 'bench_cdc', 'dbz_stream']) s"
        )

    def workload(self) -> tuple[int, int, int]:
        conn = psycopg2.connect(self.dsn, options=libpq_options())
        insert = f"INSERT INTO {STREAM_TABLE} SELECT {ROW_EXPR} FROM generate_series(%s, %s) AS g"
        update = f"UPDATE {STREAM_TABLE} SET {UPDATE_SET} WHERE id BETWEEN %s AND %s"
        next_id, next_upd, remaining = 1, 1, self.rows
        inserts = updates = txns = 0
        try:
            with conn.cursor() as cur:
                while remaining > 0:
                    size = min(TXN_SIZE, remaining)
                    n_ins = max(1, round(size * INSERT_SHARE))
                    n_upd = size - n_ins
                    cur.execute(insert, (next_id, next_id + n_ins - 1))
                    next_id += n_ins
                    if n_upd:
                        cur.execute(update, (next_upd, next_upd + n_upd - 1))
                        next_upd += n_upd
                    conn.commit()
                    inserts, updates, txns = inserts + n_ins, updates + n_upd, txns + 1
                    remaining -= size
        finally:
            conn.close()
        return inserts, updates, txns

    # -- 2. snapshot -------------------------------------------------------------------------------------
    def snapshot(self) -> None:
        self.load("before snapshot")
        say("\n== 2. snapshot into Kafka ==")
        t0 = time.perf_counter()
        self.sql(
            f"CREATE TABLE {SNAP_TABLE} ({COLUMNS})",
            f"INSERT INTO {SNAP_TABLE} SELECT {ROW_EXPR} FROM generate_series(1, {self.rows}) AS g",
            f"VACUUM (ANALYZE) {SNAP_TABLE}",
            f"CREATE PUBLICATION bench_snap_pub FOR TABLE {SNAP_TABLE}",
            "CHECKPOINT",
        )
        say(f"table {SNAP_TABLE}: {self.rows:,} rows, loaded in {time.perf_counter() - t0:.1f}s")
        self.load("before cdc snapshot")
        ours = self.pipeline("ksnap", SNAP_TABLE, "bench_snap_cdc", "bench_snap_pub", "ours")
        run = checked(self.cdc("ksnap_snapshot", "snapshot", ours, "--no-progress"), "cdc snapshot")
        in_kafka = self.end_offset("ours.public.bench_snap")
        say(
            f"  cdc snapshot (log: kafka): {run.wall_s:.2f}s, {self.rows / run.wall_s:,.0f} rows/s "
            f"(CPU {run.cpu_s:.1f}s, PostgreSQL CPU {run.server_cpu_s or 0:.1f}s; topic end offset {in_kafka:,})"
        )
        if in_kafka < self.rows:
            raise RuntimeError(f"our topic holds {in_kafka:,} records, expected {self.rows:,}")
        self.load("before Debezium snapshot")
        dbz = self.debezium("dbz_snap", SNAP_TABLE, "dbz_snap", "bench_snap_pub", "dbzsnap")
        d = self.watch_debezium(dbz, "dbzsnap.public.bench_snap", self.rows)
        say(
            f"  Debezium {DEBEZIUM_VERSION} initial snapshot: {d['wall_s']:.2f}s from start, {self.rows / d['wall_s']:,.0f} rows/s "
            f"({d['after_first_s']:.2f}s after its first record: {self.rows / d['after_first_s']:,.0f} rows/s; JVM CPU {d['jvm_cpu_s']:.1f}s)"
        )
        self.results["snapshot"] = {
            "rows": self.rows,
            "cdc_snapshot_kafka": {
                "wall_s": run.wall_s,
                "rows_per_s": self.rows / run.wall_s,
                "cpu_s": run.cpu_s,
                "server_cpu_s": run.server_cpu_s,
                "peak_rss_bytes": run.peak_rss_bytes,
            },
            "debezium": {
                **d,
                "rows_per_s": self.rows / d["wall_s"],
                "rows_per_s_after_first": self.rows / d["after_first_s"],
            },
        }
        self.sql("SELECT pg_drop_replication_slot(s) FROM unnest(ARRAY['bench_snap_cdc', 'dbz_snap']) s")

    # -- report --------------------------------------------------------------------------------------------
    def report(self) -> None:
        say("\n== summary ==")
        say(f"{'measurement':<44}{'wall s':>9}{'rate':>16}   notes")
        s = self.results.get("stream")
        if s:
            recv, ours, dbz = s["pg_recvlogical"], s["cdc_stream_kafka"], s["debezium"]
            say(
                f"{'stream: pg_recvlogical > /dev/null':<44}{recv['wall_s']:>9.2f}{fmt_int(recv['events_per_s']):>11} ev/s   ceiling"
            )
            say(
                f"{'stream: cdc stream (log: kafka)':<44}{ours['wall_s']:>9.2f}{fmt_int(ours['events_per_s']):>11} ev/s   "
                f"{ours['events_per_s'] / recv['events_per_s']:.0%} of pg_recvlogical"
            )
            say(
                f"{'stream: Debezium (from start)':<44}{dbz['wall_s']:>9.2f}{fmt_int(dbz['events_per_s']):>11} ev/s   "
                f"first record after {dbz['first_record_s']:.1f}s"
            )
            say(
                f"{'stream: Debezium (after first record)':<44}{dbz['after_first_s']:>9.2f}{fmt_int(dbz['events_per_s_after_first']):>11} ev/s"
            )
            s["ratio_vs_debezium"] = ours["events_per_s"] / dbz["events_per_s"]
            s["ratio_vs_debezium_after_first"] = ours["events_per_s"] / dbz["events_per_s_after_first"]
            s["ratio_vs_pg_recvlogical"] = ours["events_per_s"] / recv["events_per_s"]
            say(
                f"stream: cdc = {s['ratio_vs_debezium']:.2f}x Debezium from start ({s['ratio_vs_debezium_after_first']:.2f}x excluding its JVM "
                f"start-up; target 2x), {s['ratio_vs_pg_recvlogical']:.0%} of pg_recvlogical (target 40%)"
            )
        n = self.results.get("snapshot")
        if n:
            ours, dbz = n["cdc_snapshot_kafka"], n["debezium"]
            say(
                f"{'snapshot: cdc snapshot (log: kafka)':<44}{ours['wall_s']:>9.2f}{fmt_int(ours['rows_per_s']):>11} rows/s"
            )
            say(
                f"{'snapshot: Debezium initial (from start)':<44}{dbz['wall_s']:>9.2f}{fmt_int(dbz['rows_per_s']):>11} rows/s   "
                f"first record after {dbz['first_record_s']:.1f}s"
            )
            say(
                f"{'snapshot: Debezium initial (after first)':<44}{dbz['after_first_s']:>9.2f}{fmt_int(dbz['rows_per_s_after_first']):>11} rows/s"
            )
            n["ratio_vs_debezium"] = ours["rows_per_s"] / dbz["rows_per_s"]
            n["ratio_vs_debezium_after_first"] = ours["rows_per_s"] / dbz["rows_per_s_after_first"]
            say(
                f"snapshot: cdc = {n['ratio_vs_debezium']:.2f}x Debezium from start ({n['ratio_vs_debezium_after_first']:.2f}x excluding its JVM start-up; target 3x)"
            )
        if s:
            # On a machine shared with other work the wall clock measures CPU share; CPU time does not.
            cdc_cpu = s["cdc_stream_kafka"]["cpu_s"] + (s["cdc_stream_kafka"].get("server_cpu_s") or 0)
            dbz_cpu = s["debezium"]["jvm_cpu_s"] + (s["debezium"].get("server_cpu_s") or 0)
            recv_cpu = s["pg_recvlogical"]["cpu_s"] + (s["pg_recvlogical"].get("server_cpu_s") or 0)
            s["events_per_cpu_s"] = {
                "pg_recvlogical": s["events"] / recv_cpu,
                "cdc_stream_kafka": s["events"] / cdc_cpu,
                "debezium": s["events"] / dbz_cpu,
            }
            say(
                f"stream, per CPU second (client + PostgreSQL): pg_recvlogical {fmt_int(s['events'] / recv_cpu)} ev/CPU-s, "
                f"cdc {fmt_int(s['events'] / cdc_cpu)} ev/CPU-s ({cdc_cpu:.0f} CPU-s), Debezium {fmt_int(s['events'] / dbz_cpu)} "
                f"ev/CPU-s ({dbz_cpu:.0f} CPU-s): cdc = {dbz_cpu / cdc_cpu:.2f}x Debezium"
            )
        if n:
            cdc_cpu = n["cdc_snapshot_kafka"]["cpu_s"] + (n["cdc_snapshot_kafka"].get("server_cpu_s") or 0)
            dbz_cpu = n["debezium"]["jvm_cpu_s"] + (n["debezium"].get("server_cpu_s") or 0)
            n["rows_per_cpu_s"] = {"cdc_snapshot_kafka": n["rows"] / cdc_cpu, "debezium": n["rows"] / dbz_cpu}
            say(
                f"snapshot, per CPU second (client + PostgreSQL): cdc {fmt_int(n['rows'] / cdc_cpu)} rows/CPU-s, "
                f"Debezium {fmt_int(n['rows'] / dbz_cpu)} rows/CPU-s: cdc = {dbz_cpu / cdc_cpu:.2f}x Debezium"
            )
        say(f"load averages seen: {self.results['loadavg']}")

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
        self.kafka.stop()
        self.pg.stop()


def _proc_cpu_s(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        type=int,
        default=1_000_000,
        help="changes streamed and rows snapshotted (default 1,000,000)",
    )
    parser.add_argument("--json", type=Path, help="also write every number to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the work dir")
    parser.add_argument(
        "--only", choices=["stream", "snapshot"], action="append", help="run only these parts"
    )
    parser.add_argument(
        "--publisher-workers", type=int, help="log.kafka.publisher_workers of our pipelines (default: the product's)"
    )
    args = parser.parse_args(argv)
    parts = args.only or ["stream", "snapshot"]
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-kafka-"))
    os.chmod(work, 0o755)
    bench = KafkaBench(args.rows, work)
    bench.publisher_workers = args.publisher_workers
    started = time.perf_counter()
    try:
        bench.start()
        if "stream" in parts:
            bench.stream()
        if "snapshot" in parts:
            bench.snapshot()
        bench.results["total_s"] = time.perf_counter() - started
        bench.report()
        say(f"\ntotal {bench.results['total_s']:.0f}s")
        if args.json:
            args.json.resolve().parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(bench.results, indent=2, default=str) + "\n")
            say(f"numbers written to {args.json}")
    finally:
        bench.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
