"""A chunked snapshot's WAL watermarks (snapshot/chunked.py): logical messages written around each
chunk's read, whether the pipeline's role may write them, and whether the stream has passed one."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import psycopg2

from cdc.ground.errors import SourceError
from cdc.ground.lsn import parse_lsn
from cdc.ground.tables import TableName

if TYPE_CHECKING:
    from cdc.log.local import LocalLog

WATERMARK_PREFIX = "cdc_watermark"
EMIT_SQL = "SELECT pg_logical_emit_message(true, %s, %s)"


def emit_watermark(conn, table: TableName, chunk: int, mark: str, *, first: bool = False) -> int:
    """Write a watermark into the WAL (autocommit: its own transaction); returns its LSN. `first`:
    the snapshot's first low watermark, the position of the table's new base: wait until what
    committed before it is visible (later chunks need no wait: a change committed before their
    low watermark but not visible to their read comes after that base in the log anyway)."""
    body = json.dumps({"table": str(table), "chunk": chunk, "mark": mark})
    try:
        with conn.cursor() as cur:
            cur.execute(EMIT_SQL, (WATERMARK_PREFIX, body))
            lsn = parse_lsn(cur.fetchone()[0])
    except psycopg2.errors.InsufficientPrivilege:
        conn.rollback()
        problem = watermark_right(conn) or (
            "the pipeline's role may not write WAL watermarks",
            "snapshot.mode: exported",
        )
        raise SourceError(f"chunked snapshot of {table}: {problem[0]}", problem[1]) from None
    if first:
        _wait_for_older_transactions(conn)
    return lsn


def _wait_for_older_transactions(conn) -> None:
    """Block until every transaction in progress now has ended. A transaction's commit record can
    be in the WAL before the transaction is visible to new snapshots; after this wait, everything
    that committed before the watermark is visible to the next chunk's read."""
    with conn.cursor() as cur:
        cur.execute("SELECT array_agg(x::text) FROM pg_snapshot_xip(pg_current_snapshot()) x")
        running = cur.fetchone()[0] or []
        while running:
            cur.execute(
                "SELECT array_agg(x) FROM unnest(%s::xid8[]) x WHERE pg_xact_status(x) = 'in progress'",
                (running,),
            )
            running = [str(x) for x in cur.fetchone()[0] or []]
            if running:
                time.sleep(0.02)


def watermark_right(conn) -> tuple[str, str] | None:
    """(problem, fix) when the connected role may not write watermarks (EXECUTE on
    pg_logical_emit_message, which PostgreSQL grants to PUBLIC unless an administrator revoked it)."""
    with conn.cursor() as cur:
        # the text variant by its arguments, not a fixed signature: PostgreSQL 17 added a 4th (flush)
        cur.execute(
            "SELECT current_user, p.oid::regprocedure::text, has_function_privilege(p.oid, 'EXECUTE')"
            " FROM pg_proc p WHERE p.proname = 'pg_logical_emit_message'"
            " AND p.pronamespace = 'pg_catalog'::regnamespace AND p.proargtypes[2] = 'text'::regtype"
        )
        user, signature, allowed = cur.fetchone()
    if allowed:
        return None
    return (
        f"role {user} may not execute pg_logical_emit_message, which chunked snapshots write their WAL watermarks with",
        f"GRANT EXECUTE ON FUNCTION {signature} TO {user}; (or snapshot.mode: exported)",
    )


def stream_covers(log: LocalLog, lsn: int) -> bool:
    """Whether the log holds every transaction of the source committed up to watermark `lsn`.
    pg_logical_emit_message returns the end of the message's record, which is where its own
    transaction's commit record starts: the watermark transaction commits exactly at `lsn`."""
    position = log.stream_position()
    return position is not None and position[0] >= lsn
