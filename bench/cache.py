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
import random
import sqlite3
import sys
import time
from pathlib import Path

import redis
from harness import cdcout
from harness.bench import Bench
from harness.main import main
from harness.report import Report
from harness.services import say, started
from harness.workload import COLUMNS, TXN_SIZE, connect, row_expr, update_set

from pipelines.devservices.redis import LocalRedis

TABLE = "public.bench_cache"
ROW_EXPR = row_expr()
UPDATE_SET = update_set(note="left(md5((id + qty)::text), 20)")


def write_path(url: str) -> list[tuple[str, float, str]]:
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
    started_at = time.perf_counter()
    for i in range(0, len(rows), 2000):  # packed like the writer packs its calls: RESP by hand
        trip = []
        for k, _t, _op, _l, _s, v, _u in rows[i : i + 2000]:
            kb, vb = k.encode(), v.encode()
            trip.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(kb), kb, len(vb), vb))
        conn.send_packed_command(trip, check_health=False)
        for _ in trip:
            conn.read_response()
    out.append(("pipelined SET (ceiling)", time.perf_counter() - started_at, "no position check"))
    plain.connection_pool.release(conn)
    plain.flushdb()
    plain.close()
    target = url.rsplit("/", 1)[0] + "/2"
    client = redis.Redis.from_url(target)
    sha = client.script_load(scripts.UPSERT)
    for label in ("compare-and-set writer", "same rows again"):
        started_at = time.perf_counter()
        (counts,) = write_partition(
            iter(rows),
            url=target,
            script=scripts.UPSERT,
            sha=sha,
            truncate_key="__cdc:t:w:*",
            ttl=0,
            tomb_ttl=60,
        )
        out.append(
            (label, time.perf_counter() - started_at, f"inserted {counts[0]:,}, ignored {counts[3]:,}")
        )
    client.flushdb()
    client.close()
    return out


def workload(dsn: str, changes: int, keys: int) -> None:
    conn = connect(dsn)
    rng = random.Random(7)
    try:
        with conn.cursor() as cur:
            for start in range(1, keys + 1, TXN_SIZE):
                end = min(keys, start + TXN_SIZE - 1)
                cur.execute(f"INSERT INTO {TABLE} SELECT {ROW_EXPR} FROM generate_series({start}, {end}) g")
                conn.commit()
            left = changes - keys
            while left > 0:
                n = min(TXN_SIZE, left)
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
    conn = connect(dsn)
    try:
        cached = sum(1 for _ in client.scan_iter(match="public.bench_cache:*", count=5000))
        if cached != keys:
            raise SystemExit(f"cache check: {cached:,} cached rows, the source has {keys:,}")
        ids = random.Random(1).sample(range(1, keys + 1), min(200, keys))
        with conn.cursor() as cur:
            cur.execute(f"SELECT id, qty, note, flag FROM {TABLE} WHERE id = ANY(%s)", (ids,))
            for id_, qty, note, flag in cur.fetchall():
                row = json.loads(client.get(f"public.bench_cache:{id_}"))
                if (row["qty"], row["note"], row["flag"]) != (qty, note, flag):
                    raise SystemExit(
                        f"cache check: key {id_} differs: cache {row}, source {(qty, note, flag)}"
                    )
        memory = client.info("memory")["used_memory"]
        return f"{cached:,} rows cached, {len(ids)} sampled rows equal the source, Redis used_memory {memory / 1e6:,.0f} MB"
    finally:
        client.close()
        conn.close()


