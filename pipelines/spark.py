"""The one place that builds a SparkSession: master and confs from the pipeline file, the
Delta (and later Kafka) jars from the folder set-up resolved them into, nothing downloaded."""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cdc.ground.errors import CdcError, EngineSettingError
from cdc.ground.executor_secrets import executor_secrets
from cdc.ground.private import private_dir
from cdc.ground.secrets import redact_with
from pipelines.stages import attach_spark, stage
from sinks.executor_env import keep_out_of_tasks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc.ground.config import Pipeline
    from pipelines.jvmarchive import Archive

REPO = Path(__file__).resolve().parents[1]
SPARK_CONF_DIR = Path(__file__).resolve().parent / "sparkconf"  # log4j2.properties: errors only
LOG4J_FILE = "log4j2.properties"


def jars_dir() -> Path:
    return Path(os.environ.get("CDC_JARS_DIR", REPO / ".jars"))


# Delta; Spark's Kafka source; Iceberg's Spark runtime and its JDBC catalog drivers (all resolved by
# scripts/setup.sh). On the class path only: Iceberg's catalog and SQL extensions are set per pipeline.
SPARK_JAR_GROUPS = ("spark", "spark-kafka", "iceberg")


def pipeline_jar_groups(pipeline: Pipeline | None) -> tuple[str, ...]:
    """The jar groups a pipeline's session needs: Delta always (the session's catalog), Kafka's source
    for a Kafka log, Iceberg's runtime for an Iceberg follower. Each group left out is a JVM that
    opens and indexes fewer jars at start (Iceberg's runtime alone is 50 MB). Without a pipeline
    (a test session, `cdc validate`): every group."""
    if pipeline is None:
        return SPARK_JAR_GROUPS
    wanted = {"spark"}
    if pipeline.log_config.kafka is not None:
        wanted.add("spark-kafka")
    if any(sink.kind == "iceberg" for sink in pipeline.sinks):
        wanted.add("iceberg")
    return tuple(g for g in SPARK_JAR_GROUPS if g in wanted)


def spark_jars(groups: tuple[str, ...] = SPARK_JAR_GROUPS) -> list[str]:
    jars: list[str] = []
    for group in groups:
        folder = jars_dir() / group
        found = sorted(str(p) for p in folder.glob("*.jar"))
        if not found:
            raise CdcError(
                f"no {group} jars in {folder}",
                "run scripts/setup.sh (it resolves them from Maven Central once)",
            )
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


# HotSpot shrinks its code cache from 240 to 48 MB when the JIT stops at C1 (a pipeline's
# `-XX:TieredStopAtLevel=1`, a common start-up trick). A busy `cdc run` fills 48 MB within minutes;
# Spark's scheduler threads then die on "Out of space in CodeCache" and every later job hangs (the
# crash campaign found it). Ours keeps the default size whatever the tier; a pipeline's own
# -XX:ReservedCodeCacheSize comes after it and wins.
# -XX:+ExitOnOutOfMemoryError: a JVM out of heap ends at once (exit code 3). Without it, Spark's
# threads die one by one on OutOfMemoryError and the apply fails later on unrelated-looking errors
# ("stopped SparkContext"); now the job names the cause (pipelines/apply/job.py check_driver).
JVM_OPTIONS = "-XX:ReservedCodeCacheSize=240m -XX:+ExitOnOutOfMemoryError"
# A short-lived verb's driver (`apply --once`, verify, sql, maintain) stops its JIT at C1: C2's
# compilations take a core for most of a JVM's first minute and pay off only in code that runs
# for minutes. A small `apply --once`: 22.9 s and 39 CPU s with both tiers, 16.0 s and 20.5 CPU s
# with C1 alone; a cut of 1M changes into 100k rows took 30 s either way (bench/apply_start.py,
# bench/apply.py --only throughput). Long-running verbs keep both tiers. A pipeline's own
# -XX:TieredStopAtLevel comes after this one and wins.
SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
JVM_OUT_OF_MEMORY_EXIT = 3  # HotSpot's exit code under -XX:+ExitOnOutOfMemoryError


