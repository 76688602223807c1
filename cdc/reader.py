"""`cdc stream` as a function: `run_stream` opens the pipeline's log (with `log: kafka`, also the
publisher child) and runs a `StreamReader` (cdc/stream/) over it."""

from __future__ import annotations

import logging

from cdc.ground.errors import CdcError
from cdc.rebase import Rebaser
from cdc.stream.reader import StreamReader, StreamStats

logger = logging.getLogger(__name__)


def run_stream(
    pipeline,
    *,
    until: str | int | None = None,
    rebaser: Rebaser | None = None,
) -> StreamStats:
    """`cdc stream`. With `log: kafka` a publisher child process turns the staging log into
    Kafka topics while we read, and acknowledgements to PostgreSQL wait for Kafka's.
    `rebaser` re-snapshots tables rewritten without change events (snapshot/rebase.py); without
    one the stream only warns about them (cdc/rebase.py)."""
    from cdc.log import open_log

    log = open_log(pipeline)
    publisher = None
    try:
        ack_limit = None
        check_publisher = None
        if pipeline.log_config.kafka is not None:
            from cdc.log.kafka.child import PublisherProcess, PublishWatch, check_broker
            from cdc.log.kafka.publisher import published_lsn

            check_broker(pipeline)
            publisher = PublisherProcess(pipeline)
            publisher.start()
            log.on_commit = publisher.wake  # each cut is published as soon as it is durable
            ack_limit = lambda: published_lsn(log)  # noqa: E731
            watch = PublishWatch(pipeline, log)  # says when the broker is away, and when it is back

            def check_publisher() -> None:
                publisher.check()
                watch.check()

        reader = StreamReader(
            pipeline,
            log,
            until=until,
            ack_limit=ack_limit,
            check_publisher=check_publisher,
            rebaser=rebaser,
        )
        return reader.run()
    finally:
        if publisher is not None:
            publisher.stop()
        log.close()


__all__ = ["CdcError", "StreamReader", "StreamStats", "run_stream"]
