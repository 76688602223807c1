"""The SparkSession's configuration (pipelines/spark.py) sized from the master URL."""

from __future__ import annotations

import os

import pytest

from pipelines.spark import master_cores, warehouse_conf, with_user_conf

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
