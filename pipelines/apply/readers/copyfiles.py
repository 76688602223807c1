"""Not a log: the COPY text files `cdc verify` writes of the source at its verification point,
read by Spark through the Python data source `cdccopy` (registered on first use: readers.base.python_source); a small
file by the same reader in the driver (`copy_rows`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pipelines.apply.readers.base import python_source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SCHEMA = "vals array<string>"
# A file of at most this many bytes is read in the driver and handed to Spark as a local relation:
# no Python worker and no planning round trip for the data source (most tables `cdc verify`
# compares are small: their check costs Spark's fixed work, not the rows).
DRIVER_READ_BYTES = 4 << 20


def copy_rows(spark: SparkSession, path: Path) -> DataFrame:
    """A COPY file's rows (SCHEMA), read in the driver when small, else by executors."""
    if path.stat().st_size > DRIVER_READ_BYTES:
        return python_source(spark, CopyFileSource).option("paths", json.dumps([str(path)])).load()
    import pyarrow as pa

    values = [row[0] for row in CopyFileReader([str(path)]).read(CopyFiles(str(path)))]
    table = pa.table({"vals": pa.array(values, type=pa.list_(pa.string()))})
    return spark.createDataFrame(table, schema=SCHEMA)


class CopyFiles(InputPartition):
    def __init__(self, path: str):
        self.path = path


class CopyFileSource(DataSource):
    """COPY text files (as `COPY ... TO STDOUT` wrote them) as rows of text values:
    spark.read.format("cdccopy").option("paths", json list).load() -> vals array<string>, key binary.
    Used by `cdc verify` to bring a source snapshot into Spark through the same typing as apply."""

    @classmethod
    def name(cls) -> str:
        return "cdccopy"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> CopyFileReader:
        return CopyFileReader(json.loads(self.options["paths"]))


class CopyFileReader(DataSourceReader):
    def __init__(self, paths: list[str]):
        self.paths = paths

    def partitions(self) -> list[InputPartition]:
        return [CopyFiles(p) for p in self.paths]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        from cdc.keys import unescape

        assert isinstance(partition, CopyFiles)
        with open(partition.path, "rb") as f:
            for line in f:
                fields = line.rstrip(b"\n").split(b"\t")
                yield ([None if x == b"\\N" else unescape(x).decode() for x in fields],)
