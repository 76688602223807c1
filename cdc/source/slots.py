"""The pipeline's replication slot: who holds it, its state and lag, making it a failover slot;
and the source's WAL positions it is measured against."""

from __future__ import annotations

import os
import re
import socket

from cdc.ground.tables import quote_ident
from cdc.source.connection import connect

_STREAM_APP = re.compile(r"^cdc stream (\d+)@(\S+) (.*)$")


def stream_application_name(pipeline_name: str) -> str:
    """application_name of `cdc stream`'s replication connection. It names our process and host
    so that whoever finds the slot in use can say which process holds it (PostgreSQL keeps 63 bytes,
    so the pid and host come first)."""
    return f"cdc stream {os.getpid()}@{socket.gethostname()} {pipeline_name}"[:63]


def slot_holder(conn, slot: str, active_pid: int) -> tuple[str, str]:
    """(problem, fix) for a slot in use by server process `active_pid`: which `cdc stream` (process
    and host) holds it when the walsender's application_name says so, else what the server knows."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT application_name, client_addr::text, backend_start FROM pg_stat_activity WHERE pid = %s",
            (active_pid,),
        )
        row = cur.fetchone()
    app, addr, since = row if row else (None, None, None)
    match = _STREAM_APP.match(app or "")
    started = f" since {since:%Y-%m-%d %H:%M:%S %Z}".rstrip() if since else ""
    terminate = f"SELECT pg_terminate_backend({active_pid});"
    if match:
        pid, host, name = match.groups()
        return (
            f"replication slot {slot} is in use by `cdc stream` process {pid} on host {host} (pipeline {name}; "
            f"server process {active_pid}{started})",
            f"stop that process first (on {host}: kill -TERM {pid}, or stop the `cdc run` that started it); "
            f"if that host is gone, end its server process with {terminate}",
        )
    client = f", application_name {app!r}" if app else ""
    client += f", client {addr}" if addr else ""
    return (
        f"replication slot {slot} is in use by server process {active_pid}{client}{started} (not a `cdc stream` of ours)",
        f"find the client with SELECT pid, application_name, client_addr, backend_start FROM pg_stat_activity "
        f"WHERE pid = {active_pid}; stop it, or end it with {terminate}",
    )


def _slot(conn, slot: str) -> tuple[str, str, int | None] | None:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT plugin, database, active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )
        return cur.fetchone()


def make_failover_slot(dsn: str, slot: str) -> bool:
    """Turn an existing slot into a failover slot (PostgreSQL >= 17); False if it already is one.
    Needs a replication connection and the slot not in use (`cdc stream` does it before streaming)."""
    conn = connect(dsn, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            row = cur.fetchone()
    finally:
        conn.close()
    if row is None or row[0]:
        return False
    repl = connect(dsn, replication=True, application_name=f"cdc stream {slot} failover")
    try:
        with repl.cursor() as cur:
            cur.execute(f"ALTER_REPLICATION_SLOT {quote_ident(slot)} (FAILOVER true)")
    finally:
        repl.close()
    return True


def current_wal_lsn(conn) -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint")
        return int(cur.fetchone()[0])


def flushed_wal_lsn(conn) -> int:
    """A WAL position that every transaction committed so far lies before, flushed so the
    walsender can reach it. Commits made with synchronous_commit=off return to their client
    before their WAL is written, so a small logical-decoding message is committed
    synchronously first (it flushes everything before it) and its position is the answer."""
    was = conn.autocommit
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            cur.execute("SET LOCAL synchronous_commit = on")
            cur.execute("SELECT (pg_logical_emit_message(true, 'cdc', 'until current') - '0/0')::bigint")
            lsn = int(cur.fetchone()[0])
        conn.commit()
    finally:
        conn.autocommit = was
    return lsn


def slot_state(conn, slot: str) -> dict | None:
    with conn.cursor() as cur:
        cur.execute(
            """
            SELECT (confirmed_flush_lsn - '0/0')::bigint, (restart_lsn - '0/0')::bigint, active_pid,
                   (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, (pg_current_wal_lsn() - restart_lsn)::bigint,
                   wal_status
            FROM pg_replication_slots WHERE slot_name = %s
            """,
            (slot,),
        )
        row = cur.fetchone()
    if row is None:
        return None
    keys = (
        "confirmed_flush_lsn",
        "restart_lsn",
        "active_pid",
        "lag_bytes",
        "retained_wal_bytes",
        "wal_status",
    )
    return dict(zip(keys, row, strict=True))