def driver_jvm_exit(spark: SparkSession, wait_s: float = 1.0) -> int | None:
    """The exit code of the driver JVM this process launched, once it has ended (waiting up to
    `wait_s` for one that is going: its socket closes just before it is gone); None while it runs,
    or when this process did not launch it (spark-submit launches Python from the JVM)."""
    return _context_exit(spark.sparkContext, wait_s)


def _context_exit(context, wait_s: float) -> int | None:
    import subprocess

    proc = getattr(getattr(context, "_gateway", None), "proc", None)
    if proc is None:
        return None
    try:
        context._jvm.java.lang.System.nanoTime()  # answers: alive, no need to wait
        return None
    except Exception:  # py4j's connection is gone: the JVM is exiting or has exited
        pass
    try:
        code = proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return None
    # py4j's finalizer thread would go on sending "forget this object" to the dead JVM
    client = getattr(context._gateway, "_gateway_client", None)
    if client is not None:
        client.is_connected = False
    return code


class _Py4jNetworkNoise(logging.Filter):
    """py4j logs each command that fails on a closed connection on the root logger, with a
    traceback (an object freed by its finalizer thread after the driver JVM has died, too). The
    caller still gets the exception, and a verb reports it (pipelines/cli/failures.py): the
    traceback would only bury that message. CDC_DEBUG=1 keeps it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Exception while sending command")


def _quiet_py4j_network_errors() -> None:
    root = logging.getLogger()
    if not os.environ.get("CDC_DEBUG") and not any(isinstance(f, _Py4jNetworkNoise) for f in root.filters):
        root.addFilter(_Py4jNetworkNoise())


def _end_jvm_for_archive(spark: SparkSession, archive: Archive, jvm: subprocess.Popen | None) -> None:
    """At exit: the JVM writes its class archive as it exits, so end it and wait (archive.finish).
    pyspark's accumulator server still holds a connection from that JVM: its handler would print
    an EOFError traceback when the JVM goes, so it is told to expect the end first."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None:
        server.server_shutdown = True
        server.handle_error = lambda request, address: None
    archive.finish(jvm)


_driver_memory: str | None = None  # spark.driver.memory of the session this process launched


class DriverExited(CdcError):
    """Spark's driver JVM this process launched has exited: said once, by whoever saw it first."""


def driver_exit_error(code: int, memory: str | None, kept: str) -> DriverExited:
    """The error for a driver JVM that exited with `code`: the heap named when it ran out of it."""
    if code == JVM_OUT_OF_MEMORY_EXIT:
        return DriverExited(
            "Spark's driver JVM ran out of heap (java.lang.OutOfMemoryError) and exited; "
            f"spark.driver.memory is {memory or '1g (Spark default)'}",
            "give the driver more heap in the pipeline file, e.g. `spark: {conf: {spark.driver.memory: 4g}}`, "
            f'and run again{f" ({kept})" if kept else ""}; docs/run-continuously.md, "Driver memory"',
        )
    return DriverExited(
        f"Spark's driver JVM exited with code {code}",
        f"its output above says why; run again{f' ({kept})' if kept else ''}",
    )


def exited_driver_error() -> DriverExited | None:
    """For any verb, after a failure: the error naming why, when the driver JVM this process
    launched has exited (else its py4j errors would be all the user sees); None otherwise."""
    if "pyspark" not in sys.modules:
        return None
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return None
    code = _context_exit(context, wait_s=1.0)
    return None if code is None else driver_exit_error(code, _driver_memory, "")


