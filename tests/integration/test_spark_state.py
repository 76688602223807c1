"""`cdc apply` / `cdc verify` as a user runs them from some directory (not a terminal):

* Spark's own files stay under state_dir (pipelines/spark.py warehouse_conf): nothing is left in
  the current directory (no `spark-warehouse/`, `metastore_db/`, `derby.log`);
* they say what they are doing (pipelines/stages.py): a line when each stage starts and ends, on
  stderr, the report on stdout."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import cdc, sql, write_pipeline

pytestmark = pytest.mark.integration


# What the JVM and log4j print at start-up (Java 17+, Spark 4) unless CDC_DEBUG=1
JVM_NOISE = ("Using incubator modules", "Setting default log level", "sc.setLogLevel", " WARN ", "WARNING:")


def test_apply_from_another_cwd(pg_db: str, tmp_path: Path) -> None:
    sql(pg_db, "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    file = write_pipeline(
        conf_dir,
        pg_db,
        ["public.t"],
        state_dir=str(tmp_path / "state"),
        sinks=[{"name": "lake", "delta": {"path": str(tmp_path / "lake")}}],
    )  # both JVMs as shipped: a short-lived verb's JIT stops at C1 (pipelines/spark.py)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    assert cdc("snapshot", file, cwd=cwd).code == 0
    run = cdc("apply", file, "--once", cwd=cwd)
    assert run.code == 0, run
    for line in (
        "starting Spark (local[2]) ...",
        "starting Spark (local[2]): done in ",
        "sink lake: cut 1: reading and checking 1 table(s) ...",
        "sink lake: public.t: applying offsets 1..1 ...",
        "sink lake: public.t: applying offsets 1..1: done in ",
    ):
        assert line in run.err, (line, run.err)
    assert "sink lake: applied cut 1" in run.out and "starting Spark" not in run.out
    # Spark's JVM banner and WARN lines stay out of the user's terminal (issue 16 item 6)
    for noise in JVM_NOISE:
        assert noise not in run.err, (noise, run.err)
    check = cdc("verify", file, cwd=cwd, env={"CDC_DEBUG": "1"})
    assert check.code == 0, check
    assert "Using incubator modules" in check.err, check.err  # CDC_DEBUG=1 shows what the JVM says
    for line in (
        "reading 1 source table(s) at one snapshot: done in ",
        "sink lake: public.t: comparing with the source ...",
    ):
        assert line in check.err, (line, check.err)
    assert sorted(p.name for p in cwd.iterdir()) == []  # nothing of Spark's (nor anything else) here
    assert not (conf_dir / "spark-warehouse").exists()


def test_spark_jvm_code_cache_is_set_at_launch(spark) -> None:
    """pipelines/spark.py JVM_OPTIONS and the C1-only JIT reach the driver JVM's command line (unit test: it stays
    ahead of a pipeline's -XX:TieredStopAtLevel=1, which alone would shrink the cache to 48 MB)."""
    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    size = bean.getVMOption("ReservedCodeCacheSize")
    assert (size.getValue(), size.getOrigin().toString()) == (str(240 << 20), "VM_CREATION")
    exits = bean.getVMOption("ExitOnOutOfMemoryError")  # an OOM ends the JVM (test_driver_out_of_memory.py)
    assert (exits.getValue(), exits.getOrigin().toString()) == ("true", "VM_CREATION")
    # the C1-only JIT (SHORT_LIVED_JVM_OPTIONS; the test session asks for it) reaches the JVM too
    tier = bean.getVMOption("TieredStopAtLevel")
    assert (tier.getValue(), tier.getOrigin().toString()) == ("1", "VM_CREATION")


def test_class_archive_made_at_exit_then_mapped_and_a_stale_one_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver JVM's class archive (pipelines/jvmarchive.py) with the JVM cdc launches: Spark's
    launcher, its class path, pyspark's gateway. A tiny java program would not show that HotSpot
    takes this class path (SPARK_CONF_DIR on it must be empty) nor that Spark's launcher passes the
    options on; a SparkContext per JVM would add nothing but minutes, so the gateway JVM is started
    alone (four short JVMs): made as the JVM exits and put in place only then, mapped by the next
    start, and an archive that does not fit (a class path changed since, a file of the right size
    without an archive in it) ignored with nothing printed, the JVM working as without it."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    from pipelines.spark import _class_archive, base_conf, empty_conf_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    conf = base_conf("local[1]", ("spark",))
    archive = _class_archive(conf, None)
    assert archive is not None and archive.found() is None

    def start(options: str, name: str, conf_dir: Path) -> tuple[object, Path, Path]:
        """The gateway JVM with these options; (its process, its class-load log, its output file)."""
        loaded, printed = tmp_path / f"{name}.classes", tmp_path / f"{name}.out"
        jvm_options = f"{options} -Xlog:class+load=info:file={loaded}"
        settings = [("spark.driver.extraJavaOptions", jvm_options), ("spark.jars", conf["spark.jars"])]
        monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
        with printed.open("wb") as out:
            gateway = launch_gateway(
                SparkConf(loadDefaults=False).setAll(settings), {"stdout": out, "stderr": out}
            )
        assert gateway.jvm.java.lang.System.getProperty("java.version").startswith("17")  # it answers
        gateway.close()
        return gateway.proc, loaded, printed

    def shared(loaded: Path) -> int:
        return loaded.read_text().count("source: shared objects file (top)")

    def quiet(printed: Path) -> bool:
        """Nothing of class sharing in what the JVM printed (Spark's own start-up lines aside: cdc's
        log4j settings are not given here)."""
        said = printed.read_text().lower()
        return not any(word in said for word in ("cds", "shared", "archive", "jsa"))

    made_by, _loaded, printed = start(archive.java_options(), "make", empty_conf_dir())
    assert archive.found() is None  # written by the JVM as it exits, not before
    assert archive.finish(made_by), printed.read_text()
    kept = archive.found()
    assert kept is not None and [p.name for p in archive.folder.glob("*.part")] == [] and quiet(printed)

    proc, loaded, printed = start(archive.java_options(), "reuse", empty_conf_dir())
    assert archive.making is None  # found: mapped, not made again
    proc.stdin.close()
    assert proc.wait(timeout=120) == 0 and quiet(printed)
    assert shared(loaded) > 500, "the second start did not map the archive's classes"

    other_conf_dir = tmp_path / "other-conf"  # the class path changed since the archive was made
    other_conf_dir.mkdir()
    proc, loaded, printed = start(archive.java_options(), "moved", other_conf_dir)
    proc.stdin.close()
    assert proc.wait(timeout=120) == 0 and quiet(printed) and shared(loaded) == 0

    kept.chmod(0o600)
    kept.write_bytes(bytes(kept.stat().st_size))  # its size, but no archive: HotSpot refuses it
    proc, loaded, printed = start(archive.java_options(), "garbage", empty_conf_dir())
    proc.stdin.close()
    assert proc.wait(timeout=120) == 0 and quiet(printed) and shared(loaded) == 0
    # (one cut short is deleted before any JVM sees it: tests/unit/test_spark_start.py)
