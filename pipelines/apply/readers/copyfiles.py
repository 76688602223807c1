"""Not a log: the COPY text files `cdc verify` writes of the source at its verification point,
read by Spark through the Python data source `cdccopy` (registered by pipelines.spark)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition


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
        return "vals array<string>"

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
