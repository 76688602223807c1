"""`cdc log remove-table`: take a table out of the log (one dropped in the source, or one the
pipeline no longer captures). Followers keep what they have; later cuts no longer list it.
"""

from __future__ import annotations

import logging

from cdc.ground.config import Pipeline
from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName
from cdc.log import open_log
from cdc.source import connect
from cdc.source.slots import _slot
from cdc.tablewatch import catalog_oid

logger = logging.getLogger(__name__)


def remove_table(pipeline: Pipeline, text: str) -> None:
    try:
        table = TableName.parse(text)
    except ValueError as exc:
        raise UsageError(f"--table: {exc}") from None
    conn = connect(pipeline.source.postgres.dsn, application_name="cdc log remove-table")
    try:
        slot = _slot(conn, pipeline.slot)
        if slot is not None and slot[2] is not None:
            # A running stream may still write the table's changes (it knows the table's log id).
            raise UsageError(
                f"a `cdc stream` of pipeline {pipeline.name} is running (slot {pipeline.slot} is active)",
                "stop it, run `cdc log remove-table` again, then start it again",
            )
        exists = catalog_oid(conn, table) is not None
    finally:
        conn.close()
    log = open_log(pipeline)
    try:
        state = log.table_state(table)
        if state is None:
            raise UsageError(
                f"table {table} is not in the log of pipeline {pipeline.name}", "nothing to remove"
            )
        _check_removable(pipeline, table, state.state, exists)
        cut = log.remove_table(table)
        logger.info(f"removed {table} from the log (cut {cut.id}); followers keep their copy of it")
        if pipeline.log_config.kafka is not None:
            _publish(pipeline, log)
    finally:
        log.close()


def _check_removable(pipeline: Pipeline, table: TableName, state: str, exists: bool) -> None:
    """Refuse what the next `cdc stream` would undo or trip over: a table the file still names, or
    one a `schema.*` entry would capture again (into a table without a base no follower reads)."""
    selectors = pipeline.table_selectors
    if any(s.name is not None and s.matches(table) for s in selectors):
        raise UsageError(
            f"table {table} is still named in source.postgres.tables",
            "remove it from source.postgres.tables first, then run `cdc log remove-table` again",
        )
    if any(s.matches(table) for s in selectors):
        if exists:
            raise UsageError(
                f"table {table} exists in the source and a `{table.schema}.*` entry of source.postgres.tables selects it",
                "list the tables to capture by name instead of the `.*` entry, then run `cdc log remove-table` again",
            )
        if state != "dropped":
            raise UsageError(
                f"table {table} is not marked dropped in the log yet",
                f"run `cdc stream` until it says it marked {table} dropped, then `cdc log remove-table` again",
            )


def _publish(pipeline: Pipeline, log) -> None:
    """The Kafka log's next cut leaves the table out (its topic stays; delete it with Kafka's tools)."""
    from cdc.log.kafka.publisher import Publisher, publisher_lock

    with publisher_lock(log, wait=False) as held:
        if not held:
            logger.info("a running `cdc stream` publishes the new cut to Kafka")
            return
        publisher = Publisher(pipeline, log)
        try:
            publisher.publish_once()
        finally:
            publisher.close()
    logger.info("the Kafka log's latest cut no longer lists it (its topic is left as it is)")