def base_conf(master: str, groups: tuple[str, ...] = SPARK_JAR_GROUPS) -> dict[str, str]:
    cores = master_cores(master)
    # Delta rebuilds a table's snapshot (its file list) after every commit with this many tasks,
    # 50 by default: on a few local cores that cost more than the MERGE of a small batch (a 10k-key
    # batch into 100k rows: 5.7 s per batch with 50, 3.2 s with 2 on 2 cores). Clusters keep 50.
    delta_snapshot = {"spark.databricks.delta.snapshotPartitions": str(cores)} if cores else {}
    return (
        delta_snapshot
        | _jars_conf(groups)
        | {
            "spark.master": master,
            "spark.app.name": "cdc-apply",
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            "spark.sql.session.timeZone": "UTC",
            # Parquet INT64 microseconds, as Delta's other writers and readers use: Spark's default
            # INT96 is read as nanoseconds by delta-rs and DataFusion, so a timestamp outside
            # 1677-2262 wrapped around there (sinks/delta/rswrite.py reads a table only if so made)
            "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
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
            "spark.driver.extraJavaOptions": JVM_OPTIONS,
            "spark.executor.extraJavaOptions": JVM_OPTIONS,
        }
    )


def _jars_conf(wanted: tuple[str, ...]) -> dict[str, str]:
    """Ours from .jars/; under spark-submit its --jars are the jars (and this code may then run
    from the shipped zip, far from .jars/)."""
    if under_spark_submit():
        return {}
    groups = tuple(g for g in wanted if (jars_dir() / g).exists()) or ("spark",)
    return {"spark.jars": ",".join(spark_jars(groups))}


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


# JVM options are one string each: the pipeline's are added after ours (a later -D wins), not in place.
JOINED_CONF = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")


def with_user_conf(conf: dict[str, str], user: Mapping[str, object]) -> dict[str, str]:
    """`conf` with the pipeline's `spark.conf` over it; JOINED_CONF values are joined, so that a
    user's `-XX:` flag does not drop cdc's own `-Dderby.system.home`."""
    merged = dict(conf)
    for key, value in user.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        merged[key] = f"{conf[key]} {text}" if key in JOINED_CONF and conf.get(key) else text
    return merged


def security_conf(pipeline: Pipeline | None) -> dict[str, str]:
    """spark.secret: authentication with the cluster and (spark.encrypt, on by default) encrypted RPC
    and local shuffle/spill files. Local masters make up a secret of their own when none is given."""
    if pipeline is None or not pipeline.spark.secret:
        return {}
    conf = {"spark.authenticate": "true", "spark.authenticate.secret": pipeline.spark.secret}
    if pipeline.spark.encrypt:
        conf |= {"spark.network.crypto.enabled": "true", "spark.io.encryption.enabled": "true"}
    return conf


def executor_env_conf(pipeline: Pipeline | None, master: str) -> dict[str, str]:
    """The sinks' secrets as spark.executorEnv.CDC_SECRET_<SINK>_<FIELD> on a cluster with
    `spark.executor_secrets: conf` (docs/cluster.md): each executor gets them in
    its environment at launch; task functions carry only the names. Local masters need none (the
    sinks hand them to this machine's Python workers), nor does `workers` (their own environment)."""
    if pipeline is None or master.startswith("local") or pipeline.spark.executor_secrets != "conf":
        return {}
    return {f"spark.executorEnv.{var}": value for var, value in executor_secrets(pipeline).items()}


# Confs never put on the JVM's command line (`ps` shows it to every local user): set over py4j.
SECRET_CONF = re.compile(r"secret|password|token", re.I)


