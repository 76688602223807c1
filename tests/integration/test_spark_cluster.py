"""The apply job on a real Spark standalone cluster (README "Running on a cluster"): a master and
two workers from the pyspark wheel (the session fixture `spark_cluster`, secured with
spark.authenticate and RPC encryption), `cdc apply --once` with `spark.master: spark://...` on the
Kafka log, and the job on the local log as a spark-submit application built by `cdc package spark`.
Followers are checked with `cdc verify` and delta-rs (an Iceberg follower with pyiceberg);
executors get the code zip and the Delta/Kafka/Iceberg jars from the driver; the secret is never
printed nor on a command line.

Two applications in all (each a driver and two executor JVMs: minutes on a loaded 2-core machine):
`cdc apply` on the cluster and a spark-submit of the package; what both launchers must do
(executors that ran, the code zip and the Delta jar shipped, no secret on a command line) is
checked on each, the log-specific parts once (the Kafka source's jars with `cdc apply`).
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from pipelines.devservices.redis import LocalRedis
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
from tests.fixtures.readers import iceberg_rows, redis_rows
from tests.fixtures.spark_cluster import EXECUTOR_CONF, SECRET
from tests.fixtures.workload import make_table
from tests.harness import REPO, cdc, cdc_popen, source_rows, sql, write_pipeline

# Each application starts a driver and two executor JVMs: minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

WITH_SECRET = {"SPARK_SECRET": SECRET}


def cluster_spark(cluster: LocalSparkCluster, secret: bool = True) -> dict:
    spark = {"master": cluster.url, "conf": FAST_JVM | EXECUTOR_CONF}
    return spark | {"secret": "${SPARK_SECRET}"} if secret else spark


def apps(cluster: LocalSparkCluster) -> set[Path]:
    """The applications' work dirs on the workers (work/<app>/<executor>/)."""
    return set((cluster.base_dir / "work").glob("app-*"))


def environ(pid: int) -> dict[str, str]:
    """A process's environment as it was launched with (/proc/<pid>/environ); {} once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(e.decode(errors="replace").partition("=")[::2] for e in raw.split(b"\0") if e)


def run_on_cluster(
    args: list[str],
    cluster: LocalSparkCluster,
    out_dir: Path,
    cwd: Path = REPO,
    executor_env: list[dict[str, str]] | None = None,
) -> tuple[str, str, set[str]]:
    """Run an application's driver process (`cdc apply` or spark-submit) to success: (stdout,
    stderr, the command lines of every process it and the workers ran meanwhile: driver JVM,
    Python workers, executor JVMs). Its output goes to files (a pipe nobody reads while the
    processes are polled could fill up and stall it)."""
    workers = [w.pid() for w in cluster.workers]
    cmdlines: set[str] = set()
    out_file, err_file = out_dir / "driver.out", out_dir / "driver.err"
    with out_file.open("w") as out_f, err_file.open("w") as err_f:
        proc = subprocess.Popen(
            args, stdout=out_f, stderr=err_f, text=True, env={**os.environ, **WITH_SECRET}, cwd=cwd
        )
        try:
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                for root in (proc.pid, *(p for p in workers if p)):
                    for pid, cmd in descendants(root).items():
                        cmdlines.add(cmd)
                        if executor_env is not None and "CoarseGrainedExecutorBackend" in cmd:
                            executor_env.append(environ(pid))
                time.sleep(0.3)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
    out, err = out_file.read_text(), err_file.read_text()
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{err[-4000:]}"
    no_traceback((out, err))
    return out, err, cmdlines


def assert_ran_on_executors(
    cluster: LocalSparkCluster, before: set[Path], out: str, err: str, cmdlines: set[str]
) -> list[Path]:
    """What every launcher must do: the job ran in executor JVMs on the workers, which got the code
    zip and the Delta jar from the driver; the secret is in no output and on no command line.
    Returns the new application's work dir(s)."""
    assert "sink lake: applied cut" in out, out
    assert any("CoarseGrainedExecutorBackend" in c for c in cmdlines), "no executor JVM ran on the workers"
    assert not [c for c in cmdlines if SECRET in c], "the secret is on a command line"
    assert SECRET not in out + err
    new = sorted(apps(cluster) - before)
    assert new, "no application ran on the cluster"
    assert shipped(new, "pgcdc.zip"), "the executors did not get the code zip"
    assert shipped(new, "delta-spark_*.jar"), "the executors did not get the Delta jar"
    return new


