"""Capture benchmark: `cdc stream` and `cdc snapshot` next to PostgreSQL's own tools.

One run, one machine, one throwaway PostgreSQL 15 cluster (durable settings by default):

  1. stream    1M changes (70% inserts, 30% updates, 1000-change transactions) decoded by
               pg_recvlogical to /dev/null (the ceiling: the walsender alone) and by
               `cdc stream --until current` into the local log; rate, ratio, peak RSS, log size.
               Diagnostic: the same into a log with `synchronous: normal` (no fsync per commit).
  2. snapshot  a 1M-row table: `COPY t TO STDOUT` by psql to /dev/null (the ceiling) and
               `cdc snapshot` into a fresh log (default workers, then --parallel 1, 2, 4).
  3. big txn   one transaction inserting 1M rows into a fresh table: `cdc stream --until
               current` peak RSS (pg_recvlogical over the same transaction for reference).

Every cdc command runs as a user runs it: the real console entry (.venv/bin/cdc) in a
subprocess, timed from spawn to exit; client CPU comes from wait4, the cluster's CPU from
/proc. Parts 1 and 2 run --repeat times (default 3), interleaved with their ceiling, and
report medians. See bench/README.md for how to read the output.

    .venv/bin/python bench/capture.py [--rows N] [--repeat N] [--keep] [--json out.json] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2
import yaml
from common import COLUMNS, say

from cdc.session import libpq_options, run_sql
from pipelines.devservices.postgres import LocalPostgres, pg_bin_dir

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # .venv/bin: the `cdc` console entry lives next to the interpreter
DB = "bench"
TXN_SIZE = 1000
INSERT_SHARE = 0.7
STREAM_TABLE = "public.bench_stream"
SNAP_TABLE = "public.bench_snap"
PUBLICATION = "bench_pub"
SNAP_PUBLICATION = "bench_snap_pub"
BIG_TABLE = "public.bench_big"
BIG_PUBLICATION = "bench_big_pub"
# Slots, per repetition i: bench_recv_<i> for pg_recvlogical, bench_cdc_<i> for pipeline bench_stream_<i>
# (created by its `cdc snapshot`); bench_prof for the --profile pipeline; bench_big_recv for part 3.
SNAPSHOT_CONFIGS: tuple[tuple[str, int | None], ...] = (
    ("default", None),
    ("parallel 1", 1),
    ("parallel 2", 2),
    ("parallel 4", 4),
)

# One row per g: every column filled, text ~20 chars, values spread out. No '%' (psycopg2 params).
ROW_EXPR = """
    g, mod(g, 100000)::int, (mod(g, 10000000) / 100.0)::numeric(12,2), g * 0.731::float8,
    left(md5(g::text), 20), 'code-' || mod(g, 9973)::text, mod(g, 3) = 0,
    timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', date '2024-01-01' + mod(g, 3650)::int,
    md5(g::text)::uuid
"""
UPDATE_SET = """
    qty = qty + 1, price = price + 0.01, score = score * 1.5, note = left(md5((id + 7)::text), 20),
    flag = NOT flag, updated_at = updated_at + interval '1 minute'