def under_spark_submit() -> bool:
    """Run by spark-submit (or the pyspark shell): the JVM is up and its conf was given there."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def session_conf(pipeline: Pipeline | None, master: str | None, c1_jit: bool) -> dict[str, str]:
    """cdc's confs, then the pipeline's `spark.conf` over them (JVM options joined after ours)."""
    conf = base_conf(
        master or (pipeline.spark.master if pipeline else "local[2]"), pipeline_jar_groups(pipeline)
    )
    conf = with_user_conf(conf, warehouse_conf(pipeline))  # joins the driver's JVM options
    if c1_jit:
        conf = with_user_conf(conf, {"spark.driver.extraJavaOptions": SHORT_LIVED_JVM_OPTIONS})
    if pipeline is not None:
        conf = with_user_conf(conf, pipeline.spark.conf)
    return conf | security_conf(pipeline)


def spark_session(
    pipeline: Pipeline | None = None,
    master: str | None = None,
    short_lived: bool = True,
    c1_jit: bool | None = None,
) -> SparkSession:
    """Get (or create) the process's SparkSession. A session that already exists is reused as
    is: one JVM per process, so tests and `cdc run` pay start-up once. Under spark-submit the
    session is built on the JVM spark-submit started, its --master/--conf/--jars kept.
    `short_lived`: the JVM ends with this verb's one piece of work. Its JIT stops at C1
    (SHORT_LIVED_JVM_OPTIONS), and a JVM started with no class archive for its class path makes one
    as it exits (pipelines/jvmarchive.py). Long-running verbs say False: both JIT tiers, and their
    exit does not wait for an archive. `c1_jit` says otherwise for the JIT alone (the tests' one
    long session, whose many small queries of ever new shapes C2 rarely pays back)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise CdcError(
            "Spark needs a Java runtime and none was found", "install Java 17 (scripts/setup.sh does)"
        )
    # Python workers (executors and the data source planner) must use this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if pipeline is not None:  # made owner-only here, or Hadoop would create state_dir 0755 on its way
        private_dir(pipeline.state_path)
    conf = session_conf(pipeline, master, short_lived if c1_jit is None else c1_jit)
    submitted = under_spark_submit()
    if submitted:
        conf = _not_submitted(conf)
    master_url = conf.get("spark.master") or _submitted_master()
    conf |= executor_env_conf(pipeline, master_url)
    archive = None if submitted else _class_archive(conf, pipeline)
    if archive is not None:
        options = (
            f"-Dlog4j2.configurationFile={SPARK_CONF_DIR / LOG4J_FILE} {archive.java_options(short_lived)}"
        )
        conf = with_user_conf(conf, {"spark.driver.extraJavaOptions": options})
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    secrets = [v for k, v in conf.items() if SECRET_CONF.search(k)]
    try:
        with stage(f"starting Spark ({master_url})"):
            if not submitted:
                jvm = _launch_jvm(conf, quiet=not os.environ.get("CDC_DEBUG"), conf_dir=_conf_dir(archive))
            if master_url.startswith("spark://"):
                _probe_master(master_url, _submitted_conf() | conf)
            spark = builder.getOrCreate()
            if not submitted and archive is not None and archive.making is not None:
                atexit.register(_end_jvm_for_archive, spark, archive, jvm)
    except CdcError:
        raise
    except Exception as exc:  # JVM failed to start: one line, not a Java stack
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CdcError(
            redact_with(f"Spark could not start: {first}", secrets),
            "check Java 17 is installed and spark.master/spark.conf in the pipeline file",
        ) from None
    spark.sparkContext.setLogLevel("ERROR")
    _quiet_py4j_network_errors()
    global _driver_memory
    _driver_memory = conf.get("spark.driver.memory")
    if not master_url.startswith("local"):
        # executors got the sinks' secrets at launch: pyspark's copy must not ride with every task
        keep_out_of_tasks(spark.sparkContext, executor_secrets(pipeline) if pipeline else {})
        ship_code(spark, pipeline)
    attach_spark(spark)
    return spark


def _submitted_conf() -> dict[str, str]:
    """The confs spark-submit gave the JVM (empty when we start the JVM ourselves)."""
    if not under_spark_submit():
        return {}
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM (PYSPARK_GATEWAY_PORT)
    return dict(SparkConf().getAll())  # loadDefaults: the JVM's spark.* system properties


def _submitted_master() -> str:
    return _submitted_conf().get("spark.master", "local[*]")


