"""The replication slot and the connection to it: the checks before streaming from the slot, the
replication connection, telling a lost connection from an error, and reconnecting with backoff.

Slot problems are exit 3 (docs/concepts.md, exit codes): they raise `SourceError` with the fix.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import psycopg2
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from cdc.ground.errors import SourceError
from cdc.ground.lsn import format_lsn
from cdc.log.local import LocalLog
from cdc.source import connect, publication_names, slot_holder, slot_state, stream_application_name
from cdc.source.slots import _slot

logger = logging.getLogger(__name__)


class Stopped(Exception):
    """A stop was requested while waiting to reconnect."""


class SlotBusy(SourceError):
    """The slot is active on the server (another stream, or our old walsender still exiting)."""


class _Unreachable(Exception):
    """connect() could not reach the server (its SourceError, retried while reconnecting)."""


def _unreachable_as_retryable(fn: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        try:
            return fn()
        except SourceError as exc:
            if exc.problem.startswith("cannot connect to the source database"):
                raise _Unreachable(exc.problem) from None
            raise

    return call


def one_line(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    text = getattr(exc, "pgerror", None) or str(exc) or type(exc).__name__
    return " ".join(text.split())


def check_slot(conn, pipeline, log: LocalLog) -> None:
    """The slot exists and nobody streams from it."""
    slot = _slot(conn, pipeline.slot)
    if slot is None:
        if log.latest_cut() is None:
            raise SourceError(
                f"replication slot {pipeline.slot} does not exist yet",
                f"run `{pipeline.command('snapshot')}` first (it creates the slot at a consistent point)",
            )
        raise SourceError(
            f"replication slot {pipeline.slot} no longer exists (dropped, or invalidated and removed, or the "
            "source failed over to a standby without a copy of it: only failover slots of PostgreSQL 17 or later, "
            "source.postgres.failover: true, survive a failover); changes made since it went are not in the log",
            f"run `{pipeline.command('snapshot')}`: it creates the slot again and re-copies every table, "
            "then `cdc stream` continues from there",
        )
    state = slot_state(conn, pipeline.slot)
    if state is not None and state["wal_status"] == "lost":
        raise SourceError(
            f"replication slot {pipeline.slot} was invalidated (the server removed WAL it still needed, "
            "max_slot_wal_keep_size); changes since are not in the log",
            f"drop it (SELECT pg_drop_replication_slot('{pipeline.slot}');), then run "
            f"`{pipeline.command('snapshot')}` to re-copy every table",
        )
    if slot[2] is not None:
        raise SlotBusy(*slot_holder(conn, pipeline.slot, slot[2]))


def connect_catalog(pipeline):
    """The stream's ordinary connection: catalog reads, slot checks, TOAST read-backs."""
    return connect(pipeline.source.postgres.dsn, application_name="cdc stream catalog")


def start_replication(pipeline, catalog_conn) -> tuple[Any, Any]:
    """(replication connection, its cursor) streaming pgoutput from the pipeline's slot."""
    rconn = connect(
        pipeline.source.postgres.dsn,
        replication=True,
        application_name=stream_application_name(pipeline.name),
    )
    cur = rconn.cursor()
    cur.start_replication(
        slot_name=pipeline.slot,
        decode=False,
        options={
            "proto_version": "1",
            "publication_names": publication_names(catalog_conn, pipeline.publication),
            "messages": "true",
        },
        status_interval=pipeline.stream.status_interval_s,
    )
    return rconn, cur


def close_quietly(*conns) -> None:
    for conn in conns:
        if conn is not None:
            with contextlib.suppress(psycopg2.Error):
                conn.close()


def is_disconnected(exc: BaseException, *conns) -> bool:
    """A lost connection (server restart, terminated walsender, network) rather than an error
    that would happen again the same way."""
    if isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError):
        return True
    code = getattr(exc, "pgcode", None)
    if code is None or code[:2] in ("08", "57"):  # client-side (e.g. "no COPY in progress" after a
        return True  # server shutdown ended the stream), connection exception, operator intervention
    return any(c is not None and c.closed for c in conns)


def retry_connecting(
    attempt: Callable[[], Any], limit: float, pause: Callable[[float], None]
) -> tuple[Any, int]:
    """(what `attempt` returned, attempts made): `attempt` retried with bounded exponential backoff
    for up to `limit` seconds while the server is unreachable or the slot still busy; `pause` sleeps
    between attempts (and raises `Stopped` on a stop request, which passes through)."""
    attempts = 0

    def counted():
        nonlocal attempts
        attempts += 1
        return attempt()

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        logger.info(
            f"  reconnect attempt {state.attempt_number} failed ({one_line(error)}); next in {state.upcoming_sleep:.1f}s"
        )

    retrying = Retrying(
        retry=retry_if_exception_type(
            (psycopg2.OperationalError, psycopg2.InterfaceError, SlotBusy, _Unreachable)
        ),
        wait=wait_exponential(multiplier=0.5, min=0.5, max=15),
        stop=stop_after_delay(limit),
        sleep=pause,
        before_sleep=before_sleep,
        reraise=True,
    )
    try:
        return retrying(_unreachable_as_retryable(counted)), attempts
    except SlotBusy as busy:
        raise SourceError(
            f"could not resume the stream within {limit:g}s: {busy.problem}", busy.fix
        ) from None
    except (psycopg2.Error, _Unreachable) as last:
        raise SourceError(
            f"lost the connection to the source and could not reconnect within {limit:g}s "
            f"({attempts} attempts; last error: {one_line(last)})",
            "check that the server is up and reachable, then run `cdc stream` again: it resumes from the slot "
            "(nothing is lost); raise stream.reconnect_timeout_s to wait longer",
        ) from None


def confirmed_position(conn, slot: str) -> str:
    """The slot's confirmed flush LSN as text ('?' when the server does not say)."""
    state = slot_state(conn, slot)
    return (
        format_lsn(state["confirmed_flush_lsn"])
        if state and state["confirmed_flush_lsn"] is not None
        else "?"
    )
