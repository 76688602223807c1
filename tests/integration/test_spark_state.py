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
        # both JVMs with C1-only JIT (a third less CPU for a short-lived JVM); the default options
        # (not extraJavaOptions, tests/fixtures/lake.py FAST_JVM) keep the Derby home cdc sets
        spark={"conf": {"spark.driver.defaultJavaOptions": "-XX:TieredStopAtLevel=1"}},
    )
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
    """pipelines/spark.py JVM_OPTIONS reaches the driver JVM's command line (unit test: it stays
    ahead of a pipeline's -XX:TieredStopAtLevel=1, which alone would shrink the cache to 48 MB)."""
    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    size = bean.getVMOption("ReservedCodeCacheSize")
    assert (size.getValue(), size.getOrigin().toString()) == (str(240 << 20), "VM_CREATION")
    exits = bean.getVMOption("ExitOnOutOfMemoryError")  # an OOM ends the JVM (test_driver_out_of_memory.py)
    assert (exits.getValue(), exits.getOrigin().toString()) == ("true", "VM_CREATION")