def _not_submitted(conf: dict[str, str]) -> dict[str, str]:
    """Our confs minus those spark-submit set (its --master, --jars, --conf win), and minus the
    JVM launch options it already used."""
    given = _submitted_conf()
    launch_only = {"spark.driver.extraJavaOptions", "spark.pyspark.driver.python"}
    return {k: v for k, v in conf.items() if k not in given and k not in launch_only}


def _launch_jvm(conf: dict[str, str], quiet: bool, conf_dir: str) -> subprocess.Popen | None:
    """Start Spark's JVM (as getOrCreate would, same confs but no secrets on its command line,
    which pyspark's own launch puts every conf on), its launcher given SPARK_CONF_DIR=conf_dir.
    Quiet: its stderr on a pipe, a thread passes each line on to ours but the noise. The Python
    workers the JVM starts inherit the pipe. Returns the JVM's process (None when one was up)."""
    import threading

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:  # a JVM is up already (a stopped session's): reused as is
        return None
    argv_conf = [(k, v) for k, v in conf.items() if not SECRET_CONF.search(k)]  # secrets: over py4j
    spark_conf = SparkConf(loadDefaults=False).setAll(argv_conf)
    given = os.environ.get("SPARK_CONF_DIR")
    os.environ["SPARK_CONF_DIR"] = conf_dir  # pyspark passes os.environ to the launcher: for it only
    try:
        if not quiet:
            gateway = launch_gateway(spark_conf)
        else:
            read_fd, write_fd = os.pipe()
            # forwarding first: what a JVM that fails to start says is passed on too
            threading.Thread(
                target=_forward_jvm_stderr, args=(read_fd,), name="jvm-stderr", daemon=True
            ).start()
            try:
                gateway = launch_gateway(spark_conf, {"stderr": write_fd})
            finally:
                os.close(write_fd)  # the JVM holds its own copy
    finally:
        if given is None:
            os.environ.pop("SPARK_CONF_DIR", None)
        else:
            os.environ["SPARK_CONF_DIR"] = given
    SparkContext._ensure_initialized(gateway=gateway)
    return getattr(gateway, "proc", None)


def _class_archive(conf: dict[str, str], pipeline: Pipeline | None) -> Archive | None:
    """The JVM class archive for this session's class path (pipelines/jvmarchive.py), or None: turned
    off (`spark.class_archive: false`), the user's own SPARK_CONF_DIR (a directory with files on the
    class path rules an archive out), their own class-sharing flags, or no usable cache folder."""
    from pipelines.jvmarchive import archive_for, chooses_own, layout_options

    if pipeline is not None and not pipeline.spark.class_archive:
        return None
    if os.environ.get("SPARK_CONF_DIR") not in (None, str(SPARK_CONF_DIR), str(empty_conf_dir())):
        return None
    options = [conf.get(k, "") for k in ("spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions")]
    if chooses_own(options):
        return None
    try:
        empty = private_dir(empty_conf_dir())
        if any(empty.iterdir()):
            return None
        return archive_for(
            [j for j in conf.get("spark.jars", "").split(",") if j],
            empty,
            [c for c in conf.get("spark.driver.extraClassPath", "").split(os.pathsep) if c],
            layout_options(options, conf.get("spark.driver.memory")),
        )
    except OSError:  # no writable cache folder (a read-only home): start as without one
        return None


def empty_conf_dir() -> Path:
    """Spark's launcher puts SPARK_CONF_DIR on the JVM's class path, and HotSpot archives no class
    path with a non-empty directory on it: with an archive, SPARK_CONF_DIR is this empty folder and
    log4j's settings are named by a system property instead."""
    from pipelines.jvmarchive import cache_dir

    return cache_dir() / "conf"


def _conf_dir(archive: Archive | None) -> str:
    """SPARK_CONF_DIR for the launch: the empty folder with an archive, else the user's or ours
    (log4j2.properties: errors only). A parent cdc process's empty folder is not the user's."""
    if archive is not None:
        return str(empty_conf_dir())
    given = os.environ.get("SPARK_CONF_DIR")
    return str(SPARK_CONF_DIR) if given in (None, str(empty_conf_dir())) else given


