"""What a scheduled `cdc apply --once` costs before and after its cut (issue 37 item 6), step by step.

Run from the repo root:  .venv/bin/python bench/apply_start.py [--keys 1000] [--changes 100] [--repeat 3]
                                                                [--json out.json]

One table (`--keys` rows, the 10-column bench shape) snapshotted into one pipeline per variant (each its
own slot, local SQLite log and Delta follower), applied once untimed. Then `--repeat` rounds: one
transaction updates `--changes` rows, each variant streams it into its log (untimed) and runs
`cdc apply --once`, timed from spawn to exit, variants in turn:

* `before`: the session as it was: every jar group on the class path (Delta, Kafka, Iceberg; given
  as the pipeline's `spark.jars`), no class archive (`spark.class_archive: false`), both JIT tiers;
* `jars only`: the jars the pipeline needs (Delta: a local log, a Delta follower), no archive, both
  JIT tiers;
* `both JIT tiers`: those jars and the JVM class archive, with HotSpot's C2 compiler too (shipped
  until the short-lived verbs' C1-only JIT, pipelines/spark.py SHORT_LIVED_JVM_OPTIONS);
* `shipped`: the defaults: those jars, the class archive (made by an untimed first run, whose
  time is reported as `first run`: it writes the archive as its JVM exits) and the C1-only JIT;
* `as tests run it`: shipped plus the rest of the tests' FAST_JVM (tests/fixtures/lake.py: two
  shuffle partitions, no whole-stage or expression code generation);
* `no codegen only`: shipped plus FAST_JVM's code generation settings alone;
* `--variants a,b` runs only those (and `shipped`, whose first run makes the class archive);
* floor: a bare pyspark session (Delta's jars and SQL extension, nothing of cdc, no archive; the
  shuffle and Delta snapshot partitions cdc sets on 2 local cores, without which Delta's 50-task
  snapshot rebuild alone costs more than the MERGE) and one Delta MERGE of `--changes` rows into a
  copy of the follower's table, in a process of its own, with Spark's default JVM (both JIT tiers);
  `floor, C1 JIT` is the same with `-XX:TieredStopAtLevel=1` as cdc's short-lived verbs run, and
  `floor, C1 JIT + archive` with a class archive of its own too (made by an untimed floor run that
  waits for its JVM to write it at exit), as `shipped` runs: the floor of a fresh JVM with both of
  cdc's start-up settings.

Each `cdc` run goes through a wrapper around the real console entry that stamps the moments it
passes (pyspark's launch_gateway called and returned, getOrCreate returned, ApplyJob.run_once
entered and left, the last atexit hook) and runs with `--log-format json`, whose stage lines
give the cut's own steps. Phases: interpreter + imports; pipeline load; JVM launch (Spark's
launcher JVM, then the driver's, up to py4j); SparkSession build (context, jars); state load
(sources, job, log, lock, follower checks, up to the first stage of the cut); the cut (reading and
checking its events, the MERGE, markers, the cut record); report and exit (atexit hooks: the archive
written on a first run). The machine's load is printed: on a shared machine wall seconds are noisy,
the tree's CPU seconds (the JVM and Python workers included) less so.

The class archive lives in the work dir (XDG_CACHE_HOME) so every run starts from none.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from harness.bench import Bench
from harness.main import main
from harness.proc import Timed, checked, run_timed
from harness.report import Report
from harness.services import say
from harness.workload import COLUMNS, row_expr

MASTER = "local[2]"
FAST_JVM = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    "spark.sql.shuffle.partitions": 2,
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
# HotSpot's default (C1 then C2): after cdc's C1-only option on the command line, so it wins
BOTH_TIERS = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4"}
FLOORS = {
    "floor": "-XX:TieredStopAtLevel=4",
    "floor, C1 JIT": "-XX:TieredStopAtLevel=1",
    # the floor with both of cdc's start-up settings: its own class archive (made by an untimed run)
    "floor, C1 JIT + archive": "-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile={archive} -Xlog:cds*=off",
}
FLOOR_ARCHIVE_MAKE = "-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={archive} -Xlog:cds*=off"
MARK = "#marks "
# The real console entry, with the moments it passes stamped (time.time()) and printed at exit.
WRAPPER = f"""
import atexit, json, sys, time
T = {{}}
def mark(key):
    T.setdefault(key, time.time())
