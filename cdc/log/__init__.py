"""Log backends (DESIGN.md §6).

`open_log` gives capture (snapshot, stream) its writer: the embedded log, which with
`log: kafka` is the staging log a publisher turns into Kafka topics. `open_log_view` gives
readers (apply, verify, status, log read) the log followers see: the embedded log, or the
Kafka topics (ours, or existing Debezium topics with `format: debezium`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc.ground.errors import LogError

if TYPE_CHECKING:
    from cdc.ground.config import Pipeline
    from cdc.log.kafka.debezium import DebeziumLogView
    from cdc.log.kafka.view import KafkaLogView
    from cdc.log.local import LocalLog


def open_log(pipeline: Pipeline, *, readonly: bool = False) -> LocalLog:
    from cdc.log.local import LocalLog

    local = pipeline.log_config.local
    synchronous = local.synchronous if local is not None else "full"
    log = LocalLog(pipeline.local_log_path, synchronous, readonly=readonly, command=pipeline.command)
    if local is not None and not readonly:
        # cuts stay while a follower of this pipeline needs them, up to the bound (cdc/log/holds.py)
        from cdc.log.holds import holds_reader

        sinks = [s.name for s in pipeline.sinks] + (["_views"] if pipeline.views else [])
        holds = holds_reader(pipeline.state_path, sinks, [v.name for v in pipeline.views])
        log.set_retention(
            local.keep_cuts, local.held_cuts_max, local.held_cuts_max_age_s, holds, pipeline.name
        )
    return log


def open_log_view(pipeline: Pipeline) -> LocalLog | KafkaLogView | DebeziumLogView:
    kafka = pipeline.log_config.kafka
    if kafka is not None and kafka.format == "debezium":
        from cdc.log.kafka.debezium import DebeziumLogView

        return DebeziumLogView(pipeline)
    if kafka is not None:
        from cdc.log.kafka.view import KafkaLogView

        return KafkaLogView(pipeline)
    return open_log(pipeline, readonly=True)


def empty_log_error(pipeline: Pipeline) -> LogError:
    """What `apply` and `verify` say when the log holds no cut yet, with the fix for its kind."""
    kafka = pipeline.log_config.kafka
    if kafka is not None and kafka.format == "debezium":  # the connector captures, not `cdc snapshot`
        return LogError(
            f"no complete cut in Debezium's topics under prefix {kafka.topic_prefix or pipeline.name!r} yet",
            "check that the connector runs and has finished its snapshot of the followed tables "
            "(its topics exist and hold the snapshot's last record), then run this again",
        )
    return LogError("the log is empty", f"run `{pipeline.command('snapshot')}` first")
