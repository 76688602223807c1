"""The source PostgreSQL: connecting to it, reading its catalog, checking that it can be
captured, and the pipeline's publications and replication slot there.

  connection.py    connect() with the canonical session settings and readable failures
  catalog.py       reads the server, the role, the tables selectors name, each table's columns and key
  report.py        what a look found: ServerInfo, TableInfo, and a check's problems (each with its fix)
  checks.py        every check `cdc validate` reports (check_source)
  publications.py  the pipeline's publications: checked, named, created or extended
  slots.py         the replication slot (holder, state, failover) and WAL positions

Every check that fails produces a problem naming what is wrong and the exact statement that
fixes it. Only ensure_publication and make_failover_slot change the source.
"""

from __future__ import annotations

from cdc.source.catalog import (
    case_matches,
    missing_table,
    replica_index_without_key,
    resolve_tables,
    server_info,
    table_info,
)
from cdc.source.checks import MIN_SERVER_VERSION, check_source, failover_unsupported
from cdc.source.connection import connect
from cdc.source.publications import (
    ensure_publication,
    followed_insert_only,
    in_publication,
    insert_publication,
    publication_names,
    switched_to_default,
)
from cdc.source.report import CheckReport, ColumnInfo, Problem, ServerInfo, TableInfo
from cdc.source.slots import (
    current_wal_lsn,
    flushed_wal_lsn,
    make_failover_slot,
    slot_holder,
    slot_state,
    stream_application_name,
)

__all__ = [
    "MIN_SERVER_VERSION",
    "CheckReport",
    "ColumnInfo",
    "Problem",
    "ServerInfo",
    "TableInfo",
    "case_matches",
    "check_source",
    "connect",
    "current_wal_lsn",
    "ensure_publication",
    "failover_unsupported",
    "flushed_wal_lsn",
    "followed_insert_only",
    "in_publication",
    "insert_publication",
    "make_failover_slot",
    "missing_table",
    "publication_names",
    "replica_index_without_key",
    "resolve_tables",
    "server_info",
    "slot_holder",
    "slot_state",
    "stream_application_name",
    "switched_to_default",
    "table_info",
]
