"""The read-only verbs' wall time, each as a user runs it (a `cdc` process of its own), the old path
(Spark, forced) side by side with the JVM-free one on the same pipeline (issue 33 item 6).

Run from the repo root:  .venv/bin/python bench/verbs.py [--orders 100000] [--repeat 3] [--json out.json]

Set-up (not timed): its own PostgreSQL (bench/harness) with customers (orders/10 rows) and orders,
a pipeline with a Delta follower `lake` and one derived view, `cdc snapshot`, `cdc apply --once`
(timed and reported, for scale: that verb keeps Spark). Then each verb `--repeat` times (median):

* `cdc sql` (a join and an aggregate over both tables at the latest cut): `--engine spark` (the
  path before: a Spark driver JVM per call) and the default (DataFusion, no JVM);
* `cdc validate` (with the view);
* `cdc status --json`, `cdc wait --lsn <the applied cut>`, `cdc log read --limit 100`.

Each run reports whether the process started a Spark driver JVM (pyspark's gateway exists at exit)
and whether it imported pyspark at all. The 1-minute load average is printed: on a shared machine figures are noisy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from harness.proc import checked, run_timed
from harness.services import DB, load_check, postgres, say

from cdc.ground.lsn import format_lsn
from cdc.session import run_sql
from sinks.delta.cuts import cut_record_arrow

MARK = "#bench exit: "
# the real console entry plus an exit hook that says whether a Spark driver JVM was started (pyspark's
# gateway exists) and whether pyspark was imported at all
RUN = (
    "import atexit, sys\n"
    "def _mark():\n"
    "    ctx = sys.modules.get('pyspark.context')\n"
    "    jvm = ctx is not None and ctx.SparkContext._gateway is not None\n"
    f"    sys.stderr.write('\\n{MARK}' + f\"jvm={{jvm}} pyspark={{'pyspark' in sys.modules}}\\n\")\n"
    "atexit.register(_mark)\n"
    "from pipelines.cli import main\n"
    "main()\n"
)
SETUP = """
CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, city text);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL, status text NOT NULL,
                     total numeric(12,2));
INSERT INTO customers SELECT g, 'customer ' || g, 'city ' || mod(g, 50) FROM generate_series(1, {customers}) g;
INSERT INTO orders SELECT g, 1 + mod(g * 7919, {customers}), (ARRAY['new','paid','shipped'])[1 + mod(g, 3)],
    (mod(g * 31, 100000) / 100.0)::numeric(12,2) FROM generate_series(1, {orders}) g;
"""
QUERY = (
    "SELECT c.city, count(*) AS orders, sum(o.total) AS revenue FROM public.orders o "
    "JOIN public.customers c ON c.id = o.customer_id GROUP BY c.city ORDER BY revenue DESC LIMIT 5"
)


def cdc(args: list[str], work: Path, name: str) -> tuple[float, bool, bool, str]:
    """(wall seconds, JVM started?, pyspark imported?, stdout) of one `cdc ARGS` process."""
    t = checked(run_timed([sys.executable, "-c", RUN, *args], dict(os.environ), work, name), name)
    return t.wall_s, MARK + "jvm=True" in t.err, "pyspark=True" in t.err.rpartition(MARK)[2], t.out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the figures here")
    opts = ap.parse_args()
    loads: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cdc-bench-verbs-")))
        os.chmod(work, 0o755)  # the PostgreSQL server runs as `postgres` and must reach its data dir
        pg, _version = postgres(stack, work, durable=False)
        dsn = pg.dsn(DB)
        run_sql(dsn, SETUP.format(orders=opts.orders, customers=max(1, opts.orders // 10)))
        pipe = work / "verbs.yml"
        pipe.write_text(
            yaml.safe_dump(
                {
                    "name": "verbs",
                    "source": {"postgres": {"dsn": dsn, "tables": ["public.customers", "public.orders"]}},
                    "state_dir": str(work / "state"),
                    "sinks": [{"name": "lake", "delta": {"path": str(work / "lake")}}],
                    "views": [
                        {
                            "name": "city_orders",
                            "sql": "SELECT o.id, o.total, c.city FROM public.orders o JOIN public.customers c ON c.id = o.customer_id",
                            "key": ["id"],
                        }
                    ],
                    "spark": {"master": "local[2]"},
                },
                sort_keys=False,
            )
        )
        p = str(pipe)
        cdc(["snapshot", p], work, "snapshot")
        load_check(loads, "before the apply")
        apply_s, _, _, _ = cdc(["apply", p, "--once"], work, "apply")
        say(f"cdc apply --once (set-up, Spark): {apply_s:.1f}s")
        lsn = format_lsn(cut_record_arrow(work / "lake").lsn)  # the applied cut: `wait` returns at once
        verbs: dict[str, list[str]] = {
            "sql --engine spark (before)": ["sql", p, "--engine", "spark", QUERY],
            "sql (DataFusion)": ["sql", p, QUERY],
            "validate --spark-views (before)": ["validate", p, "--spark-views"],
            "validate (view)": ["validate", p],
            "status --json": ["status", p, "--json"],
            "wait --lsn": ["wait", p, "--lsn", lsn, "--timeout", "30"],
            "log read --limit 100": ["log", "read", p, "--limit", "100"],
        }
        results: dict[str, dict] = {}
        load_check(loads, "before the verbs")
        outputs: dict[str, str] = {}
        for i in range(opts.repeat):  # interleaved: each round runs every verb once
            for n, (label, args) in enumerate(verbs.items()):
                wall, jvm, pyspark, out = cdc(args, work, f"round{i}-verb{n}")
                r = results.setdefault(label, {"wall_s": [], "jvm": False, "pyspark_imported": False})
                r["wall_s"].append(round(wall, 2))
                r["jvm"] = r["jvm"] or jvm
                r["pyspark_imported"] = r["pyspark_imported"] or pyspark
                outputs.setdefault(label, out)
        load_check(loads, "after the verbs")
    assert outputs["sql --engine spark (before)"] == outputs["sql (DataFusion)"], outputs  # same answer
    say(f"\n{'verb':32} {'median s':>9}  {'runs (s)':24} JVM    pyspark imported")
    for label, r in results.items():
        r["median_s"] = statistics.median(r["wall_s"])
        say(f"{label:32} {r['median_s']:9.2f}  {r['wall_s']!s:24} {r['jvm']!s:6} {r['pyspark_imported']}")
    say(f"load averages: {loads}; {os.cpu_count()} CPUs; orders {opts.orders}")
    if opts.json:
        doc = {
            "orders": opts.orders,
            "apply_once_s": round(apply_s, 2),
            "verbs": results,
            "load": loads,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cpus": os.cpu_count(),
        }
        opts.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
