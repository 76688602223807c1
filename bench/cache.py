"""Cache follower benchmark: `cdc apply --once` into Redis, next to the same log into Delta.

One run, one machine: a throwaway PostgreSQL (pipelines.devservices.postgres.LocalPostgres)
and a throwaway redis-server (LocalRedis: AOF on, appendfsync everysec, as the dev service).

  1. workload  a 10-column table (bigint key, integer, numeric(12,2), float8, text, varchar,
               boolean, timestamptz, date, uuid), snapshotted empty, then --changes changes over
               --keys keys in 1000-change transactions: every key inserted once, the rest
               updates of 1000 distinct random keys each; `cdc stream --until current` puts them
               in the local log (the real capture path; timed for information only).
  2. apply     `cdc apply PIPELINE --once --sink cache` (Redis), then `--sink lake` (Delta,
               SCD1) over the same log; each sink drains the whole log in one cut. Reported:
               wall time of the command (spawn to exit, JVM start included) and the sink's own
               time from its report line (reading the log, net change per key, writing), and
               changes/s = log changes / that time; keys/s = net keys written / that time;
               CPU s = user+sys of the command's whole process tree (JVM, Python workers; sampled
               from /proc), the figure that survives a busy machine.
  3. write    the Redis write path alone (no Spark), on the values the apply cached: plain
               pipelined SETs (the ceiling, no position check) next to the compare-and-set writer
               the executors run (one connection), then the same rows again (all refused).
  4. replay    (--replay) the cache cut applied again (its checkpoint set back): every write is
               refused by the compare-and-set; measures the idempotent path.

Afterwards the cache is checked: one key per source row, and 200 random rows equal the source.

    .venv/bin/python bench/cache.py [--changes 1000000] [--keys 100000] [--no-delta] [--replay]
                                    [--keep] [--json out.json]

About 5-7 minutes on an idle 2-core machine at the default size.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg2
import redis
import yaml
from common import COLUMNS, say

from cdc.session import libpq_options
from pipelines.devservices.postgres import LocalPostgres
from pipelines.devservices.redis import LocalRedis

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DB = "bench"
TABLE = "public.bench_cache"
TXN = 1000
ROW_EXPR = """
    g, mod(g, 100000)::int, (mod(g, 10000000) / 100.0)::numeric(12,2), g * 0.731::float8,
    left(md5(g::text), 20), 'code-' || mod(g, 9973)::text, mod(g, 3) = 0,
    timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', date '2024-01-01' + mod(g, 3650)::int,
    md5(g::text)::uuid
"""
UPDATE_SET = """
    qty = qty + 1, price = price + 0.01, score = score * 1.5, note = left(md5((id + qty)::text), 20),
    flag = NOT flag, updated_at = updated_at + interval '1 minute'
"""
REPORT = re.compile(r"sink (\w+): applied cut \d+ \([^)]*\) in ([\d.]+)s: (.*)")


CPU = {"last": 0.0}  # user+sys CPU seconds of the last command's process tree
_TICK = os.sysconf("SC_CLK_TCK")


def _tree_ticks(root: int, seen: dict[int, int]) -> None:
    """Record utime+stime (own + reaped children) of `root` and every live descendant in `seen`."""
    parents: dict[int, int] = {}
    stats: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
        stats[int(entry.name)] = sum(int(f) for f in fields[11:15])
    for pid, ticks in stats.items():
        p = pid
        while p and p != root:
            p = parents.get(p, 0)
        if p == root:
            seen[pid] = max(seen.get(pid, 0), ticks)


def run(argv: list[str], env: dict[str, str], what: str) -> tuple[float, str]:
    """Run a command; wall time, and CPU of its process tree (the JVM and Python workers included,
    sampled from /proc every 0.2 s) in CPU["last"]."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen: dict[int, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            _tree_ticks(proc.pid, seen)
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    stop.set()
    sampler.join()
    CPU["last"] = sum(seen.values()) / _TICK
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode}):\n{out[-3000:]}\n{err[-3000:]}")
    return wall, out


