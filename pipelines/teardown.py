"""`cdc teardown`: remove what the pipeline created (followers' data is never touched)."""

from __future__ import annotations

import logging

from psycopg2 import sql

from cdc import ddl
from cdc.ground.config import Pipeline
from cdc.ground.errors import SourceError
from cdc.ground.tables import quote_ident
from cdc.source import connect, insert_publication, slot_holder
from cdc.source.slots import _slot
from pipelines.ddl import remove as remove_ddl_capture
from pipelines.teardown_data import find_topics, finish_topics, left_in_place, remove_captured

logger = logging.getLogger(__name__)


def run_teardown(pipeline: Pipeline, drop_slot: bool, delete_topics: bool = False) -> None:
    topics = find_topics(pipeline, delete_topics)  # before any change: --delete-topics needs the broker
    if drop_slot:
        conn = connect(pipeline.source.postgres.dsn, application_name="cdc teardown")
        try:
            _drop_source_objects(conn, pipeline)
        finally:
            conn.close()
    # the log, the kafka staging log, snapshot segments, checkpoints, view state, scratch: every
    # captured byte under state_dir but a follower's own directory (pipelines/teardown_data.py)
    remove_captured(pipeline)
    finish_topics(topics, delete_topics)
    if not drop_slot:
        logger.info(
            f"kept replication slot {pipeline.slot} and publication {pipeline.publication} on the source: the slot "
            "holds back WAL until it is dropped (`cdc teardown --drop-slot`)"
        )
    logger.info(left_in_place(pipeline))


def _drop_source_objects(conn, pipeline: Pipeline) -> None:
    """Check every right first and change nothing unless all steps can be done; then drop the
    publication before the slot, so that a run stopped half-way is finished by running it again
    (a missing publication or slot is skipped)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT current_user, r.rolsuper OR r.rolreplication FROM pg_roles r WHERE r.rolname = current_user"
        )
        user, can_replicate = cur.fetchone()
        cur.execute(
            "SELECT pg_get_userbyid(pubowner), pg_has_role(pubowner, 'USAGE') FROM pg_publication WHERE pubname = %s",
            (pipeline.publication,),
        )
        publication = cur.fetchone()
        inserts = insert_publication(pipeline.publication)  # keyless tables' (docs/keyless-tables.md)
        cur.execute(
            "SELECT pg_get_userbyid(pubowner), pg_has_role(pubowner, 'USAGE') FROM pg_publication WHERE pubname = %s",
            (inserts,),
        )
        inserts_pub = cur.fetchone()
    slot = _slot(conn, pipeline.slot)
    problems: list[tuple[str, str]] = []
    if slot is not None and slot[2] is not None:
        problems.append(slot_holder(conn, pipeline.slot, slot[2]))
    if slot is not None and not can_replicate:
        problems.append(
            (
                f"role {user} cannot drop replication slot {pipeline.slot} (it lacks REPLICATION)",
                f"ask a superuser to run SELECT pg_drop_replication_slot('{pipeline.slot}');",
            )
        )
    drop_pub = f"DROP PUBLICATION {quote_ident(pipeline.publication)};"
    if publication is not None and not publication[1]:
        problems.append(
            (
                f"role {user} cannot drop publication {pipeline.publication} (owned by {publication[0]})",
                f"ask {publication[0]} (or a superuser) to run {drop_pub}",
            )
        )
    if inserts_pub is not None and not inserts_pub[1]:
        problems.append(
            (
                f"role {user} cannot drop publication {inserts} (owned by {inserts_pub[0]})",
                f"ask {inserts_pub[0]} (or a superuser) to run DROP PUBLICATION {quote_ident(inserts)};",
            )
        )
    if problems:
        raise SourceError(
            "nothing was changed: " + "; ".join(p for p, _ in problems),
            " ".join(f for _, f in problems) + " Then run the same `cdc teardown --drop-slot` again.",
        )
    if not ddl.trigger_state(conn, pipeline.name).absent:
        remove_ddl_capture(conn, pipeline)  # its triggers name the publication about to go
    with conn.cursor() as cur:
        if publication is not None:
            cur.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(pipeline.publication)))
            logger.info(f"dropped publication {pipeline.publication}")
        if inserts_pub is not None:
            cur.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(inserts)))
            logger.info(f"dropped publication {inserts}")
        if slot is not None:
            cur.execute("SELECT pg_drop_replication_slot(%s)", (pipeline.slot,))
            logger.info(f"dropped replication slot {pipeline.slot}")
