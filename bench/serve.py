"""Load test of `cdc serve`: N concurrent SSE subscribers of one table while the source writes.

One throwaway PostgreSQL, one pipeline with the local log, `cdc stream` and `cdc serve` running as
they would in production (separate processes). A writer inserts --rate changes/s for --seconds (in
transactions of --txn rows, each row carrying its insert time in microseconds); N subscribers
(asyncio, raw HTTP/1.0 so nothing but the SSE lines is parsed) follow the table from its initial
position; beside them one client reads the log directly (LocalLog, as `cdc log read` does).

Checked: every subscriber's sequence of event ids equals the transactions in the log, exactly
(every event once, in order, none missing). Measured: commit -> client latency (p50/p99) for the
subscribers (every --sample-th parses the rows) and for the direct reader, the server's CPU seconds
and peak RSS. Bounded: it stops by itself after the writes plus --drain seconds.

    .venv/bin/python bench/serve.py [--subscribers 200] [--rate 2000] [--seconds 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson
import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdc.log.local import LocalLog
from pipelines.devservices.postgres import LocalPostgres

TOKEN = "bench-token-0123456789abcdef"
TABLE = "public.ev"


def cdc(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=Path(__file__).resolve().parents[1],
    )


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def proc_stats(pid: int) -> tuple[float, int]:
    """CPU seconds (user+system) and peak RSS bytes of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    hwm = next(
        line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM")
    )
    return cpu, int(hwm.split()[1]) * 1024


class Subscriber:
    def __init__(self, n: int, parse: bool):
        self.n = n
        self.parse = parse
        self.ids: list[int] = []
        self.latencies_ms: list[float] = []
        self.error: str | None = None

    async def run(self, host: str, port: int, position: int, stop: asyncio.Event) -> None:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(
                f"GET /v1/tables/{TABLE}/changes?from={position} HTTP/1.0\r\nHost: {host}\r\n"
                f"Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n\r\n".encode()
            )
            await writer.drain()
            event, ident, data = "", None, b""
            while not stop.is_set():
                line = await reader.readline()
                if not line:
                    self.error = self.error or "the server closed the stream"
                    return
                if line.startswith(b"event:"):
                    event = line[6:].strip().decode()
                elif line.startswith(b"id:"):
                    ident = int(line[3:])
                elif line.startswith(b"data:"):
                    data = line[5:]
                elif not line.strip():  # the end of one event: its fields come in any order
                    if event == "change" and ident is not None:
                        self.ids.append(ident)
                        if self.parse:
                            now_us = time.time() * 1e6
                            self.latencies_ms += [
                                (now_us - c["after"]["ts_us"]) / 1000 for c in orjson.loads(data)["changes"]
                            ]
                    elif event == "control":
                        self.error = f"control event: {data.decode().strip()}"
                        return
                    event, ident, data = "", None, b""
            writer.close()
        except Exception as exc:  # a bench reports, it does not stop at the first client
            self.error = f"{type(exc).__name__}: {exc}"


def direct_reader(log_path: Path, start: int, stop: threading.Event, out: dict) -> None:
    """A client reading the log itself: the latest cut every 10 ms, whole transactions by LSN."""
    log = LocalLog(log_path, readonly=True)
    table = next(t for t in log.tables() if str(t.table) == TABLE).table
    position, txns, lat = start, [], []
    last_lsn = None
    while not stop.is_set():
        cut = log.latest_cut()
        end = cut.tables[table].end if cut else position
        if end > position:
            now_us = time.time() * 1e6
            for rec in log.read(table, position, end):
                if rec.lsn != last_lsn:
                    txns.append(rec.offset)
                    last_lsn = rec.lsn
                else:
                    txns[-1] = rec.offset
                ts_index = rec.schema.column_names.index("ts_us")
                lat.append((now_us - int(rec.values[ts_index])) / 1000)
            position = end
        else:
            time.sleep(0.01)
    out["txns"], out["latencies_ms"] = txns, lat
    log.close()


def writer(dsn: str, rate: int, seconds: float, per_txn: int, stats: dict) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = False
    cur = conn.cursor()
    txn_rate = rate / per_txn
    started = time.monotonic()
    n = 0
    i = 0
    while time.monotonic() - started < seconds:
        due = started + n / txn_rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        cur.execute(
            "INSERT INTO ev (id, payload, ts_us) SELECT g, md5(g::text), (extract(epoch from clock_timestamp()) * 1e6)::bigint"
            " FROM generate_series(%s, %s) g",
            (i, i + per_txn - 1),
        )
        conn.commit()
        i += per_txn
        n += 1
    stats.update(rows=i, txns=n, seconds=time.monotonic() - started)
    conn.close()


