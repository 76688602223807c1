"""The SparkSession's configuration (pipelines/spark.py) sized from the master URL."""

from __future__ import annotations

import os

import pytest

from pipelines.spark import master_cores

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
