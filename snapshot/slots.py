"""Replication slots created together with an exported snapshot.

The exported snapshot is exactly the database state at the slot's consistent point: every
transaction that committed before it is visible, none after. It stays importable only while
the creating replication connection stays open and idle, so this is a context manager that
holds the connection until the copy workers have imported it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg2

from cdc.ground.errors import SourceError
from cdc.ground.lsn import parse_lsn
from cdc.source import connect, failover_unsupported


@dataclass(frozen=True)
class ExportedSnapshot:
    slot: str
    consistent_point: int
    snapshot_name: str


def require_failover_slots(server_version: int) -> None:
    problem = failover_unsupported(server_version)
    if problem is not None:
        raise SourceError(problem.what, problem.fix)


@contextmanager
def slot_with_snapshot(
    dsn: str, slot: str, *, temporary: bool, server_version: int, failover: bool = False
) -> Iterator[ExportedSnapshot]:
    """Create a pgoutput slot and export its snapshot. A temporary slot disappears with the connection.
    `failover`: a failover slot (PostgreSQL >= 17), which standbys with sync_replication_slots copy."""
    if failover and not temporary:
        require_failover_slots(server_version)
    conn = connect(dsn, replication=True, application_name=f"cdc snapshot {slot}")
    try:
        temp = " TEMPORARY" if temporary else ""
        # A temporary slot (a re-snapshot beside the pipeline's slot) lives for one connection: never a failover slot.
        options = ", FAILOVER true" if failover and not temporary else ""
        if server_version >= 150000:
            command = (
                f"CREATE_REPLICATION_SLOT \"{slot}\"{temp} LOGICAL pgoutput (SNAPSHOT 'export'{options})"
            )
        else:
            command = f'CREATE_REPLICATION_SLOT "{slot}"{temp} LOGICAL pgoutput EXPORT_SNAPSHOT'
        try:
            with conn.cursor() as cur:
                cur.execute(command)
                name, consistent_point, snapshot_name, _plugin = cur.fetchone()
        except psycopg2.Error as exc:
            message = (exc.pgerror or str(exc)).strip()
            if "all replication slots are in use" in message:
                raise SourceError(
                    f"cannot create replication slot {slot}: all replication slots are in use",
                    "drop an unused slot or raise max_replication_slots (ALTER SYSTEM ...; restart)",
                ) from None
            raise SourceError(f"cannot create replication slot {slot}: {message}") from None
        yield ExportedSnapshot(name, parse_lsn(consistent_point), snapshot_name)
    finally:
        conn.close()