atexit.register(lambda: (mark("exit"), sys.stderr.write("\\n{MARK}" + json.dumps(T) + "\\n")))  # runs last
import pyspark.java_gateway as gateway
from pyspark.sql import SparkSession
from pipelines.apply.job import ApplyJob
from pipelines.cli import main
mark("imports")
launch = gateway.launch_gateway
def launch_gateway(*args, **kwargs):
    mark("jvm_launch")
    g = launch(*args, **kwargs)
    mark("jvm_up")
    return g
gateway.launch_gateway = launch_gateway
build = SparkSession.Builder.getOrCreate
def get_or_create(self):
    session = build(self)
    mark("session")
    return session
SparkSession.Builder.getOrCreate = get_or_create
run_once = ApplyJob.run_once
def timed_run_once(self, *args, **kwargs):
    mark("run_once")
    try:
        return run_once(self, *args, **kwargs)
    finally:
        mark("cut_end")
ApplyJob.run_once = timed_run_once
main()
"""
# The floor: nothing of cdc, pyspark's own builder with Delta's jars, one MERGE.
FLOOR = """
import sys, time, json
T = {"start_py": time.time()}
from pyspark.sql import SparkSession
from delta.tables import DeltaTable
T["imports"] = time.time()
jars, target, rows, prepare_from, _n, java_options = sys.argv[1:7]
spark = (SparkSession.builder.master("local[2]").appName("floor").config("spark.jars", jars)
    .config("spark.driver.extraJavaOptions", java_options)
    .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
    .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "8")
    .config("spark.databricks.delta.snapshotPartitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
T["session"] = time.time()
if prepare_from != "-":
    table = spark.read.format("delta").load(prepare_from)
    table.write.format("delta").mode("overwrite").save(target)
    table.limit(int(sys.argv[5])).write.mode("overwrite").parquet(rows)
else:
    (DeltaTable.forPath(spark, target).alias("t").merge(spark.read.parquet(rows).alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
T["merge"] = time.time()
sys.stderr.write("\\n#marks " + json.dumps(T) + "\\n")
if "ArchiveClassesAtExit" in java_options:  # the JVM writes its class archive as it exits: wait for it
    jvm = spark.sparkContext._gateway.proc
    spark.stop()
    spark.sparkContext._gateway.shutdown()
    jvm.stdin.close()  # Spark's gateway server exits when its stdin closes
    jvm.wait(timeout=600)
"""
PHASES = (
    ("interpreter + imports", "spawn", "imports"),
    ("pipeline load", "imports", "jvm_launch"),
    ("JVM launch", "jvm_launch", "jvm_up"),
    ("SparkSession build", "jvm_up", "session"),
    ("state load", "session", "cut_start"),
    ("the cut", "cut_start", "cut_end"),
    ("report + exit", "cut_end", "end"),
)
FLOOR_PHASES = (
    ("interpreter + imports", "spawn", "imports"),
    ("session (JVM + build)", "imports", "session"),
    ("one Delta MERGE", "session", "merge"),
    ("exit", "merge", "end"),
)
STEPS = ("reading and checking", "preparing the follower", "applying offsets", "marker", "recording the cut")


def marks(t: Timed, spawned: float) -> dict[str, float]:
    found = json.loads(t.err.rpartition(MARK)[2].splitlines()[0])
    return {"spawn": spawned, **found, "end": spawned + t.wall_s}


def stage_lines(t: Timed) -> list[dict]:
    out = []
    for text in t.err.splitlines():
        if text.startswith("{"):
            record = json.loads(text)
            if "stage" in record.get("fields", {}):
                out.append(record)
    return out


def cut_start(stages: list[dict]) -> float:
    """The moment the cut's first stage began (a `sink <name>: ...` stage), as time.time()."""
    from datetime import UTC, datetime

    for record in stages:
        if record["fields"]["stage"].startswith("sink ") and record["fields"].get("status") == "started":
            return datetime.strptime(record["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    raise RuntimeError("no stage of the cut in the apply's output")


def cut_steps(stages: list[dict]) -> dict[str, float]:
    seconds = dict.fromkeys(STEPS, 0.0)
    for record in stages:
        f = record["fields"]
        if f.get("status") == "done" and f["stage"].startswith("sink "):
            for step in STEPS:
                if step in f["stage"]:
                    seconds[step] += f["seconds"]
    return seconds


def breakdown(t: Timed, spawned: float, phases: tuple, stages: list[dict] | None = None) -> dict[str, float]:
    m = marks(t, spawned)
    if stages is not None:
        m["cut_start"] = cut_start(stages)
    return {name: m[b] - m[a] for name, a, b in phases}


def body(b: Bench) -> Report:
    keys, changes, repeat = b.args.keys, b.args.changes, b.args.repeat
    b.start_postgres(durable=False)
    b.sql(
        f"CREATE TABLE start_t ({COLUMNS})",
        f"INSERT INTO start_t SELECT {row_expr()} FROM generate_series(1, {keys}) g",
    )
    from pipelines.spark import SPARK_JAR_GROUPS, spark_jars

    every_jar = ",".join(spark_jars(SPARK_JAR_GROUPS))
    variants = {
        "before": {"class_archive": False, "conf": {"spark.jars": every_jar, **BOTH_TIERS}},
        "jars only": {"class_archive": False, "conf": BOTH_TIERS},
        "both JIT tiers": {"conf": BOTH_TIERS},
        "shipped": {},
        "as tests run it": {"conf": FAST_JVM},
        "no codegen only": {"conf": {k: v for k, v in FAST_JVM.items() if "codegen" in k}},
    }
    if b.args.variants:
        unknown = set(b.args.variants) - set(variants)
        assert not unknown, f"unknown variants {sorted(unknown)}; known: {sorted(variants)}"
        variants = {k: v for k, v in variants.items() if k in b.args.variants or k == "shipped"}
    env = b.cdc_env() | {"XDG_CACHE_HOME": str(b.work / "cache"), "CDC_LOG_FORMAT": "json"}
    pipes: dict[str, Path] = {}
    for n, (label, spark) in enumerate(variants.items()):
        name = f"start{n}"
        pipes[label] = b.pipeline(
            name,
            ["public.start_t"],
            slot=f"{name}_slot",
            publication=f"{name}_pub",
            log=b.local_log(name),
            sinks=[{"name": "lake", "delta": {"path": str(b.work / f"lake{n}")}}],
            spark={"master": MASTER, **spark},
        )
        b.cdc(f"{name}_snapshot", "snapshot", pipes[label], "--no-progress", env=env)
    b.warm_bytecode("pipelines.cli", "pipelines.apply.job", "pipelines.spark", "pyspark.sql", "delta.tables")

    def apply(label: str, name: str) -> tuple[Timed, float]:
        spawned = time.time()
        run = b.timed(
            [sys.executable, "-c", WRAPPER, "apply", str(pipes[label]), "--once"], env, name, tree=True
        )
        return checked(run, f"cdc apply ({label})"), spawned

    # untimed bootstrap (the snapshot applied); the shipped variants' first run makes the archive
    first: dict[str, tuple[Timed, float]] = {}
    for label in variants:
        first[label] = apply(label, f"bootstrap-{label.replace(' ', '_')}")
    archives = sorted((b.work / "cache" / "cdc" / "jvm").glob("*.jsa"))
    say(f"class archives made: {[f'{a.name} {a.stat().st_size / 1e6:.0f} MB' for a in archives]}")

    from pipelines.spark import jars_dir

    delta_jars = ",".join(str(p) for p in sorted((jars_dir() / "spark").glob("*.jar")))
    floor_argv = [
        sys.executable,
        "-c",
        FLOOR,
        delta_jars,
        str(b.work / "floor"),
        str(b.work / "rows.parquet"),
    ]
    checked(
        run_timed(
            [
                *floor_argv,
                str(b.work / f"lake{list(variants).index('shipped')}/public/start_t"),
                str(changes),
                FLOORS["floor"],
            ],
            b.cdc_env(),
            b.work,
            "floor-prepare",
        ),
        "floor set-up",
    )

    archive = b.work / "floor-archive.jsa"
    floor_options = {label: options.format(archive=archive) for label, options in FLOORS.items()}
    checked(
        run_timed(
            [*floor_argv, "-", "0", FLOOR_ARCHIVE_MAKE.format(archive=archive)],
            b.cdc_env(),
            b.work,
            "floor-archive",
        ),
        "the floor's class archive",
    )
    say(f"the floor's class archive: {archive.stat().st_size / 1e6:.0f} MB")

    results: dict[str, list[dict]] = {label: [] for label in [*variants, *FLOORS]}
    b.load("before the rounds")
    for i in range(repeat):
        b.sql(f"UPDATE start_t SET qty = qty + 1, updated_at = now() WHERE id <= {changes}")
        for label in variants:
            b.cdc(
                f"r{i}-stream-{label.replace(' ', '_')}",
                "stream",
                pipes[label],
                "--until",
                "current",
                env=env,
            )
        for label in variants:
            run, spawned = apply(label, f"r{i}-apply-{label.replace(' ', '_')}")
            stages = stage_lines(run)
            row = {"wall_s": run.wall_s, "cpu_s": run.tree_cpu_s, **breakdown(run, spawned, PHASES, stages)}
            row |= {f"cut: {k}": v for k, v in cut_steps(stages).items()}
            results[label].append(row)
            say(
                f"[{i}] {label:16} {run.wall_s:6.1f}s wall, {run.tree_cpu_s:5.1f} CPU s  "
                + _phases_text(row, PHASES)
            )
        for label, options in floor_options.items():
            spawned = time.time()
            argv = [*floor_argv, "-", "0", options]
            run = checked(b.timed(argv, b.cdc_env(), f"r{i}-{label.replace(' ', '_')}", tree=True), label)
            row = {"wall_s": run.wall_s, "cpu_s": run.tree_cpu_s, **breakdown(run, spawned, FLOOR_PHASES)}
            results[label].append(row)
            say(
                f"[{i}] {label:16} {run.wall_s:6.1f}s wall, {run.tree_cpu_s:5.1f} CPU s  "
                + _phases_text(row, FLOOR_PHASES)
            )
    b.load("after the rounds")

    rep = Report(
        f"cdc apply --once of a small cut ({changes} changes, one table of {keys} rows) vs a bare session + MERGE",
        ("wall s", "runs", "CPU s", "JVM launch", "session", "the cut"),
    )
    rep.subtitle = f"{repeat} rounds, medians; every variant its own pipeline, slot, log and Delta follower"
    floor_wall = statistics.median(r["wall_s"] for r in results["floor"])
    b.results["rounds"] = results
    b.results["first_runs"] = {k: {"wall_s": t.wall_s, "cpu_s": t.tree_cpu_s} for k, (t, _s) in first.items()}
    b.results["config"].update(keys=keys, changes=changes, repeat=repeat)
    for label, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        phases = FLOOR_PHASES if label in FLOORS else PHASES
        rep.add(
            "apply --once",
            label,
            med["wall_s"],
            "s",
            role="ceiling" if label == "floor" else "diag" if label != "shipped" else "cdc",
            ratio=med["wall_s"] / floor_wall,
            less_is_better=True,
            notes=_phases_text(med, phases),
            wall_s=f"{med['wall_s']:.2f}",
            runs=f"{min(r['wall_s'] for r in rows):.1f}-{max(r['wall_s'] for r in rows):.1f}s",
            CPU_s=f"{med['cpu_s']:.1f}",
            JVM_launch=f"{med.get('JVM launch', 0):.1f}",
            session=f"{med.get('SparkSession build', med.get('session (JVM + build)', 0)):.1f}",
            the_cut=f"{med.get('the cut', med.get('one Delta MERGE', 0)):.1f}",
        )
    t, _ = first["shipped"]
    rep.summary.append(
        f"first run of `shipped` (writes the class archive as its JVM exits): {t.wall_s:.1f}s wall, {t.tree_cpu_s:.1f} CPU s"
    )
    rep.targets["apply --once"] = (10.0, "target 10 s")
    return rep


def _phases_text(row: dict[str, float], phases: tuple) -> str:
    text = ", ".join(f"{name} {row[name]:.1f}" for name, _a, _b in phases if name in row)
    steps = ", ".join(
        f"{k.removeprefix('cut: ')} {v:.1f}" for k, v in row.items() if k.startswith("cut: ") and v
    )
    return text + (f" (cut: {steps})" if steps else "")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--variants",
        type=lambda text: [v.strip() for v in text.split(",") if v.strip()],
        help="only these variants (by label, comma-separated), and shipped",
    )
    sys.exit(main(parser, body, prefix="apply-start"))