"""


def fmt_int(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_mb(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 1e6:,.1f} MB"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


# ---- running and measuring a subprocess ------------------------------------------------------------
@dataclass
class Timed:
    argv: list[str]
    code: int
    wall_s: float
    peak_rss_bytes: int | None  # VmHWM of the process itself (polled from /proc while it runs)
    cpu_user_s: float
    cpu_sys_s: float
    out: str = field(repr=False)
    err: str = field(repr=False)
    server_cpu_s: float | None = None  # CPU the PostgreSQL cluster used meanwhile (all its processes)

    @property
    def cpu_s(self) -> float:
        return self.cpu_user_s + self.cpu_sys_s


def _vm_hwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run_timed(
    argv: list[str],
    env: dict[str, str],
    workdir: Path,
    name: str,
    *,
    stdout_null: bool = False,
    timeout: float = 1800,
) -> Timed:
    """Run argv with stdout/stderr to files (stdout to /dev/null if asked); wall time from spawn
    to exit, peak RSS, CPU time.

    The process is waited for without reaping first (WNOWAIT), so the last /proc sample is
    taken while the pid is still ours; then os.wait4 gives its own CPU time."""
    out_path, err_path = workdir / f"{name}.out", workdir / f"{name}.err"
    with open(os.devnull if stdout_null else out_path, "wb") as out, open(err_path, "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=REPO)
        peak: list[int] = [0]
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                hwm = _vm_hwm(proc.pid)
                if hwm:
                    peak[0] = max(peak[0], hwm)
                done.wait(0.02)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        watchdog = threading.Timer(timeout, proc.kill)
        watchdog.start()
        try:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            wall = time.perf_counter() - started
            hwm = _vm_hwm(proc.pid)  # a zombie has no memory map any more: usually None here
            if hwm:
                peak[0] = max(peak[0], hwm)
            done.set()
            poller.join()
            _pid, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            watchdog.cancel()
            done.set()
    return Timed(
        list(argv),
        proc.returncode,
        wall,
        peak[0] or None,
        usage.ru_utime,
        usage.ru_stime,
        "" if stdout_null else out_path.read_text(errors="replace"),
        err_path.read_text(errors="replace"),
    )


_TICK = os.sysconf("SC_CLK_TCK")


def cluster_cpu_s(postmaster: int) -> float:
    """user+sys CPU seconds of a PostgreSQL cluster so far: the postmaster with its reaped children
    (cutime/cstime) plus every live child. Exited backends count through the postmaster."""

    def cpu(stat: str, with_children: bool) -> int:
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; fields[0] is field 3
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        return ticks + (int(fields[13]) + int(fields[14]) if with_children else 0)  # cutime, cstime

    total = cpu(Path(f"/proc/{postmaster}/stat").read_text(), True)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == postmaster:  # ppid
            total += cpu(stat, True)
    return total / _TICK


def cpu_note(t: Timed) -> str:
    server = "" if t.server_cpu_s is None else f", PostgreSQL CPU {t.server_cpu_s:.1f}s"
    return f"CPU {t.cpu_s:.1f}s{server}"


def checked(result: Timed, what: str) -> Timed:
    if result.code != 0:
        raise RuntimeError(f"{what} failed (exit {result.code}):\n{result.out[-2000:]}\n{result.err[-2000:]}")
    return result


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a file may vanish (SQLite -shm) while we walk
                total += os.stat(os.path.join(root, name)).st_blocks * 512  # on disk, as du counts
    return total


# ---- the benchmark ----------------------------------------------------------------------------------
def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}s" if len(values) > 1 else f"{values[0]:.2f}s"


class Bench:
    def __init__(self, rows: int, repeat: int, workdir: Path, profile: Path | None):
        self.rows = rows
        self.repeat = repeat
        self.work = workdir
        self.profile = profile
        self.pg = LocalPostgres(workdir / "pg", durable=True)
        self.results: dict[str, Any] = {}

    # -- plumbing ------------------------------------------------------------------------------------
    @property
    def dsn(self) -> str:
        return self.pg.dsn(DB)

    def sql(self, *statements: str, params: tuple | None = None) -> list[tuple]:
        return run_sql(self.dsn, *statements, params=params)

    def pg_env(self) -> dict[str, str]:
        """libpq environment for pg_recvlogical and psql, with cdc's session settings (same text output)."""
        return {
            **os.environ,
            "PGHOST": "127.0.0.1",
            "PGPORT": str(self.pg.port),
            "PGUSER": "postgres",
            "PGPASSWORD": self.pg.password,
            "PGDATABASE": DB,
            "PGOPTIONS": libpq_options(),
        }

    def cdc_env(self) -> dict[str, str]:
        return {**os.environ, "BENCH_DSN": self.dsn}  # the pipeline files say dsn: ${BENCH_DSN}

    def state(self, name: str) -> Path:
        return self.work / "state" / name

    def pipeline(self, name: str, table: str, slot: str, publication: str, synchronous: str = "full") -> Path:
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
            "log": {"local": {"path": str(self.state(name) / "log"), "synchronous": synchronous}},
            "state_dir": str(self.state(name)),
        }
        path = self.work / f"{name}.yml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def timed(self, argv: list[str], env: dict[str, str], name: str, *, stdout_null: bool = False) -> Timed:
        """run_timed, plus the CPU the cluster spent meanwhile (sampled when no backend is exiting)."""
        postmaster = self.pg.pid()
        time.sleep(0.2)  # backends of our earlier connections: exited and reaped, so counted once
        before = cluster_cpu_s(postmaster) if postmaster else None
        result = run_timed(argv, env, self.work, name, stdout_null=stdout_null)
        if before is not None:
            time.sleep(0.2)  # let the backends of the finished client exit and be reaped
            result.server_cpu_s = cluster_cpu_s(postmaster) - before
        return result

    def cdc(self, name: str, *args: str | Path) -> Timed:
        return self.timed([str(BIN / "cdc"), *map(str, args)], self.cdc_env(), name)

    def lsn(self) -> str:
        return self.sql("SELECT pg_current_wal_lsn()::text")[0][0]

    def create_slot(self, slot: str) -> None:
        self.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", params=(slot,))

    def drop_slot(self, slot: str) -> None:
        self.sql(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
            params=(slot,),
        )

    def recvlogical(self, name: str, slot: str, endpos: str, publication: str) -> Timed:
        argv = [
            str(pg_bin_dir() / "pg_recvlogical"),
            "--start",
            "-S",
            slot,
            "-d",
            DB,
            "--no-loop",
            "-o",
            "proto_version=1",
            "-o",
            f"publication_names={publication}",
            "-E",
            endpos,
            "-f",
            "/dev/null",
        ]
        return checked(self.timed(argv, self.pg_env(), name), "pg_recvlogical")

    def message_counts(self, slot: str, upto: str, publication: str) -> dict[str, int]:
        """What the slot will send up to `upto`, by pgoutput message kind (a peek: the slot does not move)."""
        rows = self.sql(
            "SELECT chr(get_byte(data, 0)), count(*) FROM pg_logical_slot_peek_binary_changes("
            "%s, %s::pg_lsn, NULL, 'proto_version', '1', 'publication_names', %s) GROUP BY 1 ORDER BY 1",
            params=(slot, upto, publication),
        )
        return {kind: int(n) for kind, n in rows}

    # -- set-up ----------------------------------------------------------------------------------------
    def busy_check(self, where: str) -> None:
        """Warn when something else keeps the CPUs busy: the numbers are then not comparable."""
        load = float(Path("/proc/loadavg").read_text().split()[0])
        self.results.setdefault("loadavg_1min", {})[where] = load
        if load > 0.5 * (os.cpu_count() or 1):
            say(
                f"WARNING: 1-min load average is {load:.2f} {where} on {os.cpu_count()} CPUs: other work is running, expect noisy numbers"
            )

    def start(self) -> None:
        self.busy_check("at start")
        t0 = time.perf_counter()
        self.pg.start()
        admin = psycopg2.connect(self.pg.dsn())
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {DB}")
            cur.execute("SELECT version()")
            version = cur.fetchone()[0]
        admin.close()
        self.results["config"] = {
            "rows": self.rows,
            "repeat": self.repeat,
            "txn_size": TXN_SIZE,
            "insert_share": INSERT_SHARE,
            "durable": self.pg.durable,
            "postgres": version,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "machine": platform.platform(),
        }
        say(
            f"PostgreSQL up on port {self.pg.port} in {time.perf_counter() - t0:.1f}s ({version.split(' on ')[0]})"
        )
        r = checked(self.cdc("cdc_version", "--version"), "cdc --version")
        self.results["config"]["cdc_version_s"] = r.wall_s
        say(f"bare `cdc --version` process: {r.wall_s:.2f}s")

    # -- 1. stream -------------------------------------------------------------------------------------
    def stream(self) -> None:
        self.busy_check("before part 1")
        say("\n== 1. stream ==")
        self.sql(
            f"CREATE TABLE {STREAM_TABLE} ({COLUMNS})",
            f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {STREAM_TABLE}",
        )
        reps = range(1, self.repeat + 1)
        pipes = {}
        for i in reps:
            # `cdc stream` needs the table in the log: snapshot the EMPTY table (this creates the pipeline's
            # slot at a consistent point), then pg_recvlogical's slot; all before the workload.
            pipes[i] = self.pipeline(f"bench_stream_{i}", STREAM_TABLE, f"bench_cdc_{i}", PUBLICATION)
            checked(
                self.cdc(f"stream_snapshot_{i}", "snapshot", pipes[i], "--no-progress"),
                "cdc snapshot (empty table)",
            )
            self.create_slot(f"bench_recv_{i}")
            # Diagnostic: the same stream into a log with synchronous=normal (no fsync per log commit).
            pipes[-i] = self.pipeline(
                f"bench_nosync_{i}", STREAM_TABLE, f"bench_nosync_{i}", PUBLICATION, "normal"
            )
            checked(
                self.cdc(f"stream_snapshot_nosync_{i}", "snapshot", pipes[-i], "--no-progress"),
                "cdc snapshot (empty table)",
            )
        if self.profile:
            pipes[0] = self.pipeline("bench_prof", STREAM_TABLE, "bench_prof", PUBLICATION)
            checked(
                self.cdc("prof_snapshot", "snapshot", pipes[0], "--no-progress"),
                "cdc snapshot (profile pipeline)",
            )
        say(
            f"{self.repeat} pipeline slot(s) bench_cdc_<i> (via `cdc snapshot` of the empty table) and bench_recv_<i> created"
        )

        start_lsn = self.lsn()
        inserts, updates, txns, seconds = self._workload()
        end_lsn = self.lsn()
        wal = int(self.sql("SELECT %s::pg_lsn - %s::pg_lsn", params=(end_lsn, start_lsn))[0][0])
        say(
            f"workload: {inserts + updates:,} changes ({inserts:,} inserts, {updates:,} updates) in {txns:,} transactions"
            f" in {seconds:.1f}s; {wal / 1e6:,.0f} MB of WAL; end LSN {end_lsn}"
        )
        self.sql("CHECKPOINT")
        t0 = time.perf_counter()
        kinds = self.message_counts("bench_recv_1", end_lsn, PUBLICATION)
        events = sum(kinds.get(k, 0) for k in "IUDT")
        messages = sum(kinds.values())
        say(
            f"messages per slot (peek, {time.perf_counter() - t0:.1f}s): {kinds} = {events:,} events, {messages:,} messages"
        )

        recv_runs, cdc_runs, nosync_runs = [], [], []
        for i in reps:  # interleaved, so drift (cache, checkpoints) hits both sides alike
            recv = self.recvlogical(f"stream_recvlogical_{i}", f"bench_recv_{i}", end_lsn, PUBLICATION)
            say(
                f"  [{i}] pg_recvlogical: {recv.wall_s:.2f}s, {events / recv.wall_s:,.0f} events/s, {cpu_note(recv)}"
            )
            run = checked(self.cdc(f"stream_cdc_{i}", "stream", pipes[i], "--until", "current"), "cdc stream")
            got = _parse_stream(run.out)
            say(
                f"  [{i}] cdc stream:     {run.wall_s:.2f}s, {got['events'] / run.wall_s:,.0f} events/s"
                f" (self-reported {got['rate']:,}), {cpu_note(run)}, peak RSS {fmt_mb(run.peak_rss_bytes)}"
            )
            if got["events"] != events:
                say(f"WARNING: cdc stream logged {got['events']:,} events, the slot had {events:,}")
            nosync = checked(
                self.cdc(f"stream_nosync_{i}", "stream", pipes[-i], "--until", "current"),
                "cdc stream (synchronous=normal)",
            )
            say(
                f"  [{i}] cdc stream, log synchronous=normal: {nosync.wall_s:.2f}s,"
                f" {_parse_stream(nosync.out)['events'] / nosync.wall_s:,.0f} events/s, {cpu_note(nosync)}"
            )
            recv_runs.append(recv)
            cdc_runs.append((run, got))
            nosync_runs.append(nosync)
            self.drop_slot(f"bench_recv_{i}")
            self.drop_slot(f"bench_nosync_{i}")
            shutil.rmtree(self.state(f"bench_nosync_{i}"), ignore_errors=True)
        log_bytes = dir_bytes(self.state("bench_stream_1") / "log")
        for i in reps:
            self.drop_slot(f"bench_cdc_{i}")
            shutil.rmtree(self.state(f"bench_stream_{i}"), ignore_errors=True)

        recv_s = median([r.wall_s for r in recv_runs])
        cdc_s = median([r.wall_s for r, _ in cdc_runs])
        self.results["stream"] = {
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
            "pg_recvlogical": {
                "wall_s": recv_s,
                "events_per_s": events / recv_s,
                "messages_per_s": messages / recv_s,
                "cpu_s": median([r.cpu_s for r in recv_runs]),
                "server_cpu_s": median([r.server_cpu_s or 0 for r in recv_runs]),
                "runs_s": [r.wall_s for r in recv_runs],
            },
            "cdc_stream": {
                "wall_s": cdc_s,
                "events": cdc_runs[0][1]["events"],
                "events_per_s": events / cdc_s,
                "messages_per_s": messages / cdc_s,
                "self_reported_events_per_s": median([g["rate"] for _, g in cdc_runs]),
                "cpu_s": median([r.cpu_s for r, _ in cdc_runs]),
                "server_cpu_s": median([r.server_cpu_s or 0 for r, _ in cdc_runs]),
                "peak_rss_bytes": max(r.peak_rss_bytes or 0 for r, _ in cdc_runs) or None,
                "log_bytes": log_bytes,
                "log_bytes_per_event": log_bytes / max(events, 1),
                "runs_s": [r.wall_s for r, _ in cdc_runs],
            },
            "ratio": recv_s / cdc_s,
            "cdc_stream_sync_normal": {
                "wall_s": median([r.wall_s for r in nosync_runs]),
                "events_per_s": events / median([r.wall_s for r in nosync_runs]),
                "cpu_s": median([r.cpu_s for r in nosync_runs]),
                "server_cpu_s": median([r.server_cpu_s or 0 for r in nosync_runs]),
                "peak_rss_bytes": max(r.peak_rss_bytes or 0 for r in nosync_runs) or None,
                "runs_s": [r.wall_s for r in nosync_runs],
            },
            "ratio_sync_normal": recv_s / median([r.wall_s for r in nosync_runs]),
        }
        if self.profile:
            self._profile("stream", pipes[0], self.profile)
            self.drop_slot("bench_prof")

    def _workload(self) -> tuple[int, int, int, float]:
        """`rows` changes in TXN_SIZE-change transactions: 70% inserts of new rows, 30% updates of rows
        inserted before (each row updated at most once)."""
        conn = psycopg2.connect(self.dsn, options=libpq_options())
        insert = f"INSERT INTO {STREAM_TABLE} SELECT {ROW_EXPR} FROM generate_series(%s, %s) AS g"
        update = f"UPDATE {STREAM_TABLE} SET {UPDATE_SET} WHERE id BETWEEN %s AND %s"
        next_id, next_upd, remaining = 1, 1, self.rows
        inserts = updates = txns = 0
        t0 = time.perf_counter()
        try:
            with conn.cursor() as cur:
                while remaining > 0:
                    size = min(TXN_SIZE, remaining)
                    n_ins = max(1, round(size * INSERT_SHARE))
                    n_upd = size - n_ins
                    cur.execute(insert, (next_id, next_id + n_ins - 1))
                    next_id += n_ins
                    if n_upd:
                        cur.execute(update, (next_upd, next_upd + n_upd - 1))  # always ids below next_id
                        assert cur.rowcount == n_upd, cur.rowcount
                        next_upd += n_upd
                    conn.commit()
                    inserts, updates, txns = inserts + n_ins, updates + n_upd, txns + 1
                    remaining -= size
        finally:
            conn.close()
        return inserts, updates, txns, time.perf_counter() - t0

    def _profile(self, what: str, pipe: Path, out: Path) -> None:
        """The same stream once more (own slot) under cProfile; not part of the timings."""
        argv = [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            str(out),
            "-m",
            "pipelines.cli",
            "stream",
            str(pipe),
            "--until",
            "current",
        ]
        run = checked(
            run_timed(argv, self.cdc_env(), self.work, f"profile_{what}"), "cdc stream under cProfile"
        )
        say(
            f"\n-- {what}: cdc stream under cProfile: {run.wall_s:.2f}s (profiler overhead included), profile in {out}"
        )
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(str(out), stream=buf).sort_stats(key).print_stats(25)
            text = buf.getvalue()
            say(f"-- top 25 by {key} --")
            say("\n".join(line for line in text[text.index("ncalls") :].splitlines() if line.strip()))
        self.results.setdefault("profiles", {})[what] = {"path": str(out), "wall_s": run.wall_s}

    # -- 2. snapshot -----------------------------------------------------------------------------------
    def snapshot(self) -> None:
        self.busy_check("before part 2")
        say("\n== 2. snapshot ==")
        t0 = time.perf_counter()
        self.sql(
            f"CREATE TABLE {SNAP_TABLE} ({COLUMNS})",
            f"INSERT INTO {SNAP_TABLE} SELECT {ROW_EXPR} FROM generate_series(1, {self.rows}) AS g",
            f"VACUUM (ANALYZE) {SNAP_TABLE}",
            f"CREATE PUBLICATION {SNAP_PUBLICATION} FOR TABLE {SNAP_TABLE}",
            "CHECKPOINT",
        )
        heap = int(self.sql("SELECT pg_relation_size(%s)", params=(SNAP_TABLE,))[0][0])
        say(
            f"table {SNAP_TABLE}: {self.rows:,} rows, heap {fmt_mb(heap)}, loaded in {time.perf_counter() - t0:.1f}s"
        )

        psql = [
            str(pg_bin_dir() / "psql"),
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            f"COPY {SNAP_TABLE} TO STDOUT",
        ]

        def copy(name: str) -> Timed:
            return checked(self.timed(psql, self.pg_env(), name, stdout_null=True), "psql COPY")

        warm = copy("snapshot_copy_warmup")  # reads the table into the cache for everyone after it
        say(f"  psql COPY warm-up: {warm.wall_s:.2f}s")
        copy_runs: list[Timed] = []
        runs: dict[str, list[tuple[Timed, dict[str, int], int]]] = {
            label: [] for label, _ in SNAPSHOT_CONFIGS
        }
        for rep in range(
            1, self.repeat + 1
        ):  # interleaved: each repetition runs the ceiling and every config
            c = copy(f"snapshot_copy_{rep}")
            copy_runs.append(c)
            say(
                f"  [{rep}] psql COPY TO STDOUT > /dev/null: {c.wall_s:.2f}s, {self.rows / c.wall_s:,.0f} rows/s, {cpu_note(c)}"
            )
            for label, parallel in SNAPSHOT_CONFIGS:
                name = f"bench_snap_{'default' if parallel is None else f'p{parallel}'}_{rep}"
                pipe = self.pipeline(name, SNAP_TABLE, name, SNAP_PUBLICATION)
                args = ["snapshot", pipe, "--no-progress"] + (
                    [] if parallel is None else ["--parallel", str(parallel)]
                )
                run = checked(self.cdc(f"snapshot_{name}", *args), f"cdc snapshot ({label})")
                got = _parse_snapshot(run.out)
                log_bytes = dir_bytes(self.state(name) / "log")
                if got["rows"] != self.rows:
                    say(
                        f"WARNING: cdc snapshot ({label}) copied {got['rows']:,} rows, the table has {self.rows:,}"
                    )
                say(
                    f"  [{rep}] cdc snapshot ({label}, {got['workers']} worker(s), {got['chunks']} chunk(s)): {run.wall_s:.2f}s,"
                    f" {got['rows'] / run.wall_s:,.0f} rows/s (self-reported {got['rate']:,}), {cpu_note(run)},"
                    f" peak RSS {fmt_mb(run.peak_rss_bytes)}"
                )
                runs[label].append((run, got, log_bytes))
                self.drop_slot(name)
                shutil.rmtree(self.state(name), ignore_errors=True)

        copy_s = median([c.wall_s for c in copy_runs])
        summary: dict[str, Any] = {}
        for label, parallel in SNAPSHOT_CONFIGS:
            wall = median([r.wall_s for r, _, _ in runs[label]])
            first = runs[label][0]
            summary[label] = {
                "parallel": parallel,
                "workers": first[1]["workers"],
                "chunks": first[1]["chunks"],
                "wall_s": wall,
                "rows": first[1]["rows"],
                "rows_per_s": self.rows / wall,
                "self_reported_rows_per_s": median([g["rate"] for _, g, _ in runs[label]]),
                "ratio": copy_s / wall,
                "cpu_s": median([r.cpu_s for r, _, _ in runs[label]]),
                "server_cpu_s": median([r.server_cpu_s or 0 for r, _, _ in runs[label]]),
                "peak_rss_bytes": max(r.peak_rss_bytes or 0 for r, _, _ in runs[label]) or None,
                "log_bytes": first[2],
                "runs_s": [r.wall_s for r, _, _ in runs[label]],
            }
        self.results["snapshot"] = {
            "rows": self.rows,
            "heap_bytes": heap,
            "copy": {
                "wall_s": copy_s,
                "rows_per_s": self.rows / copy_s,
                "cpu_s": median([c.cpu_s for c in copy_runs]),
                "server_cpu_s": median([c.server_cpu_s or 0 for c in copy_runs]),
                "runs_s": [c.wall_s for c in copy_runs],
                "warmup_s": warm.wall_s,
            },
            "cdc_snapshot": summary,
        }

    # -- 3. one big transaction ------------------------------------------------------------------------
    def big_transaction(self) -> None:
        self.busy_check("before part 3")
        say("\n== 3. one big transaction ==")
        # Its own empty table, pipeline and slots, all created right before the transaction, so both
        # sides decode exactly the same WAL (an older slot would first re-decode parts 1 and 2).
        self.sql(
            f"CREATE TABLE {BIG_TABLE} ({COLUMNS})",
            f"CREATE PUBLICATION {BIG_PUBLICATION} FOR TABLE {BIG_TABLE}",
        )
        pipe = self.pipeline("bench_big", BIG_TABLE, "bench_big_cdc", BIG_PUBLICATION)
        checked(self.cdc("big_snapshot", "snapshot", pipe, "--no-progress"), "cdc snapshot (empty table)")
        if self.profile:
            prof_pipe = self.pipeline("bench_big_prof", BIG_TABLE, "bench_big_prof", BIG_PUBLICATION)
            checked(
                self.cdc("big_prof_snapshot", "snapshot", prof_pipe, "--no-progress"),
                "cdc snapshot (profile)",
            )
        self.create_slot("bench_big_recv")
        t0 = time.perf_counter()
        self.sql(f"INSERT INTO {BIG_TABLE} SELECT {ROW_EXPR} FROM generate_series(1, {self.rows}) AS g")
        seconds = time.perf_counter() - t0
        end_lsn = self.lsn()
        say(f"one transaction inserting {self.rows:,} rows in {seconds:.1f}s; end LSN {end_lsn}")
        self.sql("CHECKPOINT")

        recv = self.recvlogical("big_recvlogical", "bench_big_recv", end_lsn, BIG_PUBLICATION)
        say(
            f"  pg_recvlogical: {recv.wall_s:.2f}s, {self.rows / recv.wall_s:,.0f} events/s, {cpu_note(recv)}"
        )
        self.drop_slot("bench_big_recv")
        log = self.state("bench_big") / "log"
        before = dir_bytes(log)
        run = checked(
            self.cdc("big_cdc", "stream", pipe, "--until", "current"), "cdc stream (big transaction)"
        )
        got = _parse_stream(run.out)
        growth = dir_bytes(log) - before
        say(
            f"  cdc stream: {run.wall_s:.2f}s, {got['events'] / run.wall_s:,.0f} events/s, {cpu_note(run)},"
            f" peak RSS {fmt_mb(run.peak_rss_bytes)}, log +{fmt_mb(growth)}"
        )
        if got["events"] != self.rows:
            say(f"WARNING: cdc stream logged {got['events']:,} events, the transaction had {self.rows:,}")
        self.results["big_txn"] = {
            "rows": self.rows,
            "insert_s": seconds,
            "pg_recvlogical": {
                "wall_s": recv.wall_s,
                "events_per_s": self.rows / recv.wall_s,
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
        self.drop_slot("bench_big_cdc")
        if self.profile:
            self._profile("big_txn", prof_pipe, self.profile.with_suffix(".big.prof"))
            self.drop_slot("bench_big_prof")

    # -- report ----------------------------------------------------------------------------------------
    def report(self) -> None:
        r = self.results
        s, sn, b = r.get("stream"), r.get("snapshot"), r.get("big_txn")
        rows: list[tuple[str, ...]] = []

        def row(
            name: str, m: dict[str, Any], rate: float, unit: str, ratio: float | None, notes: str = ""
        ) -> None:
            runs = m.get("runs_s")
            rows.append(
                (
                    name,
                    f"{m['wall_s']:.2f}",
                    spread(runs) if runs else "",
                    f"{fmt_int(rate)} {unit}",
                    fmt_pct(ratio),
                    f"{m['cpu_s']:.1f}",
                    f"{m['server_cpu_s']:.1f}",
                    fmt_mb(m.get("peak_rss_bytes")),
                    notes,
                )
            )

        if s:
            row(
                "stream: pg_recvlogical",
                s["pg_recvlogical"],
                s["pg_recvlogical"]["events_per_s"],
                "ev/s",
                1.0,
                f"{fmt_int(s['pg_recvlogical']['messages_per_s'])} msg/s",
            )
            c = s["cdc_stream"]
            row(
                "stream: cdc stream",
                c,
                c["events_per_s"],
                "ev/s",
                s["ratio"],
                f"{fmt_int(c['messages_per_s'])} msg/s, log {fmt_mb(c['log_bytes'])} ({c['log_bytes_per_event']:.0f} B/event)",
            )
            n = s["cdc_stream_sync_normal"]
            row(
                "  (diag.) log sync=normal",
                n,
                n["events_per_s"],
                "ev/s",
                s["ratio_sync_normal"],
                "no fsync per log commit",
            )
        if sn:
            row(
                "snapshot: psql COPY",
                sn["copy"],
                sn["copy"]["rows_per_s"],
                "rows/s",
                1.0,
                f"heap {fmt_mb(sn['heap_bytes'])}",
            )
            for label, m in sn["cdc_snapshot"].items():
                row(
                    f"snapshot: cdc {label}",
                    m,
                    m["rows_per_s"],
                    "rows/s",
                    m["ratio"],
                    f"{m['workers']} worker(s), {m['chunks']} chunk(s), log {fmt_mb(m['log_bytes'])}",
                )
        if b:
            row(
                "big txn: pg_recvlogical",
                b["pg_recvlogical"],
                b["pg_recvlogical"]["events_per_s"],
                "ev/s",
                1.0,
            )
            c = b["cdc_stream"]
            row(
                "big txn: cdc stream",
                c,
                c["events_per_s"],
                "ev/s",
                b["ratio"],
                f"log +{fmt_mb(c['log_growth_bytes'])}",
            )
        header = (
            "measurement",
            "wall s",
            "runs",
            "rate",
            "vs ceiling",
            "CPU s",
            "PG CPU s",
            "peak RSS",
            "notes",
        )
        widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
        cfg = r["config"]
        say("\n== results ==")
        say(
            f"{cfg['rows']:,} rows/changes, median of {cfg['repeat']} run(s), PostgreSQL durable={cfg['durable']},"
            f" {cfg['cpus']} CPUs, {cfg['postgres'].split(' on ')[0]}"
        )
        for i, line in enumerate([header, *rows]):
            cells = [
                c.rjust(w) if 0 < j < len(header) - 1 else c.ljust(w)
                for j, (c, w) in enumerate(zip(line, widths, strict=True))
            ]
            say("  ".join(cells).rstrip())
            if i == 0:
                say("  ".join("-" * w for w in widths))
        say("")
        if s:
            ok = "meets the 50% target" if s["ratio"] >= 0.5 else "BELOW the 50% target"
            say(
                f"stream: pg_recvlogical {fmt_int(s['pg_recvlogical']['events_per_s'])} ev/s | cdc stream"
                f" {fmt_int(s['cdc_stream']['events_per_s'])} ev/s | {fmt_pct(s['ratio'])} ({ok});"
                f" cdc peak RSS {fmt_mb(s['cdc_stream']['peak_rss_bytes'])}, log {fmt_mb(s['cdc_stream']['log_bytes'])}"
            )
        if sn:
            d = sn["cdc_snapshot"]["default"]
            ok = "meets the 60% target" if d["ratio"] >= 0.6 else "BELOW the 60% target"
            say(
                f"snapshot: psql COPY {fmt_int(sn['copy']['rows_per_s'])} rows/s | cdc snapshot {fmt_int(d['rows_per_s'])} rows/s"
                f" | {fmt_pct(d['ratio'])} ({ok}; default = {d['workers']} worker(s))"
            )
            say(
                "snapshot by workers: "
                + " | ".join(
                    f"{k} {fmt_int(v['rows_per_s'])} rows/s {fmt_pct(v['ratio'])}"
                    for k, v in sn["cdc_snapshot"].items()
                    if k != "default"
                )
            )
        if b:
            say(
                f"big txn: pg_recvlogical {fmt_int(b['pg_recvlogical']['events_per_s'])} ev/s | cdc stream"
                f" {fmt_int(b['cdc_stream']['events_per_s'])} ev/s | {fmt_pct(b['ratio'])}; cdc peak RSS"
                f" {fmt_mb(b['cdc_stream']['peak_rss_bytes'])}"
                + (
                    f" (with 1000-change transactions: {fmt_mb(s['cdc_stream']['peak_rss_bytes'])})"
                    if s
                    else ""
                )
            )


_STREAMED = re.compile(r"streamed ([\d,]+) events in ([\d,]+) transactions \(([\d,]+) events/s\)")
_SNAPSHOT_DONE = re.compile(
    r"snapshot done: ([\d,]+) rows from \d+ table\(s\) in [\d.]+s \(([\d,]+) rows/s\)"
)
_COPYING = re.compile(r"in (\d+) chunk\(s\) with (\d+) worker\(s\)")


def _num(text: str) -> int:
    return int(text.replace(",", ""))


def _parse_stream(out: str) -> dict[str, int]:
    m = _STREAMED.search(out)
    if m is None:
        raise RuntimeError(
            f"cannot find the final 'streamed ...' line in cdc stream's output:\n{out[-2000:]}"
        )
    return {"events": _num(m[1]), "transactions": _num(m[2]), "rate": _num(m[3])}


def _parse_snapshot(out: str) -> dict[str, int]:
    m, w = _SNAPSHOT_DONE.search(out), _COPYING.search(out)
    if m is None:
        raise RuntimeError(f"cannot find 'snapshot done: ...' in cdc snapshot's output:\n{out[-2000:]}")
    return {
        "rows": _num(m[1]),
        "rate": _num(m[2]),
        "chunks": int(w[1]) if w else 0,
        "workers": int(w[2]) if w else 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=1_000_000,
        help="changes streamed, rows snapshotted, rows in the big transaction (default 1,000,000)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed runs per measurement; medians are reported (default 3)"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the work dir (cluster, logs, outputs) instead of deleting it",
    )
    parser.add_argument("--json", type=Path, help="also write every number to this JSON file")
    parser.add_argument(
        "--profile",
        type=Path,
        help="also run cdc stream under cProfile (own slot, untimed); write OUT and OUT.big.prof, print the top functions",
    )
    parser.add_argument(
        "--only",
        choices=["stream", "snapshot", "big"],
        action="append",
        help="run only these parts (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.rows < 10 or args.repeat < 1:
        parser.error("--rows must be at least 10 and --repeat at least 1")
    parts = args.only or ["stream", "snapshot", "big"]

    for out in (args.json, args.profile):
        if out is not None:
            out.resolve().parent.mkdir(parents=True, exist_ok=True)
    # Not under a root-private dir: the server runs as `postgres` and must reach its data dir.
    work = Path(tempfile.mkdtemp(prefix="cdc-bench-"))
    os.chmod(work, 0o755)
    bench = Bench(args.rows, args.repeat, work, args.profile.resolve() if args.profile else None)
    started = time.perf_counter()
    say(f"work dir {work}")
    try:
        bench.start()
        if "stream" in parts:
            bench.stream()
        if "snapshot" in parts:
            bench.snapshot()
        if "big" in parts:
            bench.big_transaction()
        bench.results["total_s"] = time.perf_counter() - started
        bench.report()
        say(f"\ntotal {bench.results['total_s']:.0f}s")
        if args.json:
            args.json.write_text(json.dumps(bench.results, indent=2, default=str) + "\n")
            say(f"numbers written to {args.json}")
        return 0
    finally:
        bench.pg.stop()
        if args.keep:
            say(
                f"kept {work} (PostgreSQL stopped; LocalPostgres(Path({str(work / 'pg')!r})).start() starts it again)"
            )
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