def write_path(url: str, keys: int) -> list[tuple[str, float, str]]:
    """The Redis write path alone, without Spark, on the values the apply cached: plain pipelined
    SETs of them (the ceiling: no position check), then our compare-and-set writer
    (sinks.cache.writer.write_partition, one connection, as one Spark partition) into fresh keys,
    then the same rows again (every write refused: the replay path)."""
    from sinks.cache import scripts
    from sinks.cache.writer import write_partition

    source = redis.Redis.from_url(url)
    names = [k.decode() for k in source.scan_iter(match="public.bench_cache:*", count=5000)]
    values = []
    for i in range(0, len(names), 5000):
        values += [v.decode() for v in source.mget(names[i : i + 5000])]
    source.close()
    rows = []
    for k, v in zip(names, values, strict=True):
        head = json.loads(v)
        rows.append((f"w:{k}", f"__cdc:d:w:{k}", "u", head["_cdc_lsn"], head["_cdc_seq"], v, ""))
    out = []
    plain = redis.Redis.from_url(url.rsplit("/", 1)[0] + "/1")
    plain.flushdb()
    conn = plain.connection_pool.get_connection()
    started = time.perf_counter()
    for i in range(0, len(rows), 2000):  # packed like the writer packs its calls: RESP by hand
        trip = []
        for k, _t, _op, _l, _s, v, _u in rows[i : i + 2000]:
            kb, vb = k.encode(), v.encode()
            trip.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(kb), kb, len(vb), vb))
        conn.send_packed_command(trip, check_health=False)
        for _ in trip:
            conn.read_response()
    out.append(("pipelined SET (ceiling)", time.perf_counter() - started, "no position check"))
    plain.connection_pool.release(conn)
    plain.flushdb()
    plain.close()
    target = url.rsplit("/", 1)[0] + "/2"
    client = redis.Redis.from_url(target)
    sha = client.script_load(scripts.UPSERT)
    for label in ("compare-and-set writer", "same rows again"):
        started = time.perf_counter()
        (counts,) = write_partition(
            iter(rows),
            url=target,
            script=scripts.UPSERT,
            sha=sha,
            truncate_key="__cdc:t:w:*",
            ttl=0,
            tomb_ttl=60,
        )
        out.append((label, time.perf_counter() - started, f"inserted {counts[0]:,}, ignored {counts[3]:,}"))
    client.flushdb()
    client.close()
    return out


def sink_report(out: str, sink: str) -> tuple[float, str]:
    for line in out.splitlines():
        m = REPORT.search(line)
        if m and m.group(1) == sink:
            return float(m.group(2)), m.group(3)
    raise SystemExit(f"no report line for sink {sink} in:\n{out}")


def workload(dsn: str, changes: int, keys: int) -> None:
    conn = psycopg2.connect(dsn, options=libpq_options())
    rng = random.Random(7)
    try:
        with conn.cursor() as cur:
            for start in range(1, keys + 1, TXN):
                end = min(keys, start + TXN - 1)
                cur.execute(f"INSERT INTO {TABLE} SELECT {ROW_EXPR} FROM generate_series({start}, {end}) g")
                conn.commit()
            left = changes - keys
            while left > 0:
                n = min(TXN, left)
                ids = rng.sample(range(1, keys + 1), n)
                cur.execute(f"UPDATE {TABLE} SET {UPDATE_SET} WHERE id = ANY(%s)", (ids,))
                conn.commit()
                left -= n
    finally:
        conn.close()


def log_events(log_dir: Path) -> int:
    db = sqlite3.connect(f"file:{log_dir / 'log.db'}?mode=ro", uri=True)
    try:
        (tid,) = db.execute("SELECT id FROM tables WHERE table_name = 'bench_cache'").fetchone()
        return db.execute(f"SELECT count(*) FROM ev_{tid} WHERE op != 'S'").fetchone()[0]
    finally:
        db.close()