async def follow(args, url: str, position: int, log_path: Path, dsn: str, server_pid: int) -> dict:
    host, port = url.removeprefix("http://").split(":")
    stop = asyncio.Event()
    subs = [Subscriber(i, parse=(i % args.sample == 0)) for i in range(args.subscribers)]
    tasks = [asyncio.create_task(s.run(host, int(port), position, stop)) for s in subs]
    await asyncio.sleep(1.0)  # every subscriber connected and joined
    direct: dict = {}
    dstop = threading.Event()
    dthread = threading.Thread(target=direct_reader, args=(log_path, position, dstop, direct), daemon=True)
    dthread.start()
    cpu0, _ = proc_stats(server_pid)
    wstats: dict = {}
    wthread = threading.Thread(
        target=writer, args=(dsn, args.rate, args.seconds, args.txn, wstats), daemon=True
    )
    wthread.start()
    while wthread.is_alive():
        await asyncio.sleep(0.2)
    # wait until the last transaction reached the direct reader, then every subscriber (or --drain)
    deadline = time.monotonic() + args.drain
    last = None
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        ends = direct_ends = None
        cut = LocalLog(log_path, readonly=True)
        try:
            lc = cut.latest_cut()
            ends = lc.tables[next(t for t in lc.tables if str(t) == TABLE)].end
        finally:
            cut.close()
        direct_ends = ends
        if all((s.ids and s.ids[-1] >= direct_ends) or s.error for s in subs):
            last = direct_ends
            break
    cpu1, rss = proc_stats(server_pid)
    stop.set()
    dstop.set()
    dthread.join(timeout=10)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    reference = direct.get("txns", [])
    exact = [s for s in subs if s.ids == reference and not s.error]
    if len(exact) != len(subs):
        bad = next(s for s in subs if s not in exact)
        first = next(
            (i for i, (a, b) in enumerate(zip(bad.ids, reference, strict=False)) if a != b),
            min(len(bad.ids), len(reference)),
        )
        print(
            f"subscriber {bad.n}: {len(bad.ids)} ids, reference {len(reference)}; first difference at {first}: "
            f"{bad.ids[first : first + 3]} vs {reference[first : first + 3]}",
            file=sys.stderr,
        )
    sub_lat = [v for s in subs for v in s.latencies_ms]
    return {
        "subscribers": args.subscribers,
        "rate": args.rate,
        "seconds": args.seconds,
        "rows_written": wstats.get("rows"),
        "transactions": len(reference),
        "all_reached_end": last is not None,
        "exact_subscribers": len(exact),
        "errors": sorted({s.error for s in subs if s.error})[:5],
        "serve_latency_ms": {"p50": pct(sub_lat, 50), "p99": pct(sub_lat, 99), "samples": len(sub_lat)},
        "direct_latency_ms": {
            "p50": pct(direct.get("latencies_ms", []), 50),
            "p99": pct(direct.get("latencies_ms", []), 99),
        },
        "server_cpu_s": cpu1 - cpu0,
        "server_peak_rss_mb": rss / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subscribers", type=int, default=200)
    ap.add_argument("--rate", type=int, default=2000, help="changes per second written at the source")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--txn", type=int, default=10, help="rows per source transaction")
    ap.add_argument("--sample", type=int, default=10, help="every Nth subscriber parses rows for the latency")
    ap.add_argument(
        "--drain", type=float, default=60, help="seconds to wait for the last event after the writes"
    )
    ap.add_argument(
        "--poll", type=float, default=0.02, help="cdc serve --poll: seconds between looks at the log"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-serve-") as work:
        Path(work).chmod(0o755)  # the server runs as the postgres user
        pg = LocalPostgres(Path(work) / "pg")
        pg.start()
        procs: list[subprocess.Popen] = []
        try:
            dsn = pg.dsn()
            with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                cur.execute("CREATE TABLE ev (id bigint PRIMARY KEY, payload text, ts_us bigint)")
            state = Path(work) / "state"
            file = Path(work) / "bench.yml"
            file.write_text(
                json.dumps(
                    {
                        "name": "bench",
                        "source": {"postgres": {"dsn": dsn, "tables": [TABLE]}},
                        "state_dir": str(state),
                    }
                )
            )
            snap = subprocess.run(
                [sys.executable, "-m", "pipelines.cli", "snapshot", str(file), "--no-progress"],
                capture_output=True,
                text=True,
            )
            if snap.returncode:
                raise SystemExit(f"snapshot failed: {snap.stderr}")
            procs.append(cdc("stream", str(file)))
            server = cdc(
                "serve",
                str(file),
                "--port",
                "0",
                "--client-queue",
                "1024",
                "--poll",
                str(args.poll),
                env={"CDC_SERVE_TOKENS": f"{TOKEN}=*"},
            )
            procs.append(server)
            assert server.stdout is not None
            line = server.stdout.readline()
            m = re.search(r"at (http://\S+)/v1/tables", line)
            if m is None:
                raise SystemExit(
                    f"cdc serve did not start: {line}{server.stderr.read() if server.stderr else ''}"
                )
            url = m.group(1)
            for _ in range(100):
                try:
                    body = httpx.get(
                        f"{url}/v1/tables/{TABLE}",
                        headers={"Authorization": f"Bearer {TOKEN}"},
                        params={"limit": 1},
                    ).json()
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            result = asyncio.run(follow(args, url, body["position"], state / "log", dsn, server.pid))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
            pg.stop()
    print(
        f"{result['subscribers']} SSE subscribers, {result['rows_written']} rows in {result['transactions']} transactions "
        f"({args.rate}/s for {args.seconds:.0f}s): {result['exact_subscribers']}/{result['subscribers']} saw every event "
        f"exactly once and in order"
    )
    s, d = result["serve_latency_ms"], result["direct_latency_ms"]
    print(
        f"  commit -> client via cdc serve: p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms ({s['samples']} samples)"
    )
    print(f"  commit -> client reading the log: p50 {d['p50']:.1f} ms, p99 {d['p99']:.1f} ms")
    print(f"  cdc serve: {result['server_cpu_s']:.1f} CPU s, peak RSS {result['server_peak_rss_mb']:.0f} MiB")
    if result["errors"]:
        print(f"  errors: {result['errors']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if result["exact_subscribers"] != result["subscribers"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
