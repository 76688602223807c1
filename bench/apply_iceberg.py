"""Apply into Iceberg: the Iceberg follower in both write modes, side by side in one run with the
Delta follower and a bare MERGE of the same rows (the floor).

Run from the repo root:  .venv/bin/python bench/apply_iceberg.py [--keys 100000] [--changes 100000]
                                                                 [--cut-changes 1000] [--cuts 3] [--json out.json]

One pipeline, one 10-column table (bench/apply.py's) of `--keys` rows, three followers: `lake`
(Delta), `mor` (Iceberg, `write_mode: merge-on-read`) and `cow` (Iceberg, `copy-on-write`), each
on its own warehouse (SQLite catalog). Everything applies in this process on one SparkSession
(`local[2]`, JVM start-up not counted), each follower on its own (`cdc apply --once --sink S`).

1. Bootstrap (diagnostic): the snapshot applied to each follower, timed; then the floor tables
   are copied from the followers (one per format and write mode, same rows and properties).
2. Throughput: `--changes` updates over the keys (1000-row transactions) streamed into the log
   as one cut, applied to each follower: changes/s. The floor: one bare MERGE (match on id,
   update every column, insert the rest) of the cut's netted rows, read from Parquet, into the
   floor table of the same format and write mode; no log, no checks, no markers or cut records.
3. One cut: `--cuts` cuts of `--cut-changes` updates (one transaction each), each applied to
   every follower, timed; the median. The floor: a bare MERGE of as many random keys (update
   `ver`) into each floor table, the median of `--cuts`.
4. Reads, after the cuts (what merge-on-read costs readers, and whether they read it right): each
   Iceberg table read whole by pyiceberg and by Polars (`scan_iceberg`, planned by pyiceberg), the
   Delta table by delta-rs, timed; every reader's rows compared with PostgreSQL's (id, ver, qty,
   price), and each Iceberg table's data files and position-delete files counted.

It starts its own PostgreSQL (bench/harness) and removes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from apply import SEED, TABLE, bare_merge_keys, write_changes
from harness.bench import Bench
from harness.inproc import MASTER, apply_job
from harness.main import main
from harness.report import Report
from harness.services import say

SINKS = [
    {"name": "lake", "delta": {"path": "lake"}},
    {"name": "mor", "iceberg": {"warehouse": "ice-mor", "write_mode": "merge-on-read"}},
    {"name": "cow", "iceberg": {"warehouse": "ice-cow", "write_mode": "copy-on-write"}},
]
NAMES = {"lake": "Delta", "mor": "Iceberg merge-on-read", "cow": "Iceberg copy-on-write"}
ICEBERG = ("mor", "cow")


def make_floors(b: Bench, spark) -> dict[str, str]:
    """A copy of each follower table (rows, format, write mode): what the bare MERGEs go into."""
    idents = {}
    for sink in ("lake", *ICEBERG):
        if sink == "lake":
            path = str(b.work / "floor-lake")
            spark.read.format("delta").load(str(b.work / "lake/public/bench")).write.format("delta").save(
                path
            )
            idents[sink] = f"delta.`{path}`"
            continue
        mode = next(s["iceberg"]["write_mode"] for s in SINKS if s["name"] == sink)
        props = ", ".join(
            f"'{k}' = '{v}'"
            for k, v in {
                "format-version": "2",
                "write.merge.mode": mode,
                "write.update.mode": mode,
                "write.delete.mode": mode,
            }.items()
        )
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {sink}.floor")
        spark.sql(
            f"CREATE TABLE {sink}.floor.bench USING iceberg TBLPROPERTIES ({props}) "
            f"AS SELECT * FROM {sink}.public.bench"
        )
        idents[sink] = f"{sink}.floor.bench"
    return idents


def timed_apply(job, sink: str) -> float:
    t0 = time.monotonic()
    (run,) = job.run_once(sink)
    took = time.monotonic() - t0
    assert run.error is None and not run.up_to_date, (sink, run.error, run.up_to_date)
    return took


def bare_merge_all(spark, target: str, parquet: str) -> float:
    """MERGE the netted rows (every column) into `target`: the floor under the big cut."""
    spark.read.parquet(parquet).createOrReplaceTempView("_bench_net")
    t0 = time.monotonic()
    spark.sql(
        f"MERGE INTO {target} t USING _bench_net s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )
    return time.monotonic() - t0


def source_rows(b: Bench) -> dict[int, tuple]:
    return {r[0]: (r[1], r[2], r[3]) for r in b.sql("SELECT id, ver, qty, price FROM bench")}


def _rows(columns: dict[str, list]) -> dict[int, tuple]:
    return {
        i: (v, q, Decimal(p) if p is not None else None)
        for i, v, q, p in zip(columns["id"], columns["ver"], columns["qty"], columns["price"], strict=True)
    }


def reads(b: Bench, pipe: Path) -> dict[str, Any]:
    """Each follower read whole by readers nobody here wrote, timed and compared with the source."""
    import polars as pl
    from deltalake import DeltaTable

    from sinks.iceberg.catalog import pyiceberg_catalog
    from sinks.registry import load_pipeline

    pipeline = load_pipeline(pipe)
    want = source_rows(b)
    out: dict[str, Any] = {}
    columns = ["id", "ver", "qty", "price"]
    t0 = time.monotonic()
    delta = DeltaTable(str(b.work / "lake/public/bench")).to_pyarrow_table(columns=columns)
    out["lake"] = {
        "delta-rs_s": round(time.monotonic() - t0, 2),
        "delta-rs_equal": _rows(delta.to_pydict()) == want,
    }
    for sink in ICEBERG:
        cfg = next(s for s in pipeline.sinks if s.name == sink)
        table = pyiceberg_catalog(cfg, pipeline).load_table("public.bench")
        t0 = time.monotonic()
        arrow = table.scan(selected_fields=tuple(columns)).to_arrow()
        py_s = time.monotonic() - t0
        t0 = time.monotonic()
        frame = pl.scan_iceberg(table).select(columns).collect()
        pl_s = time.monotonic() - t0
        summary = table.current_snapshot().summary
        out[sink] = {
            "pyiceberg_s": round(py_s, 2),
            "pyiceberg_equal": _rows(arrow.to_pydict()) == want,
            "polars_s": round(pl_s, 2),
            "polars_equal": _rows(frame.to_dict(as_series=False)) == want,
            "data_files": int(summary.get("total-data-files", 0)),
            "delete_files": int(summary.get("total-delete-files", 0)),
            "position_deletes": int(summary.get("total-position-deletes", 0)),
        }
    return out


def body(b: Bench) -> Report:
    import os

    os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")  # as `cdc sql` plans Polars' scans
    args = b.args
    b.results["config"].update(
        keys=args.keys, changes=args.changes, cut_changes=args.cut_changes, cuts=args.cuts
    )
    b.start_postgres(durable=True)
    b.sql(TABLE, SEED % {"keys": args.keys})
    pipe = b.pipeline("benchice", ["public.bench"], sinks=SINKS, spark={"master": MASTER})
    b.cdc("ice_snapshot", "snapshot", pipe, "--no-progress")
    spark, job = apply_job(pipe)
    res: dict[str, Any] = {
        "bootstrap_s": {},
        "cut_s": {},
        "floor_s": {},
        "small_cut_s": {},
        "small_floor_s": {},
    }
    b.load("before the bootstrap")
    for sink in NAMES:
        res["bootstrap_s"][sink] = round(timed_apply(job, sink), 2)
        say(f"bootstrap {NAMES[sink]}: {args.keys:,} rows in {res['bootstrap_s'][sink]}s")
    floors = make_floors(b, spark)

    # 2. the big cut
    written = write_changes(b.dsn, args.keys, args.changes)
    b.cdc("ice_stream", "stream", pipe, "--until", "current")
    b.load("before the big cut")
    for sink in NAMES:
        res["cut_s"][sink] = round(timed_apply(job, sink), 2)
        say(f"cut of {written:,} changes, {NAMES[sink]}: {res['cut_s'][sink]}s")
    parquet = str(b.work / "net.parquet")
    spark.sql("SELECT * FROM mor.public.bench WHERE ver > 0").write.mode("overwrite").parquet(parquet)
    net = spark.read.parquet(parquet).count()
    for sink in NAMES:
        res["floor_s"][sink] = round(bare_merge_all(spark, floors[sink], parquet), 2)
        say(f"floor: bare MERGE of the {net:,} netted rows into {NAMES[sink]}: {res['floor_s'][sink]}s")
    res.update(changes=written, net_rows=net)

    # 3. small cuts
    b.load("before the small cuts")
    small: dict[str, list[float]] = {s: [] for s in NAMES}
    floor_small: dict[str, list[float]] = {s: [] for s in NAMES}
    for i in range(args.cuts):
        write_changes(b.dsn, args.keys, args.cut_changes, per_txn=args.cut_changes)
        b.cdc(f"ice_stream_{i}", "stream", pipe, "--until", "current")
        for sink in NAMES:
            small[sink].append(timed_apply(job, sink))
        for sink in NAMES:
            floor_small[sink].append(bare_merge_keys(spark, floors[sink], args.keys, args.cut_changes, i + 1))
    for sink in NAMES:
        res["small_cut_s"][sink] = round(statistics.median(small[sink]), 2)
        res["small_floor_s"][sink] = round(statistics.median(floor_small[sink]), 2)
        say(
            f"one cut of {args.cut_changes:,} changes, {NAMES[sink]}: median {res['small_cut_s'][sink]}s "
            f"({', '.join(f'{t:.2f}' for t in small[sink])}); floor {res['small_floor_s'][sink]}s"
        )

    # 4. reads
    b.load("before the reads")
    res["reads"] = reads(b, pipe)
    for sink, r in res["reads"].items():
        say(f"reads {NAMES[sink]}: {r}")
    b.results["iceberg"] = res

    rep = Report("Apply into Iceberg and Delta (bench/apply_iceberg.py)", ("seconds",))
    rep.subtitle = f"{args.keys:,} keys; a cut of {written:,} changes ({net:,} keys); {args.cuts} cuts of {args.cut_changes:,}"
    for sink, name in NAMES.items():
        rep.add(
            "throughput",
            f"cdc apply, {name}",
            written / res["cut_s"][sink],
            "changes/s",
            ratio=res["floor_s"][sink] / res["cut_s"][sink],
            seconds=f"{res['cut_s'][sink]:.2f}",
            notes="ratio: the floor's time / this",
        )
        rep.add(
            "throughput",
            f"bare MERGE of the netted rows, {name}",
            written / res["floor_s"][sink],
            "changes/s",
            role="ceiling",
            ratio=1.0,
            seconds=f"{res['floor_s'][sink]:.2f}",
            notes="the cut's changes / the MERGE's time",
        )
    for sink, name in NAMES.items():
        rep.add(
            "one cut",
            f"cdc apply, {name}",
            res["small_cut_s"][sink],
            "s",
            less_is_better=True,
            ratio=res["small_cut_s"][sink] / res["small_floor_s"][sink],
            seconds=f"{res['small_cut_s'][sink]:.2f}",
            notes=f"median of {args.cuts}; ratio: x the floor",
        )
        rep.add(
            "one cut",
            f"bare MERGE of as many keys, {name}",
            res["small_floor_s"][sink],
            "s",
            role="ceiling",
            less_is_better=True,
            seconds=f"{res['small_floor_s'][sink]:.2f}",
        )
    for sink, r in res["reads"].items():
        readers = ("delta-rs",) if sink == "lake" else ("pyiceberg", "polars")
        for reader in readers:
            files = (
                "" if sink == "lake" else f"; {r['data_files']} data files, {r['delete_files']} delete files"
            )
            rep.add(
                "reads",
                f"{reader} reads {NAMES[sink]}",
                r[f"{reader}_s"],
                "s",
                role="diag",
                less_is_better=True,
                seconds=f"{r[f'{reader}_s']:.2f}",
                notes=("equal to the source" if r[f"{reader}_equal"] else "DIFFERENT from the source")
                + files,
            )
    bad = [
        f"{reader} {sink}"
        for sink, r in res["reads"].items()
        for reader in r
        if reader.endswith("_equal") and not r[reader]
    ]
    if bad:
        rep.summary.append(f"readers that differ from the source: {', '.join(bad)}")
    return rep


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--changes", type=int, default=100_000, help="updates in the throughput cut")
    ap.add_argument("--cut-changes", type=int, default=1000, help="updates in each small cut")
    ap.add_argument("--cuts", type=int, default=3, help="small cuts timed (the median is reported)")
    return ap


if __name__ == "__main__":
    sys.exit(main(parser(), body, prefix="apply-iceberg"))
