"""The one place that builds a SparkSession: master and confs from the pipeline file, the
Delta (and later Kafka) jars from the folder set-up resolved them into, nothing downloaded."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cdc.ground.errors import CdcError
from cdc.ground.private import private_dir
from pipelines.stages import attach_spark, stage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc.ground.config import Pipeline

REPO = Path(__file__).resolve().parents[1]
SPARK_CONF_DIR = Path(__file__).resolve().parent / "sparkconf"  # log4j2.properties: errors only


def jars_dir() -> Path:
    return Path(os.environ.get("CDC_JARS_DIR", REPO / ".jars"))


SPARK_JAR_GROUPS = ("spark", "spark-kafka")  # Delta; Spark's Kafka source (both resolved by scripts/setup.sh)


def spark_jars(groups: tuple[str, ...] = SPARK_JAR_GROUPS) -> list[str]:
    jars: list[str] = []
    for group in groups:
        folder = jars_dir() / group
        found = sorted(str(p) for p in folder.glob("*.jar"))
        if not found:
            raise CdcError(f"no {group} jars in {folder}", "run scripts/setup.sh (it resolves them from Maven Central once)")
        jars += found
    return jars


def master_cores(master: str) -> int | None:
    """Cores a local master runs tasks on (local[N], local[*], local-cluster[N,C,M]); None otherwise."""
    found = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
    if found:
        threads = found.group(1)
        return 1 if threads is None else (os.cpu_count() or 1) if threads == "*" else int(threads)
    found = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", master)
    return int(found.group(1)) * int(found.group(2)) if found else None


def base_conf(master: str) -> dict[str, str]:
    cores = master_cores(master)
    # Delta rebuilds a table's snapshot (its file list) after every commit with this many tasks,
    # 50 by default: on a few local cores that cost more than the MERGE of a small batch (a 10k-key
    # batch into 100k rows: 5.7 s per batch with 50, 3.2 s with 2 on 2 cores). Clusters keep 50.
    delta_snapshot = {"spark.databricks.delta.snapshotPartitions": str(cores)} if cores else {}
    return delta_snapshot | {
        "spark.master": master,
        "spark.app.name": "cdc-apply",
        "spark.jars": ",".join(spark_jars(tuple(g for g in SPARK_JAR_GROUPS if (jars_dir() / g).exists()) or ("spark",))),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
        # The tables of a cut are applied from several driver threads, a scheduler pool per sink
        # (pipelines/apply/parallel.py): FAIR shares the executors between the sinks' pools.
        "spark.scheduler.mode": "FAIR",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        "spark.databricks.delta.merge.repartitionBeforeWrite.enabled": "true",
        # Loopback only: the driver and executors never listen on the machine's other interfaces.
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }


def warehouse_conf(pipeline: Pipeline | None) -> dict[str, str]:
    """Spark's own files (the SQL warehouse `spark-warehouse/`; Derby's `derby.log`, should Hive
    support ever be on) go under the pipeline's state_dir, not into
    whatever directory `cdc` runs from (cron's $HOME, a project folder). Without a pipeline: a
    per-user folder under the system temp dir."""
    import tempfile

    base = (
        pipeline.state_path.resolve() / "spark"
        if pipeline is not None
        else Path(tempfile.gettempdir()) / f"cdc-spark-{os.getuid()}"
    )
    return {
        "spark.sql.warehouse.dir": str(base / "warehouse"),
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={base / 'derby'}",
    }


def spark_session(pipeline: Pipeline | None = None, master: str | None = None) -> SparkSession:
    """Get (or create) the process's SparkSession. A session that already exists is reused as
    is: one JVM per process, so tests and `cdc run` pay start-up once."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise CdcError("Spark needs a Java runtime and none was found", "install Java 17 (scripts/setup.sh does)")
    # Python workers (executors and the data source planner) must use this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("SPARK_CONF_DIR", str(SPARK_CONF_DIR))
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    conf = base_conf(master or (pipeline.spark.master if pipeline else "local[2]"))
    conf |= warehouse_conf(pipeline)
    if pipeline is not None:  # made owner-only here, or Hadoop would create state_dir 0755 on its way
        private_dir(pipeline.state_path)
    if pipeline is not None:
        conf |= {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in pipeline.spark.conf.items()}
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        with stage(f"starting Spark ({conf['spark.master']})"):
            if not os.environ.get("CDC_DEBUG"):
                _launch_quiet_jvm(conf)
            spark = builder.getOrCreate()
    except Exception as exc:  # JVM failed to start: one line, not a Java stack
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CdcError(f"Spark could not start: {first}", "check Java 17 is installed and spark.master/spark.conf in the pipeline file") from None
    spark.sparkContext.setLogLevel("ERROR")
    _register_sources(spark)
    attach_spark(spark)
    return spark


# What the JVM prints on its stderr at start-up that tells a user nothing: the incubator-module
# warning of Java 17+, log4j's level banner, WARN lines. CDC_DEBUG=1 shows them.
JVM_NOISE = re.compile(
    r"WARNING: |Setting default log level to |To adjust logging level use |For SparkR, use setLogLevel"
    r"|(\d\d/\d\d/\d\d )?\d\d:\d\d:\d\d WARN "
)


def _launch_quiet_jvm(conf: dict[str, str]) -> None:
    """Start Spark's JVM (as getOrCreate would, same confs) with its stderr on a pipe: a thread
    passes each line on to ours but the noise. The Python workers the JVM starts inherit the pipe."""
    import threading

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:  # a JVM is up already (a stopped session's): reused as is
        return
    read_fd, write_fd = os.pipe()
    # forwarding first: what a JVM that fails to start says is passed on too
    threading.Thread(target=_forward_jvm_stderr, args=(read_fd,), name="jvm-stderr", daemon=True).start()
    try:
        gateway = launch_gateway(SparkConf(loadDefaults=False).setAll(list(conf.items())), {"stderr": write_fd})
    finally:
        os.close(write_fd)  # the JVM holds its own copy
    SparkContext._ensure_initialized(gateway=gateway)


def _forward_jvm_stderr(read_fd: int) -> None:
    with os.fdopen(read_fd, "rb") as lines:
        for line in lines:
            if not JVM_NOISE.match(line.decode(errors="replace")):
                os.write(2, line)  # where the JVM wrote before: this process's stderr file


def _register_sources(spark: SparkSession) -> None:
    from pipelines.apply.readers.copyfiles import CopyFileSource
    from pipelines.apply.readers.local import LocalLogSource

    spark.dataSource.register(LocalLogSource)
    spark.dataSource.register(CopyFileSource)
