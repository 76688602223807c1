"""A driver JVM out of heap ends `cdc run` at once, saying so (pipelines/spark.py JVM_OPTIONS,
ApplyJob.check_driver).

The crash campaign's Kafka round 7 ran Spark's driver out of its 1 GiB heap. Spark's threads then
died one by one on OutOfMemoryError, and two minutes later each follower failed on
`Py4JJavaError ... unpersist` and the run on `internal error ... stopped SparkContext`: nothing
named the heap. Here a real `cdc run` makes its driver JVM allocate more than its heap at the
sink's lock (CDC_FAULT=apply:locked:out-of-memory, a real java.lang.OutOfMemoryError). It must exit
4 with an error naming the heap and a fix naming `spark.driver.memory`, no traceback, its stream
child and JVM gone; the follower then applies the cut and equals the source.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.fixtures.kafka_log import alive, wait_gone
from tests.fixtures.lake import FAST_JVM, LAKE, apply_ok, descendants, make_pipe, snapshot, stream, verified
from tests.harness import cdc, cdc_popen, sql

pytestmark = [pytest.mark.integration]


def test_a_driver_out_of_heap_ends_cdc_run_naming_the_heap(pg_db: str, tmp_path: Path, spark) -> None:
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.t"], sinks=[LAKE], spark={"conf": FAST_JVM})
    snapshot(pipe)
    run = cdc_popen("run", pipe.file, env={"CDC_FAULT": "apply:locked:out-of-memory"})
    below: dict[int, str] = {}
    try:
        while run.poll() is None and not (
            any("java" in c for c in below.values()) and any("cli stream" in c for c in below.values())
        ):
            below = descendants(run.pid)
            time.sleep(0.1)
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 4, (out, err)
    assert "error: Spark's driver JVM ran out of heap (java.lang.OutOfMemoryError)" in err, err
    assert "spark.driver.memory is 1g (Spark default)" in err, err
    assert "  fix: give the driver more heap" in err and "spark.driver.memory: 4g" in err, err
    assert "every follower keeps its checkpoint" in err, err  # the apply's own fix, not the generic one
    assert "Traceback" not in err + out and "Py4J" not in err, err
    assert any("java" in c for c in below.values()), below
    assert all(wait_gone(p, 10) for p in below), {p: c for p, c in below.items() if alive(p)}  # none left

    sql(pg_db, "UPDATE t SET v = 'after' WHERE id <= 10", "DELETE FROM t WHERE id > 90")
    stream(pipe)
    apply_ok(pipe, spark)
    verified(pipe, spark)


def test_a_driver_out_of_heap_in_verify_names_the_heap(pg_db: str, tmp_path: Path, spark) -> None:
    """Any verb on Spark, not only the apply: `cdc verify`'s driver out of heap while it compares
    gives the same error and fix (pipelines/cli/failures.py handle_errors), not the dead JVM's py4j error."""
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g",
    )
    pipe = make_pipe(
        tmp_path,
        pg_db,
        ["public.t"],
        sinks=[LAKE],
        spark={"conf": {**FAST_JVM, "spark.driver.memory": "512m"}},
    )
    snapshot(pipe)
    apply_ok(pipe, spark)
    run = cdc("verify", pipe.file, env={"CDC_FAULT": "verify:compare:out-of-memory"}, timeout=300)
    assert run.code == 4, run
    assert "error: Spark's driver JVM ran out of heap (java.lang.OutOfMemoryError)" in run.err, run.err
    assert "spark.driver.memory is 512m" in run.err, run.err
    assert "  fix: give the driver more heap" in run.err, run.err
    assert (
        "Traceback" not in run.err + run.out and "Py4J" not in run.err and "internal error" not in run.err
    ), run.err
    verified(pipe, spark)  # nothing was damaged: the next verify passes
