"""Our `kafka` log's table topics read by Spark's Kafka source in batch mode, between a follower's
checkpoint and the cut (distributed over executors, never through the driver); the cut and the
schemas come from the plain-Python view (cdc.log.kafka.view.KafkaLogView)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc.log.history import FollowedSchema
from pipelines.apply.readers.envelopes import EnvelopeReader, kafka_frame, normalize_envelopes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from cdc.ground.tables import TableName
    from cdc.log.base import TableSchema
    from cdc.log.kafka.view import KafkaLogView


class KafkaReader(EnvelopeReader):
    def __init__(self, view: KafkaLogView):
        self.view = view

    def before_first(self, table: TableName) -> int:
        return self.view.table_meta(table)["base"] - 1

    def read_changes(
        self,
        spark: SparkSession,
        table: TableName,
        after: int,
        upto: int,
        schema: TableSchema | None = None,
        retired: frozenset[str] = frozenset(),
    ) -> DataFrame:
        view = self.view
        schema = schema or view.schema(table)
        topic = view.table_meta(table)["topic"]
        raw = kafka_frame(spark, view.cfg, topic, after + 1, upto + 1, headers=True)
        # Records carry their schema version (header cdc.sv): a value written before a rename is
        # found under the column's old name, and a retired column a version lacks is kept.
        history = view.schema_history(table)
        layouts = {v: FollowedSchema(schema, retired).layout(s) for v, _, s in history}
        names = {v: s.column_names for v, _, s in history}
        return normalize_envelopes(raw, schema, header_positions=True, versions=(layouts, names))
