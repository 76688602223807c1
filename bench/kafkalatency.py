"""Commit-to-Kafka latency of `cdc stream` (log: kafka) next to pg_recvlogical, in one run.

A paced writer commits single-row INSERT transactions at --rate per second (default 200) for
--seconds; each transaction's latency is the time from its COMMIT returning to the client to the
moment its row is seen downstream:
  * pg_recvlogical (test_decoding, to a pipe this process reads): the walsender alone, the floor;
  * `cdc stream` with `log: kafka`: the row's record read from the table topic by a consumer in
    this process (staged, rendered, produced and acknowledged by Kafka, then fetched).
Both run at the same time over the same transactions. `cdc stream` runs twice over consecutive
workloads: with the publisher polling the staging log every 0.2 s whenever it found nothing new
(the behaviour before the doorbell, selected by PGCDC_PUBLISHER_POLL_S=0.2), then as shipped (the
stream rings the publisher after each committed cut). After each workload (and 5 s to settle),
--idle-seconds with no writes measure the CPU each side uses while idle (cdc stream with its
publisher child).
All timestamps come from one clock in this process; the consumer's fetch adds at most a few ms.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import threading
import time
from typing import Any

import orjson
from harness.bench import BIN, Bench
from harness.proc import live_tree_cpu_s, proc_cpu_s
from harness.services import DB, say
from harness.workload import connect
from kafkapeer import Peer

from pipelines.devservices.postgres import pg_bin_dir

TABLE = "public.bench_lat"
PREFIX = "lat"
MODES = {"poll 0.2 s (before)": {"PGCDC_PUBLISHER_POLL_S": "0.2"}, "doorbell (after)": {}}


class Seen:
    """id -> the first time (time.monotonic) a side saw that row."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}
        self.lock = threading.Lock()

    def mark(self, key: int) -> None:
        now = time.monotonic()
        with self.lock:
            self.at.setdefault(key, now)


def read_recvlogical(proc: subprocess.Popen, seen: Seen) -> None:
    """test_decoding lines: `table public.bench_lat: INSERT: id[bigint]:17 note[text]:'x'`."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if b": INSERT: id[bigint]:" in line:
            seen.mark(int(line.split(b"id[bigint]:", 1)[1].split(b" ", 1)[0]))


def read_topic(bootstrap: str, topic: str, seen: Seen, stop: threading.Event) -> None:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=[bootstrap],
        client_id="bench-latency",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    consumer.assign([TopicPartition(topic, 0)])
    try:
        while not stop.is_set():
            for records in consumer.poll(timeout_ms=100).values():
                for r in records:
                    if r.key and r.value is not None:
                        seen.mark(orjson.loads(r.key)["id"])
    finally:
        consumer.close()


def write_paced(dsn: str, first: int, rate: int, seconds: float) -> dict[int, float]:
    """Single-row transactions at `rate` per second on a fixed schedule; id -> commit returned."""
    committed: dict[int, float] = {}
    conn = connect(dsn)
    try:
        start = time.monotonic()
        with conn.cursor() as cur:
            for i in range(int(rate * seconds)):
                due = start + i / rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                cur.execute(f"INSERT INTO {TABLE} VALUES (%s, 'x')", (first + i,))
                conn.commit()
                committed[first + i] = time.monotonic()
    finally:
        conn.close()
    return committed


def latencies_ms(committed: dict[int, float], seen: Seen, timeout: float = 60) -> tuple[list[float], int]:
    """Sorted latencies of the rows this side saw (waiting up to `timeout` for the rest); rows missing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(k not in seen.at for k in committed):
        time.sleep(0.2)
    with seen.lock:
        found = sorted((seen.at[k] - t) * 1000 for k, t in committed.items() if k in seen.at)
    return found, len(committed) - len(found)


def stats(ms: list[float]) -> dict[str, Any]:
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 1),
        "p99_ms": round(ms[max(0, int(len(ms) * 0.99) - 1)], 1),
        "max_ms": round(ms[-1], 1),
    }


def idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Share of one core each process tree used over `seconds` with no writes."""
    before = {name: live_tree_cpu_s(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {
        name: round(100 * (live_tree_cpu_s(pid) - before[name]) / seconds, 2) for name, pid in pids.items()
    }


def start_stream(b: Bench, pipeline, name: str, extra_env: dict[str, str]) -> subprocess.Popen:
    env = {**b.cdc_env(), **extra_env}
    with open(b.work / f"{name}.out", "wb") as out, open(b.work / f"{name}.err", "wb") as err:
        proc = subprocess.Popen([str(BIN / "cdc"), "stream", str(pipeline)], stdout=out, stderr=err, env=env)
    deadline = time.monotonic() + 120
    while not b.sql("SELECT active FROM pg_replication_slots WHERE slot_name = 'lat_cdc'")[0][0]:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"cdc stream did not start: {(b.work / f'{name}.err').read_text()[-2000:]}")
        time.sleep(0.2)
    return proc


def warm_up(b: Bench, key: int, seen: Seen, timeout: float = 120) -> None:
    """One row through the whole path before the timed writes: `cdc stream` is up once its slot
    is active, but its publisher child may still be starting (seconds on a busy machine)."""
    b.sql(f"INSERT INTO {TABLE} VALUES ({key}, 'warm-up')")
    deadline = time.monotonic() + timeout
    while key not in seen.at:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm-up row {key} did not reach Kafka within {timeout:.0f}s")
        time.sleep(0.1)


def stop_stream(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)


def latency(b: Bench, peer: Peer) -> None:
    args = b.args
    b.load("before latency")
    say(f"\n== 3. commit-to-Kafka latency at {args.rate} transactions/s ==")
    b.sql(
        f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, note text)",
        # one seed row: `cdc snapshot` with log: kafka fails on an empty table (see the stream part)
        f"INSERT INTO {TABLE} VALUES (0, 'seed')",
        f"CREATE PUBLICATION bench_lat_pub FOR TABLE {TABLE}",
        "SELECT pg_create_logical_replication_slot('lat_recv', 'test_decoding')",
    )
    pipeline = peer.pipeline("klat", TABLE, "lat_cdc", "bench_lat_pub", PREFIX)
    b.cdc("klat_snapshot", "snapshot", pipeline, "--no-progress")
    recv_argv = [str(pg_bin_dir() / "pg_recvlogical"), "--start", "-S", "lat_recv", "-f", "-", "-d", DB]
    recv = subprocess.Popen(recv_argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=b.pg_env())
    recv_seen, topic_seen, stop = Seen(), Seen(), threading.Event()
    threads = [
        threading.Thread(target=read_recvlogical, args=(recv, recv_seen), daemon=True),
        threading.Thread(
            target=read_topic,
            args=(peer.kafka.bootstrap, f"{PREFIX}.public.bench_lat", topic_seen, stop),
            daemon=True,
        ),
    ]
    for t in threads:
        t.start()
    out: dict[str, Any] = {
        "rate": args.rate,
        "seconds": args.seconds,
        "idle_seconds": args.idle_seconds,
        "modes": {},
    }
    first = 1
    try:
        for i, (mode, env) in enumerate(MODES.items()):
            peer.sync_load(f"before cdc stream, {mode}")
            proc = start_stream(b, pipeline, f"klat_stream_{i}", env)
            try:
                warm_up(b, -1 - i, topic_seen)  # the publisher child started and publishing: not timed
                committed = write_paced(b.dsn, first, args.rate, args.seconds)
                first += len(committed)
                ours, missing = latencies_ms(committed, topic_seen)
                floor, floor_missing = latencies_ms(committed, recv_seen, timeout=5)
                time.sleep(5)  # the last cuts published: what follows is idle
                idle = idle_cpu({"cdc stream": proc.pid, "pg_recvlogical": recv.pid}, args.idle_seconds)
                say(f"  {mode}: idle CPU (% of a core over {args.idle_seconds:.0f}s): {idle}")
            finally:
                stop_stream(proc)
            entry = {
                "cdc_stream_kafka": {**stats(ours), "missing": missing, "idle_cpu_pct": idle["cdc stream"]},
                "pg_recvlogical": {
                    **stats(floor),
                    "missing": floor_missing,
                    "idle_cpu_pct": idle["pg_recvlogical"],
                },
            }
            out["modes"][mode] = entry
            say(
                f"  {mode}: cdc stream -> Kafka {entry['cdc_stream_kafka']}; pg_recvlogical {entry['pg_recvlogical']}"
            )
    finally:
        stop.set()
        recv.terminate()
        recv.wait(30)
        for t in threads:
            t.join(10)
    out["pg_recvlogical_cpu_s"] = proc_cpu_s(recv.pid) if recv.poll() is None else None
    b.results["latency"] = out
    b.drop_slots("lat_recv", "lat_cdc")


def report(rep, r: dict[str, Any]) -> None:
    """Rows of the latency part (lower is better) and its summary line."""
    rep.targets["latency"] = (50.0, "target: cdc p99 < 50 ms (issue 37 item 5)")
    lines = []
    for mode, entry in r["modes"].items():
        ours, floor = entry["cdc_stream_kafka"], entry["pg_recvlogical"]
        for who, m, role in (("cdc stream -> Kafka", ours, "cdc"), ("pg_recvlogical", floor, "ceiling")):
            if not m.get("n"):
                continue
            rep.add(
                "latency",
                f"{who}, p99 ({mode})",
                m["p99_ms"],
                "ms",
                role=role,
                less_is_better=True,
                notes=f"p50 {m['p50_ms']} ms, max {m['max_ms']} ms, {m['missing']} missing; idle CPU {m['idle_cpu_pct']}% of a core",
            )
        if ours.get("n"):
            lines.append(
                f"{mode}: cdc p50 {ours['p50_ms']} ms / p99 {ours['p99_ms']} ms (pg_recvlogical beside it: p50 "
                f"{floor.get('p50_ms')} / p99 {floor.get('p99_ms')} ms); idle CPU cdc {ours['idle_cpu_pct']}%, "
                f"pg_recvlogical {floor['idle_cpu_pct']}% of a core"
            )
    rep.summary.append(
        f"latency at {r['rate']} txn/s for {r['seconds']:.0f}s, commit to Kafka: " + "; ".join(lines)
    )