def check_cache(dsn: str, url: str, keys: int) -> str:
    client = redis.Redis.from_url(url, decode_responses=True)
    conn = psycopg2.connect(dsn, options=libpq_options())
    try:
        cached = sum(1 for _ in client.scan_iter(match="public.bench_cache:*", count=5000))
        if cached != keys:
            raise SystemExit(f"cache check: {cached:,} cached rows, the source has {keys:,}")
        ids = random.Random(1).sample(range(1, keys + 1), 200)
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, qty, note, flag FROM {TABLE} WHERE id = ANY(%s)", (ids,))
            for id_, qty, note, flag in cur.fetchall():
                row = json.loads(client.get(f"public.bench_cache:{id_}"))
                if (row["qty"], row["note"], row["flag"]) != (qty, note, flag):
                    raise SystemExit(
                        f"cache check: key {id_} differs: cache {row}, source {(qty, note, flag)}"
                    )
        memory = client.info("memory")["used_memory"]
        return f"{cached:,} rows cached, 200 sampled rows equal the source, Redis used_memory {memory / 1e6:,.0f} MB"
    finally:
        client.close()
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--no-delta", action="store_true", help="skip the Delta side")
    ap.add_argument("--replay", action="store_true", help="also time the cache cut applied a second time")
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    ap.add_argument("--json", type=Path, help="write the figures as JSON")
    args = ap.parse_args()
    if args.changes < args.keys:
        raise SystemExit("--changes must be at least --keys (every key is inserted once)")

    work = Path(tempfile.mkdtemp(prefix="cdc-bench-cache-"))
    os.chmod(work, 0o755)  # the PostgreSQL server runs as `postgres` when we are root
    pg = LocalPostgres(work / "pg", durable=False)
    cache = LocalRedis(work / "redis")
    figures: dict[str, object] = {"changes": args.changes, "keys": args.keys, "cpus": os.cpu_count()}
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1) / 2:
        say(f"warning: 1-minute load average is {load:.1f} on {os.cpu_count()} CPUs: figures will be low")
    figures["load_before"] = load
    try:
        pg.start()
        cache.start()
        admin = psycopg2.connect(pg.dsn())
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE {DB}")
        admin.close()
        dsn = pg.dsn(DB)
        conn = psycopg2.connect(dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE TABLE {TABLE} ({COLUMNS})")
        conn.close()
        pipeline = {
            "name": "bench_cache",
            "source": {"postgres": {"dsn": "${BENCH_DSN}", "tables": [TABLE]}},
            "sinks": [
                {"name": "cache", "redis": {"url": cache.url, "tables": [TABLE]}},
                {"name": "lake", "delta": {"path": "lake"}},
            ],
            "spark": {"master": "local[2]"},
        }
        file = work / "bench_cache.yml"
        file.write_text(yaml.safe_dump(pipeline, sort_keys=False))
        env = {**os.environ, "BENCH_DSN": dsn}
        cdc = str(BIN / "cdc")

        run([cdc, "snapshot", str(file), "--no-progress"], env, "cdc snapshot")
        started = time.perf_counter()
        workload(dsn, args.changes, args.keys)
        say(
            f"workload: {args.changes:,} changes over {args.keys:,} keys in {time.perf_counter() - started:.0f}s"
        )
        wall, _ = run([cdc, "stream", str(file), "--until", "current"], env, "cdc stream")
        events = log_events(work / ".cdc" / "bench_cache" / "log")
        say(
            f"cdc stream: {events:,} changes into the log in {wall:.1f}s ({events / wall:,.0f} changes/s, for information)"
        )
        if events < args.changes:
            raise SystemExit(f"the log holds {events:,} changes, expected {args.changes:,}")
        figures["log_changes"] = events

        ckpt = work / ".cdc" / "bench_cache" / "checkpoints" / "cache.json"
        rows = []
        sinks = ["cache"] + ([] if args.no_delta else ["lake"])
        for sink in sinks:
            wall, out = run(
                [cdc, "apply", str(file), "--once", "--sink", sink], env, f"cdc apply --sink {sink}"
            )
            own, detail = sink_report(out, sink)
            rows.append((sink, wall, own, CPU["last"], detail))
            say(
                f"cdc apply --once --sink {sink}: wall {wall:.1f}s, sink {own:.1f}s, CPU {CPU['last']:.1f}s: {detail}"
            )
        if args.replay:
            saved = json.loads(ckpt.read_text())
            saved.update(cut_id=0, lsn=0, tables={}, pending=None)
            ckpt.write_text(json.dumps(saved))
            wall, out = run([cdc, "apply", str(file), "--once", "--sink", "cache"], env, "cdc apply (replay)")
            own, detail = sink_report(out, "cache")
            rows.append(("cache replay", wall, own, CPU["last"], detail))
            say(
                f"cdc apply --once --sink cache (replay): wall {wall:.1f}s, sink {own:.1f}s, CPU {CPU['last']:.1f}s: {detail}"
            )
        check = check_cache(dsn, cache.url, args.keys)
        say(f"check: {check}")
        paths = write_path(cache.url, args.keys)
        figures["write_path"] = [
            {"what": w, "seconds": sec, "keys_per_s": args.keys / sec, "detail": d} for w, sec, d in paths
        ]

        say("")
        say(
            f"{'follower':<14} {'wall s':>7} {'sink s':>7} {'CPU s':>7} {'changes/s':>11} {'keys/s':>9}  result"
        )
        figures["runs"] = []
        for sink, wall, own, cpu, detail in rows:
            say(
                f"{sink:<14} {wall:>7.1f} {own:>7.1f} {cpu:>7.1f} {events / own:>11,.0f} {args.keys / own:>9,.0f}  {detail}"
            )
            figures["runs"].append(
                {
                    "sink": sink,
                    "wall_s": wall,
                    "sink_s": own,
                    "cpu_s": cpu,
                    "changes_per_s": events / own,
                    "keys_per_s": args.keys / own,
                    "detail": detail,
                }
            )
        say("")
        say(f"{'Redis write path alone':<26} {'s':>6} {'keys/s':>9}  (one connection, no Spark)")
        for what, sec, detail in paths:
            say(f"{what:<26} {sec:>6.2f} {args.keys / sec:>9,.0f}  {detail}")
        cache_rate = events / rows[0][2]
        verdict = "meets" if cache_rate >= 20_000 else "MISSES"
        line = f"cache: {cache_rate:,.0f} changes/s into Redis ({verdict} the 20,000/s target)"
        if not args.no_delta:
            line += f" | Delta: {events / rows[1][2]:,.0f} changes/s"
        say(line)
        figures["load_after"] = os.getloadavg()[0]
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))
    finally:
        cache.stop()
        pg.stop()
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
