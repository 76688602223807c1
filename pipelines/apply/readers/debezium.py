"""Existing Debezium topics read by Spark (`log: {kafka: {format: debezium}}`): each table topic's
records between a follower's checkpoint and the cut, in executors. The cut, the tables and their
schemas come from the plain-Python view (cdc.log.kafka.debezium.DebeziumLogView, whose docstring
derives the positions used here).

Positions: a stream event whose transaction's END record is in the transaction topic gets
(END's LSN - 1, total_order); one without gets (source.lsn, 1); a snapshot row (source.lsn, 0).
Tombstones are skipped. Malformed records stop the batch naming topic, partition and offset, or,
with `dead_letter: <path>`, are parked in a Delta table there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.errors import LogError
from pipelines.apply.readers.base import SCHEMA
from pipelines.apply.readers.envelopes import EnvelopeReader, kafka_frame, normalize_envelopes
from sinks.sparktypes import nested_array

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from cdc.ground.tables import TableName
    from cdc.log.base import TableSchema
    from cdc.log.kafka.debezium import DebeziumLogView


class DebeziumReader(EnvelopeReader):
    def __init__(self, view: DebeziumLogView):
        self.view = view
        self._ends_df: DataFrame | None = None

    def close(self) -> None:
        if self._ends_df is not None:
            with contextlib.suppress(Exception):
                self._ends_df.unpersist()
            self._ends_df = None

    def before_first(self, table: TableName) -> int:
        return -1  # Debezium's topics are the table's whole history (its cut ranges start at 0)

    def _kafka(self, spark: SparkSession, topic: str, start: int | str, stop: int | str) -> DataFrame:
        return kafka_frame(spark, self.view.cfg, topic, start, stop)

    def _transaction_ends(self, spark: SparkSession) -> DataFrame | None:
        """xid, end_lsn, prev_end_lsn (the previous END of the same xid: xids wrap around) of every
        END record up to the cut; None without the transaction topic."""
        last_end = self.view.cut_end_offset()
        if last_end is None:
            return None
        if self._ends_df is None:
            raw = self._kafka(spark, self.view.txn_topic, "earliest", last_end + 1)
            text = F.col("value").cast("string")
            body = F.coalesce(F.get_json_object(text, "$.payload"), text)
            doc = F.from_json(body, "struct<status: string, id: string>")
            ends = raw.select(F.col("offset"), doc.alias("d")).filter(F.col("d.status") == "END")
            ident = F.split(F.col("d.id"), ":")
            ends = ends.select(
                F.col("offset"),
                ident[0].cast("bigint").alias("xid"),
                F.element_at(ident, 2).cast("bigint").alias("end_lsn"),
            )
            by_xid = Window.partitionBy("xid").orderBy("offset")
            ends = ends.select(
                "xid", "end_lsn", F.coalesce(F.lag("end_lsn").over(by_xid), F.lit(-1)).alias("prev_end_lsn")
            )
            self._ends_df = ends.persist()
        return self._ends_df

    def read_changes(
        self,
        spark: SparkSession,
        table: TableName,
        after: int,
        upto: int,
        schema: TableSchema | None = None,
        retired: frozenset[str] = frozenset(),
    ) -> DataFrame:
        # `retired` is not used: the schema comes from the source's catalog, one version, no history.
        view = self.view
        schema = schema or view.schema(table)
        topic = view.topic(table)
        if upto <= after or topic not in view.existing_topics():
            return spark.createDataFrame([], SCHEMA)
        view.check_retained(topic, after)
        raw = self._kafka(spark, topic, after + 1, upto + 1)
        checked = self._checked(spark, raw, topic, after, upto)
        ends = self._transaction_ends(spark)
        env = F.col("env")
        snapshot_row = env["op"] == "r"
        if ends is not None:
            joined = checked.join(
                F.broadcast(ends),
                (checked["env"]["source"]["txId"] == ends["xid"])
                & (ends["prev_end_lsn"] < checked["env"]["source"]["lsn"])
                & (checked["env"]["source"]["lsn"] < ends["end_lsn"]),
                "left",
            )
        else:
            joined = checked.select("*", F.lit(None).cast("bigint").alias("end_lsn"))
        in_txn = env["transaction"]["total_order"].isNotNull() & F.col("end_lsn").isNotNull()
        lsn = (
            F.when(snapshot_row, env["source"]["lsn"])
            .when(in_txn, F.col("end_lsn") - 1)
            .otherwise(env["source"]["lsn"])
        )
        seq = (
            F.when(snapshot_row, F.lit(0)).when(in_txn, env["transaction"]["total_order"]).otherwise(F.lit(1))
        )
        ts = F.coalesce(env["source"]["ts_us"], env["source"]["ts_ms"] * 1000, F.lit(0))

        def header(name, value):
            return F.struct(F.lit(name).alias("key"), value.cast("string").cast("binary").alias("value"))

        shaped = joined.select(
            F.col("offset"),
            F.col("key_text").cast("binary").alias("key"),
            F.col("body").cast("binary").alias("value"),
            F.array(header("cdc.lsn", lsn), header("cdc.seq", seq), header("cdc.ts", ts)).alias("headers"),
        )
        return _millis_to_micros(normalize_envelopes(shaped, schema, header_positions=True), schema)

    def _checked(self, spark: SparkSession, raw: DataFrame, topic: str, after: int, upto: int) -> DataFrame:
        """Parsed records without tombstones; malformed ones stop the batch or go to the dead-letter table."""
        vtext = F.col("value").cast("string")
        body = F.coalesce(F.get_json_object(vtext, "$.payload"), vtext)
        ktext = F.col("key").cast("string")
        key_text = F.coalesce(F.get_json_object(ktext, "$.payload"), ktext)
        env = F.from_json(
            body,
            "struct<op: string, before: map<string,string>, after: map<string,string>, "
            "source: struct<lsn: bigint, txId: bigint, ts_ms: bigint, ts_us: bigint, snapshot: string>, "
            "transaction: struct<total_order: bigint>>",
        )
        key_map = F.from_json(key_text, "map<string,string>")
        df = raw.filter(F.col("value").isNotNull()).select(
            "topic",
            "partition",
            "offset",
            "key",
            "value",
            body.alias("body"),
            key_text.alias("key_text"),
            env.alias("env"),
            key_map.alias("key_map"),
        )
        op = F.col("env.op")
        reason = (
            F.when(
                F.col("env").isNull() | (op.isNull() & F.col("env.source").isNull()),
                F.lit("value is not a change event (not JSON, or no op/source)"),
            )
            .when(op.isNull(), F.lit("no `op`"))
            .when(~op.isin("c", "u", "d", "r", "t"), F.concat(F.lit("unknown op "), op))
            .when(F.col("env.source.lsn").isNull(), F.lit("no source.lsn (no position)"))
            .when(F.col("key").isNull() & (op != "t"), F.lit("no key"))
            .when(F.col("key").isNotNull() & F.col("key_map").isNull(), F.lit("key is not a JSON object"))
            .when(op.isin("c", "u", "r") & F.col("env.after").isNull(), F.lit("no `after` row"))
        )
        df = df.select("*", reason.alias("bad"))
        [summary] = df.agg(  # a global aggregate: one row
            F.count(F.col("bad")).alias("n"),
            F.min_by(F.struct("offset", "bad"), F.when(F.col("bad").isNotNull(), F.col("offset"))).alias(
                "first"
            ),
        ).collect()
        if summary["n"]:
            first = summary["first"]
            where = f"Kafka topic {topic} partition 0 offset {first['offset']}"
            dead_letter = self.view.cfg.dead_letter
            if not dead_letter:
                raise LogError(
                    f"malformed record in {where}: {first['bad']} ({summary['n']} malformed record(s) in offsets {after + 1}..{upto}); "
                    "nothing was applied",
                    "fix the producer of these records, or set log.kafka.dead_letter to a Delta table path to park "
                    "malformed records there and apply the rest",
                )
            self._park(spark, dead_letter, df.filter(F.col("bad").isNotNull()))
        return df.filter(F.col("bad").isNull())

    def _park(self, spark: SparkSession, dead_letter: str, bad: DataFrame) -> None:
        """MERGE malformed records into the dead-letter Delta table (once per topic/partition/offset)."""
        from delta.tables import DeltaTable

        path = str(self.view.pipeline.path(dead_letter))
        rows = bad.select(
            "topic",
            "partition",
            "offset",
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").alias("value"),
            F.col("bad").alias("reason"),
            F.current_timestamp().alias("parked_at"),
        )
        if not DeltaTable.isDeltaTable(spark, path):
            rows.limit(0).write.format("delta").mode("ignore").save(path)
        target = DeltaTable.forPath(spark, path)
        (
            target.alias("t")
            .merge(rows.alias("s"), "t.topic = s.topic AND t.partition = s.partition AND t.offset = s.offset")
            .whenNotMatchedInsertAll()
            .execute()
        )


def _millis_to_micros(df: DataFrame, schema: TableSchema) -> DataFrame:
    """Debezium's adaptive time precision writes timestamp(0..3) as milliseconds
    (io.debezium.time.Timestamp); the envelope (and from_envelope) use microseconds."""
    from cdc.schema import schema_types

    types = schema_types(schema)
    fixes: dict[int, Callable[[Column], Column]] = {}
    for i, col in enumerate(schema.columns):
        t = types[col.type_oid]
        elem = t.element if t.kind == "array" and t.element is not None else t
        if elem.kind != "base" or elem.name != "timestamp" or not 0 <= col.typmod <= 3:
            continue
        if elem is t:
            fixes[i] = lambda v: (v.cast("bigint") * 1000).cast("string")
        else:
            depth = max(col.ndims, 1)
            as_long = nested_array(T.LongType(), depth)

            def scale(x: Column, d: int) -> Column:
                return x * 1000 if d == 0 else F.transform(x, lambda y: scale(y, d - 1))

            def fix(v: Column, depth: int = depth, as_long: T.ArrayType = as_long) -> Column:
                return F.to_json(scale(F.from_json(v, as_long), depth))

            fixes[i] = fix
    if not fixes:
        return df
    vals = F.transform("vals", lambda v, i: _select_fix(v, i, fixes))
    return df.withColumn("vals", F.when(F.col("vals").isNull(), F.col("vals")).otherwise(vals))


def _select_fix(v: Column, i: Column, fixes: dict[int, Callable[[Column], Column]]) -> Column:
    out = v
    for index, fix in fixes.items():
        out = F.when((i == index) & v.isNotNull(), fix(v)).otherwise(out)
    return out