# What the JVM prints on its stderr at start-up that tells a user nothing: the incubator-module
# warning of Java 17+, log4j's level banner, WARN lines. CDC_DEBUG=1 shows them.
JVM_NOISE = re.compile(
    r"WARNING: |Setting default log level to |To adjust logging level use |For SparkR, use setLogLevel"
    r"|(\d\d/\d\d/\d\d )?\d\d:\d\d:\d\d WARN "
)


def _forward_jvm_stderr(read_fd: int) -> None:
    with os.fdopen(read_fd, "rb") as lines:
        for line in lines:
            if not JVM_NOISE.match(line.decode(errors="replace")):
                os.write(2, line)  # where the JVM wrote before: this process's stderr file


def ship_code(spark: SparkSession, pipeline: Pipeline | None) -> None:
    """Executors of a real cluster get this code as a zip (addPyFile: on their Python path before
    anything installed there), unless spark-submit --py-files shipped it already."""
    import tempfile

    from pipelines.codezip import ZIP_NAME, write_zip

    if spark.sparkContext.getConf().get("spark.submit.pyFiles", ""):
        return
    base = (
        pipeline.state_path / "spark" if pipeline is not None else Path(tempfile.mkdtemp(prefix="cdc-code-"))
    )
    spark.sparkContext.addPyFile(str(write_zip(private_dir(base) / ZIP_NAME)))


def _probe_master(master: str, conf: dict[str, str]) -> None:
    """Look the standalone master's endpoint up with our security settings before building the
    context: a refused (or missing) secret fails here at once, exit 3, rather than after Spark's
    three 20 s registration attempts. The probe is a client-only RpcEnv in the driver's JVM; it
    sends the authentication handshake and one endpoint lookup, nothing else."""
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    if jvm is None:  # _launch_jvm (or spark-submit's gateway, _submitted_conf) started it just before
        raise RuntimeError("Spark's JVM gateway is not up")
    host, _, port = master.removeprefix("spark://").split(",")[0].rpartition(":")
    if not port_answers(host, int(port)):
        raise EngineSettingError(
            f"the Spark master {master} does not accept connections",
            "check spark.master and that the master runs (`cdc dev status spark` for the dev cluster)",
        )
    jconf = jvm.org.apache.spark.SparkConf(False)
    for key, value in conf.items():
        jconf.set(key, value)
    config = getattr(getattr(jvm.org.apache.spark.internal.config, "package$"), "MODULE$")
    security = jvm.org.apache.spark.SecurityManager(
        jconf, jvm.scala.Option.empty(), config.AUTH_SECRET_FILE()
    )
    log4j = jvm.org.apache.logging.log4j
    quiet = ("org.apache.spark.network", "org.apache.spark.rpc")  # their ERROR lines of the refusal
    for name in quiet:
        log4j.core.config.Configurator.setLevel(name, log4j.Level.OFF)
    env = jvm.org.apache.spark.rpc.RpcEnv.create(
        "cdcProbe", conf.get("spark.driver.host", "127.0.0.1"), 0, jconf, security, True
    )
    try:
        env.setupEndpointRef(jvm.org.apache.spark.rpc.RpcAddress(host, int(port)), "Master")
        for name in quiet:  # on a refusal they stay quiet: its connection threads log on a while
            log4j.core.config.Configurator.setLevel(name, log4j.Level.ERROR)
    except Exception:  # the port answers, so the master refused the handshake: the secret
        given = (
            "spark.secret is not the cluster's"
            if "spark.authenticate.secret" in conf
            else "the master requires authentication and spark.secret is not set"
        )
        raise EngineSettingError(
            f"the Spark master {master} refused this driver: {given}",
            "set spark.secret in the pipeline file to the secret the cluster was started with "
            "(e.g. spark.secret: ${SPARK_SECRET}, with SPARK_SECRET exported)",
        ) from None
    finally:
        env.shutdown()


def port_answers(host: str, port: int) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False