def shipped(app_dirs: list[Path], name: str) -> list[Path]:
    """Files the executors of these applications fetched into their work dirs."""
    return [f for app in app_dirs for f in app.glob(f"*/{name}")]


def test_apply_on_standalone_cluster_then_spark_submit(
    pg_db: str, tmp_path: Path, spark, spark_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local log: a wrong or missing secret is exit 3 at once; `cdc status` does not print the
    secret; the changes are applied on the secured standalone cluster by spark-submit running the
    package `cdc package spark` built, with the command it printed (executors got pgcdc.zip and the
    Delta jar, no secret on a command line), and the follower verifies."""
    monkeypatch.setenv("SPARK_SECRET", SECRET)  # the in-process snapshot/stream/verify load the file too
    make_table(pg_db, "sc", 300)
    pipe = make_pipe(tmp_path, pg_db, ["public.sc"], sinks=[LAKE], spark=cluster_spark(spark_cluster))
    snapshot(pipe)
    sql(
        pg_db,
        "UPDATE sc SET v = 'changed' WHERE id % 7 = 0",
        "DELETE FROM sc WHERE id % 11 = 0",
        "INSERT INTO sc SELECT g, 'new' FROM generate_series(1000, 1050) g",
    )
    stream(pipe)

    status = cdc("status", pipe.file, env=WITH_SECRET)
    assert SECRET not in status.out + status.err

    # A wrong secret, and none: refused by the master at once, exit 3, no secret printed. Both
    # drivers side by side (they stop before the apply job, so before any lock or state).
    wrong = "wrong-" + SECRET[::-1]
    bare = tmp_path / "nosecret"
    bare.mkdir()
    no_secret = write_pipeline(
        bare, pg_db, ["public.sc"], sinks=[LAKE], spark=cluster_spark(spark_cluster, secret=False)
    )
    refused = [
        cdc_popen("apply", pipe.file, "--once", env={"SPARK_SECRET": wrong}),
        cdc_popen("apply", no_secret, "--once"),
    ]
    (wrong_out, wrong_err), (bare_out, bare_err) = [p.communicate(timeout=600) for p in refused]
    assert refused[0].returncode == 3, f"exit {refused[0].returncode}\n{wrong_out}\n{wrong_err}"
    assert "refused this driver: spark.secret is not the cluster's" in wrong_err and "  fix: " in wrong_err, (
        wrong_err
    )
    assert wrong not in wrong_out + wrong_err and SECRET not in wrong_out + wrong_err
    no_traceback((wrong_out, wrong_err))
    assert refused[1].returncode == 3, f"exit {refused[1].returncode}\n{bare_out}\n{bare_err}"
    assert "the master requires authentication and spark.secret is not set" in bare_err, bare_err
    no_traceback((bare_out, bare_err))

    # spark-submit: the package and the command `cdc package spark` prints, run as printed.
    built = cdc(
        "package", "spark", "--out", tmp_path / "pkg", "--master", spark_cluster.url, "--pipeline", pipe.file
    )
    assert built.code == 0, built.err
    command = built.out.strip()
    assert "bin/spark-submit --master " in command and "--py-files" in command, command
    assert SECRET not in command
    before = apps(spark_cluster)
    out, err, cmdlines = run_on_cluster(shlex.split(command), spark_cluster, tmp_path, cwd=tmp_path)
    assert_ran_on_executors(spark_cluster, before, out, err, cmdlines)
    verified(pipe, spark)
    assert_delta_is_source(spark, pipe, pg_db, "public.sc")


def test_apply_kafka_log_on_standalone_cluster(
    pg_db: str,
    tmp_path: Path,
    spark,
    kafka,
    spark_cluster,
    own_redis: LocalRedis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kafka log: `cdc apply --once` on the secured standalone cluster applies and verifies; the
    executors got pgcdc.zip, the Delta jar and Spark's Kafka source (they read the topics with it)
    from the driver; the secret is in no output and no command line. A Redis follower behind a
    password (README "Secrets on the executors"): the executors got it in their environment at
    launch (spark.executorEnv), never on a command line or in output, and Redis ends as the source.
    An Iceberg follower on the embedded SQLite catalog (the catalog is the driver's; the executors
    write the data files into the warehouse on the shared local disk, with Iceberg's runtime jar
    shipped from the driver): pyiceberg reads the source's rows."""
    monkeypatch.setenv("SPARK_SECRET", SECRET)
    password = "rp-" + secrets.token_hex(12)
    redis.Redis.from_url(own_redis.url).config_set("requirepass", password)
    monkeypatch.setenv("CDC_TEST_REDIS_PASSWORD", password)
    cache = {
        "name": "cache",
        "redis": {
            "url": own_redis.url.replace("redis://", "redis://:${CDC_TEST_REDIS_PASSWORD}@"),
            "tables": ["public.kc"],
        },
    }
    make_table(pg_db, "kc", 200)
    pipe = make_kpipe(tmp_path, pg_db, ["public.kc"], kafka.bootstrap)
    log = {"kafka": {"bootstrap_servers": pipe.bootstrap, "topic_prefix": pipe.prefix}}
    write_pipeline(
        tmp_path,
        pg_db,
        ["public.kc"],
        name=pipe.name,
        log=log,
        sinks=[LAKE, cache, {"name": "ice", "iceberg": {"warehouse": "ice"}}],
        spark=cluster_spark(spark_cluster),
    )
    kafka_snapshot(pipe)
    sql(pg_db, "UPDATE kc SET v = 'changed' WHERE id % 3 = 0", "DELETE FROM kc WHERE id % 10 = 0")
    kafka_stream(pipe)
    before = apps(spark_cluster)
    driver = [sys.executable, "-m", "pipelines.cli", "apply", str(pipe.file), "--once"]
    launched: list[dict[str, str]] = []
    out, err, cmdlines = run_on_cluster(driver, spark_cluster, tmp_path, executor_env=launched)
    new = assert_ran_on_executors(spark_cluster, before, out, err, cmdlines)
    assert shipped(new, "spark-sql-kafka-*.jar"), "the executors did not get Spark's Kafka source"
    assert "sink cache: applied cut" in out and "sink ice: applied cut" in out, out
    assert shipped(new, "iceberg-spark-runtime-*.jar"), "the executors did not get Iceberg's runtime"
    assert any(e.get("CDC_SECRET_CACHE_PASSWORD") == password for e in launched), (
        "no executor got it at launch"
    )
    assert not [c for c in cmdlines if password in c] and password not in out + err
    kafka_verified(pipe, spark)
    assert_delta_is_source(spark, pipe, pg_db, "public.kc")
    iceberg = iceberg_rows(tmp_path / "ice", "public.kc")  # pyiceberg, not the sink
    assert {k: r["v"] for k, r in iceberg.items()} == {
        k: r["v"] for k, r in source_rows(pg_db, "public.kc", ("id",)).items()
    }
    client = redis.Redis.from_url(
        own_redis.url.replace("redis://", f"redis://:{password}@"), decode_responses=True
    )
    cached = redis_rows(client, "public.kc:")
    client.close()
    expected = source_rows(pg_db, "public.kc", ("id",))
    assert sorted(cached) == sorted(f"public.kc:{i}" for (i,) in expected)
    assert all(cached[f"public.kc:{i}"]["v"] == row["v"] for (i,), row in expected.items())
