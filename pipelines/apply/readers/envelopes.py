"""What the two Kafka readers (our topics, Debezium's) share: a batch read of one topic partition
with Spark's Kafka source, change event envelopes -> the readers' rows (base.SCHEMA), and
count_events / first_offset_from answered from read_changes."""

from __future__ import annotations

import json
from abc import abstractmethod
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from cdc.envelope import UNAVAILABLE, UNAVAILABLE_BYTES
from cdc.log.kafka import client as kc
from pipelines.apply.readers import base

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from cdc.ground.log_config import KafkaLog
    from cdc.ground.tables import TableName
    from cdc.log.base import Column as LogColumn
    from cdc.log.base import TableSchema

PLACEHOLDERS = [UNAVAILABLE, UNAVAILABLE_BYTES]
RETIRED = ""  # no column has this name: PostgreSQL rejects zero-length identifiers
ENVELOPE_SCHEMA = "struct<before: map<string,string>, after: map<string,string>, op: string, source: struct<lsn: bigint, txId: bigint, ts_ms: bigint, ts_us: bigint>>"


def kafka_frame(
    spark: SparkSession,
    kafka: KafkaLog | str | list[str],
    topic: str,
    start: int | str,
    stop: int | str,
    headers: bool = False,
) -> DataFrame:
    """Records of partition 0 of `topic` with start <= offset < stop (an offset, or Spark's
    "earliest" / "latest"), read in executors."""

    def bound(v: int | str) -> str:
        return v if isinstance(v, str) else json.dumps({topic: {"0": v}})

    reader = (
        spark.read.format("kafka")
        .options(**kc.spark_options(kafka))  # bootstrap servers and the log's security settings
        .option("assign", json.dumps({topic: [0]}))
        .option("startingOffsets", bound(start))
        .option("endingOffsets", bound(stop))
    )
    if headers:
        reader = reader.option("includeHeaders", "true")
    if isinstance(start, int) and isinstance(stop, int) and stop - start > base.EVENTS_PER_PARTITION:
        # Spark's Kafka source reads a topic partition's range in one task unless asked for more
        reader = reader.option("minPartitions", str(-(-(stop - start) // base.EVENTS_PER_PARTITION)))
    return reader.option("failOnDataLoss", "false").load()  # compaction leaves gaps in offsets by design


class EnvelopeReader(base.ChangeReader):
    """count_events and first_offset_from by reading the events (the topics hold no index)."""

    @abstractmethod
    def before_first(self, table: TableName) -> int:
        """The offset just before the table's first event in the log."""

    def _positions(self, spark: SparkSession, table: TableName, after: int, upto: int) -> DataFrame:
        return self.read_changes(spark, table, after, upto).select("off", "lsn", F.col("op"))

    def count_events(
        self, spark: SparkSession, table: TableName, after: int, upto: int, below_lsn: int
    ) -> int:
        return self._positions(spark, table, after, upto).filter(F.col("lsn") < below_lsn).count()

    def first_offset_from(self, spark: SparkSession, table: TableName, lsn: int, upto: int) -> int | None:
        row = (
            self._positions(spark, table, self.before_first(table), upto)
            .filter((F.col("lsn") >= lsn) & (F.col("op") != "r"))
            .agg(F.min("off"))
            .first()
        )
        return row[0] if row else None


def header(name: str) -> Column:
    """A Kafka record header's value as a string (NULL when the record lacks it)."""
    return F.filter("headers", lambda h: h["key"] == name)[0]["value"].cast("string")


def _names_by_version(
    schema: TableSchema, layouts: dict[int, list[int]], names: dict[int, list[str]]
) -> Column:
    """Per record, from its schema version (header cdc.sv): the name each followed column has in
    it where that differs (a rename), RETIRED for a retired column the version lacks, NULL where
    the newest name applies; NULL for a version without such columns. One literal map, looked up
    once per record: the plan stays the same size however long the table's DDL history (a when()
    per version and column made a table with 156 versions OOM the driver while planning)."""
    table: dict[str, list[str | None]] = {}
    for v, layout in layouts.items():
        row: list[str | None] = []
        for j, column in enumerate(schema.columns):
            i = layout[j]
            row.append(names[v][i] if i >= 0 and names[v][i] != column.name else RETIRED if i == -2 else None)
        if any(x is not None for x in row):
            table[str(v)] = row
    if not table:
        return F.lit(None).cast("array<string>")
    literal = F.from_json(F.lit(json.dumps(table)), "map<string,array<string>>")
    return F.try_element_at(literal, header("cdc.sv"))


def normalize_envelopes(
    raw: DataFrame,
    schema: TableSchema,
    header_positions: bool,
    versions: tuple[dict[int, list[int]], dict[int, list[str]]] | None = None,
) -> DataFrame:
    """Kafka records (key, value, offset, headers) holding change event envelopes -> the log's
    normalized change rows: off, lsn, seq, op, key, vals (envelope JSON texts aligned with the
    schema's columns; fast defaults for columns a record lacks), unch, ts. `versions` gives, per
    schema version, FollowedSchema.layout and the version's column names, for records whose
    version (header cdc.sv) names a column differently or lacks a retired one."""

    def lookup(name: str, column: LogColumn) -> Column:
        return F.when(F.map_contains_key("row", name), F.col("row")[name]).otherwise(
            F.lit(column.missing).cast("string")
        )

    def text(j: int, column: LogColumn) -> Column:
        expr = lookup(column.name, column)
        if not versions:
            return expr
        # The record's own name for the column (a rename), RETIRED, or NULL: the newest name applies
        name = F.col("sv_names")[j]
        retired = F.when(F.col("op") == "u", F.lit(UNAVAILABLE)).otherwise(expr)  # an insert gets NULL
        return F.when(name.isNull(), expr).when(name == RETIRED, retired).otherwise(F.col("row")[name])

    env = F.from_json(F.col("value").cast("string"), ENVELOPE_SCHEMA)
    key_map = F.from_json(F.col("key").cast("string"), "map<string,string>")
    extra = [_names_by_version(schema, *versions).alias("sv_names")] if versions else []
    df = raw.select("offset", "key", "value", "headers", env.alias("env"), key_map.alias("key_map"), *extra)
    op = F.when(F.col("value").isNull(), F.lit("d")).otherwise(F.col("env.op"))
    row = F.when(op == "d", F.coalesce(F.col("env.before"), F.col("key_map"))).otherwise(F.col("env.after"))
    df = df.select("*", op.alias("op"), row.alias("row"))
    texts = [text(j, c) for j, c in enumerate(schema.columns)]
    placeholder = F.array(*(F.lit(p) for p in PLACEHOLDERS))
    vals = F.array(*texts) if texts else F.array().cast("array<string>")
    n = len(schema.columns)
    df = df.select("*", vals.alias("raw_vals"))
    unch = F.filter(
        F.sequence(F.lit(0), F.lit(max(n - 1, 0))),
        lambda i: F.array_contains(placeholder, F.element_at("raw_vals", i + 1)),
    )
    cleaned = F.transform(
        "raw_vals", lambda v: F.when(F.array_contains(placeholder, v), F.lit(None)).otherwise(v)
    )
    if header_positions:
        lsn, seq, ts = (
            header("cdc.lsn").cast("bigint"),
            header("cdc.seq").cast("bigint"),
            header("cdc.ts").cast("bigint"),
        )
    else:
        lsn, seq, ts = F.col("env.source.lsn"), F.lit(0).cast("bigint"), F.col("env.source.ts_ms") * 1000
    return df.select(
        F.col("offset").alias("off"),
        lsn.alias("lsn"),
        seq.alias("seq"),
        F.col("op"),
        F.col("key"),
        F.when(F.col("op") == "t", F.lit(None)).otherwise(cleaned).alias("vals"),
        F.when(F.col("op") == "t", F.array().cast("array<int>")).otherwise(unch).alias("unch"),
        ts.alias("ts"),
    )
