"""A batch's net changes as the rows a search follower's executors write: `write_frame` lays the Spark
rows out (JSON-ready columns, position, op, unchanged-TOAST flags), `Row` decodes one on an executor
into a document's id, version and values; `default_values` gives a fast column default as documents
hold it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.errors import SinkError
from sinks.changes import Batch, NetChanges
from sinks.search.documents import doc_id, show_key
from sinks.search.json_values import encoder, to_wire


def encoders(layout: RowLayout) -> list[Callable[[Any], Any] | None]:
    return [encoder(t) for t in layout.dtypes]


# ---- the batch as rows for executors -------------------------------------------------------------
@dataclass(frozen=True)
class RowLayout:
    """How `write_frame` lays out a row: c0..cN-1 (source columns, JSON-ready), lsn, seq, op,
    then one unchanged-TOAST flag per toastable column (`flags`: column index -> row index)."""

    table: str
    names: tuple[str, ...]
    dtypes: tuple[T.DataType, ...]
    key: tuple[int, ...]
    flags: tuple[tuple[int, int], ...]

    @property
    def lsn(self) -> int:
        return len(self.names)

    @property
    def seq(self) -> int:
        return len(self.names) + 1

    @property
    def op(self) -> int:
        return len(self.names) + 2


def write_frame(spark: SparkSession, batch: Batch, changes: NetChanges) -> tuple[DataFrame, RowLayout]:
    schema = batch.spark_schema
    names = [f.name for f in schema.fields]
    if any(isinstance(f.dataType, T.TimestampNTZType) or _ntz_array(f.dataType) for f in schema.fields):
        zone = spark.conf.get("spark.sql.session.timeZone")
        if zone not in ("UTC", "Etc/UTC", "Z", "+00:00", "GMT"):
            raise SinkError(
                f"{batch.table}: timestamp columns need Spark's session time zone UTC (it is {zone})",
                "remove spark.sql.session.timeZone from spark.conf in the pipeline file",
            )
    cols = [
        to_wire(F.col(f"`{n.replace('`', '``')}`"), f.dataType).alias(f"c{i}")
        for i, (n, f) in enumerate(zip(names, schema.fields, strict=True))
    ]
    cols += [F.col("_cdc_lsn"), F.col("_cdc_seq"), F.col("_cdc_op")]
    flags = []
    for i, name in enumerate(names):
        flag = changes.unchanged.get(name)
        if flag is not None:
            flags.append((i, len(cols)))
            cols.append(F.col(flag))
    layout = RowLayout(
        str(batch.table),
        tuple(names),
        tuple(f.dataType for f in schema.fields),
        # a keyless (insert-only) table's document id is its position: the row's lsn and seq
        tuple(names.index(k) for k in batch.schema.key) or (len(names), len(names) + 1),
        tuple(flags),
    )
    return changes.df.select(*cols), layout


def default_values(spark: SparkSession, batch: Batch) -> dict[str, Any]:
    """The batch's columns with a fast default (`ADD COLUMN ... DEFAULT <constant>`) -> that value
    as a document holds it (`write_frame`'s wire value, then `encoder`), for the documents written
    before the column existed (one Spark job for all of them; {} when there are none)."""
    fields = [f for f in batch.spark_schema.fields if f.name in batch.defaults]
    if not fields:
        return {}
    [row] = (
        spark.range(1)
        .select(
            *(
                to_wire(batch.default_value(f.name).cast(f.dataType), f.dataType).alias(f"d{i}")
                for i, f in enumerate(fields)
            )
        )
        .collect()
    )
    values = {}
    for i, f in enumerate(fields):
        enc, wire = encoder(f.dataType), row[f"d{i}"]
        values[f.name] = wire if enc is None or wire is None else enc(wire)
    return values


def _ntz_array(dtype: T.DataType) -> bool:
    while isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    return isinstance(dtype, T.TimestampNTZType)


class Row:
    """One net change, decoded on an executor (`encoders(layout)` gives `codecs`)."""

    __slots__ = ("id", "key", "lsn", "op", "seq", "unchanged", "values", "version")
    id: str
    key: list[Any]
    lsn: int
    op: str
    seq: int
    unchanged: tuple[str, ...]  # columns whose unchanged TOAST value the document keeps
    values: dict[str, Any] | None  # None: a delete
    version: int

    def __init__(self, layout: RowLayout, codecs: list[Callable[[Any], Any] | None], raw: tuple) -> None:
        self.lsn = raw[layout.lsn]
        self.seq = raw[layout.seq]
        self.op = raw[layout.op]
        self.version = 2 * self.lsn + (1 if self.seq > 0 else 0)  # version(lsn, seq), inlined: hot path
        key = []
        for i in layout.key:
            value, enc = raw[i], codecs[i] if i < len(codecs) else None  # past the columns: the position
            key.append(value if enc is None or value is None else enc(value))
        self.key = key
        self.id = doc_id(key)
        if self.op == "d":
            self.values = None
            self.unchanged = ()
            return
        values = {}
        for name, enc, value in zip(layout.names, codecs, raw):  # noqa: B905 - raw has meta columns after
            values[name] = value if enc is None or value is None else enc(value)
        self.values = values
        self.unchanged = tuple(layout.names[i] for i, pos in layout.flags if raw[pos]) if layout.flags else ()

    def show_key(self, layout: RowLayout) -> str:
        return show_key([(*layout.names, "_cdc_lsn", "_cdc_seq")[i] for i in layout.key], self.key)
