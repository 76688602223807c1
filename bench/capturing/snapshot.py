"""Part 2: a `--rows`-row table read by `COPY t TO STDOUT` in psql to /dev/null (the ceiling) and by
`cdc snapshot` into a fresh log (`snapshot.mode: exported` with the default workers, then --parallel 1,
2, 4; then a chunked snapshot: `snapshot.mode: chunked` with the default chunk_rows and readers, as many
as the default workers), interleaved per run.
The exported rows name their mode: under `auto` (the default) a table of 1M rows or more is chunked."""

from __future__ import annotations

import shutil
import statistics
import time
from typing import Any

from harness import cdcout
from harness.bench import Bench
from harness.proc import Timed, checked, cpu_note, dir_bytes, medians
from harness.report import fmt_mb
from harness.services import say
from harness.workload import load_table

from pipelines.devservices.postgres import pg_bin_dir

TABLE = "public.bench_snap"
PUBLICATION = "bench_snap_pub"
CONFIGS: tuple[tuple[str, int | None], ...] = (
    ("default", None),
    ("parallel 1", 1),
    ("parallel 2", 2),
    ("parallel 4", 4),
    ("chunked", None),  # snapshot.mode: chunked (snapshot/chunked.py): default readers, short transactions
)


def snapshot(b: Bench) -> None:
    b.load("before part 2")
    say("\n== 2. snapshot ==")
    rows = b.args.rows
    t0 = time.perf_counter()
    load_table(b.sql, TABLE, rows, publication=PUBLICATION)
    heap = int(b.sql("SELECT pg_relation_size(%s)", params=(TABLE,))[0][0])
    say(f"table {TABLE}: {rows:,} rows, heap {fmt_mb(heap)}, loaded in {time.perf_counter() - t0:.1f}s")
    psql = [str(pg_bin_dir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", f"COPY {TABLE} TO STDOUT"]

    def copy(name: str) -> Timed:
        return checked(b.timed(psql, b.pg_env(), name, stdout_null=True), "psql COPY")

    warm = copy("snapshot_copy_warmup")  # reads the table into the cache for everyone after it
    say(f"  psql COPY warm-up: {warm.wall_s:.2f}s")
    copy_runs: list[Timed] = []
    runs: dict[str, list[tuple[Timed, dict[str, int], int]]] = {label: [] for label, _ in CONFIGS}
    for rep in range(1, b.args.repeat + 1):  # interleaved: each repetition runs the ceiling and every config
        c = copy(f"snapshot_copy_{rep}")
        copy_runs.append(c)
        say(
            f"  [{rep}] psql COPY TO STDOUT > /dev/null: {c.wall_s:.2f}s, {rows / c.wall_s:,.0f} rows/s, {cpu_note(c)}"
        )
        for label, parallel in CONFIGS:
            name = f"bench_snap_{'default' if parallel is None else f'p{parallel}'}_{rep}"
            if label == "chunked":
                name = f"bench_snap_chunked_{rep}"
            sections: dict[str, Any] = {"log": b.local_log(name)}
            sections["snapshot"] = {"mode": "chunked" if label == "chunked" else "exported"}
            pipe = b.pipeline(name, [TABLE], slot=name, publication=PUBLICATION, **sections)
            extra = [] if parallel is None else ["--parallel", str(parallel)]
            run = b.cdc(f"snapshot_{name}", "snapshot", pipe, "--no-progress", *extra)
            got = cdcout.snapshot(run.out)
            if got["rows"] != rows:
                say(f"WARNING: cdc snapshot ({label}) copied {got['rows']:,} rows, the table has {rows:,}")
            say(
                f"  [{rep}] cdc snapshot ({label}, {got['workers']} worker(s), {got['chunks']} chunk(s)): {run.wall_s:.2f}s,"
                f" {got['rows'] / run.wall_s:,.0f} rows/s (self-reported {got['rate']:,}), {cpu_note(run)},"
                f" peak RSS {fmt_mb(run.peak_rss_bytes)}"
            )
            runs[label].append((run, got, dir_bytes(b.state(name) / "log")))
            b.drop_slots(name)
            shutil.rmtree(b.state(name), ignore_errors=True)

    copy_m = medians(copy_runs, rows, "rows_per_s")
    summary: dict[str, Any] = {}
    for label, parallel in CONFIGS:
        m = medians([r for r, _, _ in runs[label]], rows, "rows_per_s")
        _, got, log_bytes = runs[label][0]
        summary[label] = {
            **m,
            "parallel": parallel,
            "workers": got["workers"],
            "chunks": got["chunks"],
            "rows": got["rows"],
            "self_reported_rows_per_s": statistics.median(g["rate"] for _, g, _ in runs[label]),
            "ratio": copy_m["wall_s"] / m["wall_s"],
            "log_bytes": log_bytes,
        }
    b.results["snapshot"] = {
        "rows": rows,
        "heap_bytes": heap,
        "copy": {**copy_m, "warmup_s": warm.wall_s},
        "cdc_snapshot": summary,
    }
