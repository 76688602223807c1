"""The SparkSession's configuration (pipelines/spark.py) sized from the master URL."""

from __future__ import annotations

import os

import pytest

from pipelines.spark import (
    JVM_OPTIONS,
    SHORT_LIVED_JVM_OPTIONS,
    base_conf,
    master_cores,
    session_conf,
    warehouse_conf,
    with_user_conf,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("master", "cores"),
    [
        ("local", 1),
        ("local[2]", 2),
        ("local[*]", os.cpu_count() or 1),
        ("local[4,3]", 4),  # [threads, max failures]
        ("local-cluster[2,1,1024]", 2),
        ("local-cluster[3, 2, 512]", 6),
        ("spark://127.0.0.1:7077", None),
        ("yarn", None),
    ],
)
def test_master_cores(master: str, cores: int | None) -> None:
    assert master_cores(master) == cores


def test_pipeline_java_options_are_added_to_ours_not_put_in_their_place() -> None:
    ours = warehouse_conf(None)
    merged = with_user_conf(
        ours, {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1", "spark.x": True}
    )
    derby = ours["spark.driver.extraJavaOptions"]
    assert merged["spark.driver.extraJavaOptions"] == f"{derby} -XX:TieredStopAtLevel=1"
    assert merged["spark.x"] == "true"
    assert merged["spark.sql.warehouse.dir"] == ours["spark.sql.warehouse.dir"]
    # a key cdc does not set is taken as given; one cdc sets and does not join is replaced
    assert (
        with_user_conf(ours, {"spark.executor.extraJavaOptions": "-Da=1"})["spark.executor.extraJavaOptions"]
        == "-Da=1"
    )
    assert with_user_conf(ours, {"spark.sql.warehouse.dir": "/w"})["spark.sql.warehouse.dir"] == "/w"


def test_code_cache_keeps_its_default_size_under_a_c1_only_jit() -> None:
    """-XX:TieredStopAtLevel=1 alone shrinks HotSpot's code cache to 48 MB, which a long `cdc run`
    fills (then Spark's scheduler hangs): ours sets the size first, the pipeline's flags follow."""
    merged = with_user_conf(
        with_user_conf(base_conf("local[2]"), warehouse_conf(None)),
        {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"},
    )
    driver = merged["spark.driver.extraJavaOptions"].split()
    assert " ".join(driver[:2]) == JVM_OPTIONS == "-XX:ReservedCodeCacheSize=240m -XX:+ExitOnOutOfMemoryError"
    assert driver[-1] == "-XX:TieredStopAtLevel=1" and any(o.startswith("-Dderby") for o in driver)
    executor = with_user_conf(
        base_conf("spark://h:7077"), {"spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1"}
    )
    assert executor["spark.executor.extraJavaOptions"] == f"{JVM_OPTIONS} -XX:TieredStopAtLevel=1"
    # a pipeline's own size comes later on the command line: the JVM takes the last one
    mine = with_user_conf(
        base_conf("local[2]"), {"spark.driver.extraJavaOptions": "-XX:ReservedCodeCacheSize=512m"}
    )
    assert mine["spark.driver.extraJavaOptions"].split()[-1] == "-XX:ReservedCodeCacheSize=512m"


def _driver_options(short_lived: bool, spark: dict | None = None) -> list[str]:
    from sinks.registry import parse_pipeline

    pipeline = parse_pipeline(
        {
            "name": "p",
            "source": {"postgres": {"dsn": "dbname=x", "tables": ["public.t"]}},
            "spark": spark or {},
        }
    )
    return session_conf(pipeline, None, short_lived)["spark.driver.extraJavaOptions"].split()


def test_a_short_lived_verb_stops_the_jit_at_c1_and_the_pipeline_can_undo_it() -> None:
    """`apply --once`, verify, sql: C1 alone (SHORT_LIVED_JVM_OPTIONS); `cdc run` and a continuous
    apply keep both tiers; a pipeline's own -XX:TieredStopAtLevel comes after ours and wins."""
    assert SHORT_LIVED_JVM_OPTIONS == "-XX:TieredStopAtLevel=1"
    short = _driver_options(True)
    assert short[:2] == JVM_OPTIONS.split() and short[-1] == "-XX:TieredStopAtLevel=1", short
    assert not any("Tiered" in o for o in _driver_options(False))
    mine = _driver_options(True, {"conf": {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4"}})
    assert [o for o in mine if "Tiered" in o] == ["-XX:TieredStopAtLevel=1", "-XX:TieredStopAtLevel=4"]
