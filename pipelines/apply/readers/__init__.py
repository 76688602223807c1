"""The Spark readers of every log, one module per backend: `local` (the embedded log, through the
`cdclog` data source), `kafka` (our topics), `debezium` (a Debezium connector's topics), and what
the two Kafka ones share (`envelopes`). `change_reader(view)` gives the reader of a log view
(cdc.log.open_log_view); the view itself stays plain Python (cuts, tables, schemas, state).
`copyfiles` is verify's reader of its source copy, not a log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipelines.apply.readers.base import SCHEMA, ChangeReader

if TYPE_CHECKING:
    from cdc.log.kafka.debezium import DebeziumLogView
    from cdc.log.kafka.view import KafkaLogView
    from cdc.log.local import LocalLog

__all__ = ["SCHEMA", "ChangeReader", "change_reader"]


def change_reader(view: LocalLog | KafkaLogView | DebeziumLogView) -> ChangeReader:
    """The Spark reader of a log view. Close it (it may cache in Spark) before the view."""
    # Imported on use: a local log's reader needs no Kafka client.
    from cdc.log.local import LocalLog

    if isinstance(view, LocalLog):
        from pipelines.apply.readers.local import LocalReader

        return LocalReader(view)
    from cdc.log.kafka.debezium import DebeziumLogView

    if isinstance(view, DebeziumLogView):
        from pipelines.apply.readers.debezium import DebeziumReader

        return DebeziumReader(view)
    from cdc.log.kafka.view import KafkaLogView

    if isinstance(view, KafkaLogView):
        from pipelines.apply.readers.kafka import KafkaReader

        return KafkaReader(view)
    raise TypeError(f"no Spark reader for a {type(view).__name__}")