def body(b: Bench) -> Report:
    args = b.args
    b.results["config"].update(changes=args.changes, keys=args.keys)
    b.start_postgres(durable=False)
    cache = started(b.stack, LocalRedis(b.work / "redis"), "Redis")
    b.sql(f"CREATE TABLE {TABLE} ({COLUMNS})")
    file = b.pipeline(
        "bench_cache",
        [TABLE],
        sinks=[
            {"name": "cache", "redis": {"url": cache.url, "tables": [TABLE]}},
            {"name": "lake", "delta": {"path": "lake"}},
        ],
        spark={"master": "local[2]"},
    )
    b.cdc("cache_snapshot", "snapshot", file, "--no-progress")
    t0 = time.perf_counter()
    workload(b.dsn, args.changes, args.keys)
    say(f"workload: {args.changes:,} changes over {args.keys:,} keys in {time.perf_counter() - t0:.0f}s")
    wall = b.cdc("cache_stream", "stream", file, "--until", "current").wall_s
    events = log_events(b.state("bench_cache") / "log")
    say(
        f"cdc stream: {events:,} changes into the log in {wall:.1f}s ({events / wall:,.0f} changes/s, for information)"
    )
    if events < args.changes:
        raise SystemExit(f"the log holds {events:,} changes, expected {args.changes:,}")
    b.results["log_changes"] = events

    def apply(label: str, sink: str) -> dict:
        run = b.cdc(f"apply_{label.replace(' ', '_')}", "apply", file, "--once", "--sink", sink, tree=True)
        own, detail = cdcout.applied(run.out, sink)
        cpu = run.tree_cpu_s or 0.0
        say(
            f"cdc apply --once --sink {sink} ({label}): wall {run.wall_s:.1f}s, sink {own:.1f}s, CPU {cpu:.1f}s: {detail}"
        )
        return {
            "sink": label,
            "wall_s": run.wall_s,
            "sink_s": own,
            "cpu_s": cpu,
            "changes_per_s": events / own,
            "keys_per_s": args.keys / own,
            "detail": detail,
        }

    runs = [apply("cache", "cache")] + ([] if args.no_delta else [apply("lake", "lake")])
    if args.replay:
        ckpt = b.state("bench_cache") / "checkpoints" / "cache.json"
        saved = json.loads(ckpt.read_text())
        saved.update(cut_id=0, lsn=0, tables={}, pending=None)
        ckpt.write_text(json.dumps(saved))
        runs.append(apply("cache replay", "cache"))
    b.results["runs"] = runs
    say(f"check: {check_cache(b.dsn, cache.url, args.keys)}")
    paths = write_path(cache.url)
    b.results["write_path"] = [
        {"what": w, "seconds": sec, "keys_per_s": args.keys / sec, "detail": d} for w, sec, d in paths
    ]

    return summary(b.results)


def summary(r: dict) -> Report:
    """The side-by-side table of a run's results: Redis against Delta over the same log (the peer),
    and the compare-and-set writer against plain pipelined SETs (the ceiling)."""
    changes, keys = r["config"]["changes"], r["config"]["keys"]
    rep = Report(
        "Cache follower: cdc apply into Redis, next to Delta (bench/cache.py)", ("wall s", "own s", "CPU s")
    )
    rep.subtitle = f"{changes:,} changes over {keys:,} keys; rates in the sink's own time"
    runs = {run["sink"]: run for run in r["runs"]}
    delta = runs.get("lake", {}).get("changes_per_s")
    names = {
        "cache": ("Redis (cache)", "cdc"),
        "lake": ("Delta (lake), same log", "peer"),
        "cache replay": ("Redis, cut replayed", "diag"),
    }
    for sink, run in runs.items():
        name, role = names[sink]
        rep.add(
            "apply",
            name,
            run["changes_per_s"],
            "changes/s",
            role=role,
            notes=run["detail"],
            ratio=run["changes_per_s"] / delta if delta else None,
            wall_s=f"{run['wall_s']:.1f}",
            own_s=f"{run['sink_s']:.1f}",
            CPU_s=f"{run['cpu_s']:.1f}",
        )
    ceiling = r["write_path"][0]["keys_per_s"]  # pipelined SET, measured first
    for w in r["write_path"]:
        role = "ceiling" if "ceiling" in w["what"] else ("cdc" if w["what"].startswith("compare") else "diag")
        rep.add(
            "Redis write path alone, one connection",
            w["what"],
            w["keys_per_s"],
            "keys/s",
            role=role,
            ratio=w["keys_per_s"] / ceiling,
            notes=w["detail"],
            own_s=f"{w['seconds']:.2f}",
        )
    rate = runs["cache"]["changes_per_s"]
    line = f"cache: {rate:,.0f} changes/s into Redis ({'meets' if rate >= 20_000 else 'MISSES'} the 20,000/s target)"
    rep.summary.append(line + (f" | Delta: {delta:,.0f} changes/s" if delta else ""))
    return rep


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--no-delta", action="store_true", help="skip the Delta side")
    ap.add_argument("--replay", action="store_true", help="also time the cache cut applied a second time")
    return ap


def check(args: argparse.Namespace) -> str | None:
    return (
        "--changes must be at least --keys (every key is inserted once)" if args.changes < args.keys else None
    )


if __name__ == "__main__":
    sys.exit(main(parser(), body, prefix="cache", check=check))
