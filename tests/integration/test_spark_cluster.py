"""The apply job on a real Spark standalone cluster (README "Running on a cluster"): a master and
two workers from the pyspark wheel (the session fixture `spark_cluster`, secured with
spark.authenticate and RPC encryption), `cdc apply --once` with `spark.master: spark://...` on the
local log and on the Kafka log, and the same job as a spark-submit application built by
`cdc package spark`. Followers are checked with `cdc verify` and delta-rs; executors get the code
zip and the Delta/Kafka jars from the driver; the secret is never printed nor on a command line.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from pipelines.devservices.spark import LocalSparkCluster
from tests.fixtures.capture import no_traceback
from tests.fixtures.kafka_log import make_kpipe
from tests.fixtures.kafka_log import snapshot as kafka_snapshot
from tests.fixtures.kafka_log import stream_until_current as kafka_stream
from tests.fixtures.kafka_log import verified as kafka_verified
from tests.fixtures.lake import (
    FAST_JVM,
    LAKE,
    assert_delta_is_source,
    descendants,
    make_pipe,
    snapshot,
    stream,
    verified,
)
from tests.fixtures.spark_cluster import EXECUTOR_CONF, SECRET
from tests.fixtures.workload import make_table
from tests.harness import cdc, cdc_popen, sql, write_pipeline

# Each application starts a driver and two executor JVMs: minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(2400)]

WITH_SECRET = {"SPARK_SECRET": SECRET}


def cluster_spark(cluster: LocalSparkCluster, secret: bool = True) -> dict:
    spark = {"master": cluster.url, "conf": FAST_JVM | EXECUTOR_CONF}
    return spark | {"secret": "${SPARK_SECRET}"} if secret else spark


def apply_on_cluster(pipe_file: Path, cluster: LocalSparkCluster) -> tuple[str, str, set[str]]:
    """`cdc apply --once` in a subprocess: (stdout, stderr, the command lines of every process it and
    the workers ran meanwhile: driver JVM, Python workers, executor JVMs)."""
    workers = [w.pid() for w in cluster.workers]
    proc = cdc_popen("apply", pipe_file, "--once", env=WITH_SECRET)
    cmdlines: set[str] = set()
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            for root in (proc.pid, *(p for p in workers if p)):
                cmdlines |= set(descendants(root).values())
            time.sleep(0.3)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{err}"
    no_traceback((out, err))
    return out, err, cmdlines


def shipped(cluster: LocalSparkCluster, name: str) -> list[Path]:
    """Files the executors fetched into their work dirs (work/<app>/<executor>/)."""
    return list((cluster.base_dir / "work").glob(f"app-*/*/{name}"))


def test_apply_on_standalone_cluster_then_spark_submit(
    pg_db: str, tmp_path: Path, spark, spark_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local log: `cdc apply --once` on the secured standalone cluster applies and verifies, the
    executors got pgcdc.zip and the Delta jar from the driver, and the secret is in no output and no
    command line; a wrong or missing secret is exit 3 at once. Then the next changes are applied
    by spark-submit running the package `cdc package spark` built, with the command it printed."""
    monkeypatch.setenv("SPARK_SECRET", SECRET)  # the in-process snapshot/stream/verify load the file too
    make_table(pg_db, "sc", 300)
    pipe = make_pipe(tmp_path, pg_db, ["public.sc"], spark=cluster_spark(spark_cluster))
    snapshot(pipe)
    sql(
        pg_db,
        "UPDATE sc SET v = 'changed' WHERE id % 7 = 0",
        "DELETE FROM sc WHERE id % 11 = 0",
        "INSERT INTO sc SELECT g, 'new' FROM generate_series(1000, 1050) g",
    )
    stream(pipe)
    out, err, cmdlines = apply_on_cluster(pipe.file, spark_cluster)
    assert "sink lake: applied cut" in out, out
    assert any("CoarseGrainedExecutorBackend" in c for c in cmdlines), "no executor JVM ran on the workers"
    assert not [c for c in cmdlines if SECRET in c], "the secret is on a command line"
    assert SECRET not in out + err
    assert shipped(spark_cluster, "pgcdc.zip"), "the executors did not get the code zip"
    assert shipped(spark_cluster, "delta-spark_*.jar"), "the executors did not get the Delta jar"
    verified(pipe, spark)
    assert_delta_is_source(spark, pipe, pg_db, "public.sc")

    status = cdc("status", pipe.file, env=WITH_SECRET)
    assert SECRET not in status.out + status.err

    # A wrong secret, then none: refused by the master at once, exit 3, no secret printed.
    wrong = "wrong-" + SECRET[::-1]
    run = cdc("apply", pipe.file, "--once", env={"SPARK_SECRET": wrong})
    assert run.code == 3, f"exit {run.code}\n{run.out}\n{run.err}"
    assert "refused this driver: spark.secret is not the cluster's" in run.err and "  fix: " in run.err, (
        run.err
    )
    assert wrong not in run.out + run.err and SECRET not in run.out + run.err
    no_traceback(run)
    write_pipeline(
        tmp_path, pg_db, ["public.sc"], sinks=[LAKE], spark=cluster_spark(spark_cluster, secret=False)
    )
    run = cdc("apply", pipe.file, "--once")
    assert run.code == 3, f"exit {run.code}\n{run.out}\n{run.err}"
    assert "the master requires authentication and spark.secret is not set" in run.err, run.err
    no_traceback(run)

    # spark-submit: the package and the command `cdc package spark` prints, run as printed.
    write_pipeline(tmp_path, pg_db, ["public.sc"], sinks=[LAKE], spark=cluster_spark(spark_cluster))
    sql(pg_db, "UPDATE sc SET v = 'submitted' WHERE id % 5 = 0", "DELETE FROM sc WHERE id % 13 = 0")
    stream(pipe)
    built = cdc(
        "package", "spark", "--out", tmp_path / "pkg", "--master", spark_cluster.url, "--pipeline", pipe.file
    )
    assert built.code == 0, built.err
    command = built.out.strip()
    assert "bin/spark-submit --master " in command and "--py-files" in command, command
    assert SECRET not in command
    submitted = subprocess.run(
        shlex.split(command),
        capture_output=True,
        text=True,
        env={**os.environ, **WITH_SECRET},
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert submitted.returncode == 0, (
        f"spark-submit exited {submitted.returncode}\n{submitted.stdout}\n{submitted.stderr[-4000:]}"
    )
    assert "sink lake: applied cut" in submitted.stdout, submitted.stdout
    assert SECRET not in submitted.stdout + submitted.stderr
    verified(pipe, spark)
    assert_delta_is_source(spark, pipe, pg_db, "public.sc")


def test_apply_kafka_log_on_standalone_cluster(
    pg_db: str, tmp_path: Path, spark, kafka, spark_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka log: the executors read the topics with Spark's Kafka source (its jars shipped by the
    driver) and the follower verifies."""
    monkeypatch.setenv("SPARK_SECRET", SECRET)
    make_table(pg_db, "kc", 200)
    pipe = make_kpipe(tmp_path, pg_db, ["public.kc"], kafka.bootstrap)
    log = {"kafka": {"bootstrap_servers": pipe.bootstrap, "topic_prefix": pipe.prefix}}
    write_pipeline(
        tmp_path,
        pg_db,
        ["public.kc"],
        name=pipe.name,
        log=log,
        sinks=[LAKE],
        spark=cluster_spark(spark_cluster),
    )
    kafka_snapshot(pipe)
    sql(pg_db, "UPDATE kc SET v = 'changed' WHERE id % 3 = 0", "DELETE FROM kc WHERE id % 10 = 0")
    kafka_stream(pipe)
    out, _err, _cmdlines = apply_on_cluster(pipe.file, spark_cluster)
    assert "sink lake: applied cut" in out, out
    assert shipped(spark_cluster, "spark-sql-kafka-*.jar"), "the executors did not get Spark's Kafka source"
    kafka_verified(pipe, spark)
    assert_delta_is_source(spark, pipe, pg_db, "public.kc")
