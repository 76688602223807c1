"""Checking that the source can be captured as the pipeline file says (`cdc validate`, and every
verb before it starts): server settings, role, slots, tables, filters and publications. Every
problem names what is wrong and the exact statement that fixes it; nothing here changes the source."""

from __future__ import annotations

import shlex
from collections.abc import Collection, Mapping

import psycopg2
from psycopg2 import sql

from cdc.filters import (
    MIN_FILTER_VERSION,
    filter_problems,
    identity_columns,
    predicate_shape_problem,
    resolve_filter,
    select_query,
)
from cdc.ground.remedy import Command, placeholder
from cdc.ground.source_config import SourceTableOptions
from cdc.ground.tables import TableName, TableSelector, quote_ident
from cdc.source.catalog import missing_table, resolve_tables, server_info, table_info
from cdc.source.publications import check_publications, full_identity_notes
from cdc.source.report import CheckReport, Problem, ServerInfo
from cdc.source.slots import _slot, slot_holder

MIN_SERVER_VERSION = 140000  # pgoutput streaming of truncates, logical messages, TID range scans


def check_source(
    conn,
    selectors: list[TableSelector],
    slot: str,
    publication: str,
    dropped: Collection[TableName] = (),
    command: Command = placeholder,
    failover: bool = False,
    options: Mapping[TableName, SourceTableOptions] | None = None,
    followed: Collection[TableName] = (),
) -> CheckReport:
    """Run every check `cdc validate` reports; collect all problems rather than stopping at the first.
    `dropped`: tables the log knows were dropped in the source; naming one is a note, not a problem
    (the stream still has to pass their last changes, docs/schema-changes.md). `followed`: the
    tables the log follows (a keyless table's publication problem then has another fix)."""
    report = CheckReport()
    info = report.server = server_info(conn)
    who = quote_ident(info.user)
    if info.version < MIN_SERVER_VERSION:
        report.problems.append(
            Problem(f"PostgreSQL {info.version_text.split(',')[0]} is too old", "use PostgreSQL 14 or newer")
        )
    if info.wal_level != "logical":
        report.problems.append(
            Problem(
                f"wal_level is '{info.wal_level}', logical decoding needs 'logical'",
                "run ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL",
            )
        )
    if info.encoding != "UTF8":
        report.problems.append(
            Problem(
                f"the database encoding is {info.encoding}; the change stream is read as UTF-8",
                "capture a UTF8 database",
            )
        )
    if not (info.superuser or info.replication_role):
        report.problems.append(
            Problem(
                f"role {info.user} lacks the REPLICATION attribute",
                f"run ALTER ROLE {who} WITH REPLICATION; (on Amazon RDS or Aurora: GRANT rds_replication TO {who};)",
            )
        )
    slot_row = _slot(conn, slot)
    if slot_row is None and info.used_slots >= info.max_replication_slots:
        report.problems.append(
            Problem(
                f"all {info.max_replication_slots} replication slots are in use (max_replication_slots)",
                f"drop an unused slot with SELECT pg_drop_replication_slot('name'); or run "
                f"ALTER SYSTEM SET max_replication_slots = {info.max_replication_slots + 4}; and restart PostgreSQL",
            )
        )
    if slot_row is not None:
        plugin, database, active_pid = slot_row
        if plugin != "pgoutput" or database != info.database:
            report.problems.append(
                Problem(
                    f"replication slot {slot} exists but belongs to plugin {plugin!r} in database {database!r}",
                    "choose another source.postgres.slot, or drop that slot if it is unused",
                )
            )
        elif active_pid is not None:
            report.notes.append(slot_holder(conn, slot, active_pid)[0])
    if failover:
        _check_failover(conn, report, info, slot, slot_row is not None)
    if info.used_wal_senders >= info.max_wal_senders:
        report.problems.append(
            Problem(
                f"all {info.max_wal_senders} WAL senders are busy (max_wal_senders)",
                f"run ALTER SYSTEM SET max_wal_senders = {info.max_wal_senders + 4}; and restart PostgreSQL",
            )
        )

    tables, missing = resolve_tables(conn, selectors)
    gone = {str(t) for t in dropped}
    for sel in missing:
        if sel in gone:
            report.notes.append(
                f"table {sel} was dropped in the source; its changes up to the drop are in the log (remove it from "
                f"source.postgres.tables, and from the log with `{command('log remove-table', '--table', shlex.quote(sel), '--yes')}` "
                "once followers have applied them)"
            )
            continue
        selector = next(s for s in selectors if str(s) == sel)
        report.problems.append(missing_table(conn, selector, f"database {info.database}"))
    for table in tables:
        ti = table_info(conn, table)
        report.tables.append(ti)
        name = str(table)
        if ti.relkind not in ("r", "p"):
            report.problems.append(
                Problem(f"{name} is not a table (relkind {ti.relkind!r})", "capture the underlying tables")
            )
            continue
        if not ti.can_select:
            report.problems.append(
                Problem(
                    f"role {info.user} cannot SELECT from {name}", f"run GRANT SELECT ON {name} TO {who};"
                )
            )
        if not ti.key_columns and ti.replica_identity in ("d", "n", "f"):
            # followed insert-only (default identity, through the insert-only publication), or as a
            # multiset of rows identified by content (FULL): each change keyed by its log position
            continue
        if not ti.key_columns:
            report.problems.append(
                Problem(
                    f"table {name} has no primary key (REPLICA IDENTITY USING INDEX without a usable key)",
                    f"add one: ALTER TABLE {name} ADD PRIMARY KEY (...); or run ALTER TABLE {name} REPLICA IDENTITY FULL; "
                    f"(rows identified by content) or ALTER TABLE {name} REPLICA IDENTITY DEFAULT; (inserts only): "
                    "docs/keyless-tables.md",
                )
            )
    _check_filters(conn, report, info, options or {})

    def snapshot(t: TableName) -> str:
        return command("snapshot", "--tables", shlex.quote(str(t)))

    check_publications(conn, report, info, publication, followed, snapshot)
    full_identity_notes(conn, report, publication, snapshot)
    return report


def _check_filters(
    conn, report: CheckReport, info: ServerInfo, options: Mapping[TableName, SourceTableOptions]
) -> None:
    """Column lists and row filters (cdc/filters.py): PostgreSQL's rules, checked before anything
    changes at the source; the resolved filters go on the report."""
    by_table = {t.table: t for t in report.tables}
    for table, ti in by_table.items():
        report.filters[table] = resolve_filter(table, options.get(table), [c.name for c in ti.columns])
    chosen = {t: o for t, o in options.items() if t in by_table}
    if not chosen:
        return
    if info.version < MIN_FILTER_VERSION:
        listed = ", ".join(map(str, chosen))
        report.problems.append(
            Problem(
                f"source.postgres.table_options ({listed}) needs PostgreSQL 15 or later (publication column lists and "
                f"row filters); the source runs {info.version // 10000}",
                "remove source.postgres.table_options from the pipeline file, or upgrade the source to PostgreSQL 15 or later",
            )
        )
        return
    for table, opts in chosen.items():
        ti = by_table[table]
        names = [c.name for c in ti.columns]
        with conn.cursor() as cur:
            cur.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped"
                " AND attgenerated <> ''",
                (ti.oid,),
            )
            generated = [r[0] for r in cur.fetchall()]
        identity = identity_columns(ti.replica_identity, ti.key_columns, names)
        found = filter_problems(table, opts, names, generated, ti.replica_identity, identity)
        report.problems.extend(Problem(what, fix) for what, fix in found)
        if opts.where is not None and predicate_shape_problem(opts.where) is None:
            # PostgreSQL itself says whether the predicate is a valid boolean expression over the table
            key = f"source.postgres.table_options.{table}.where"
            try:
                with conn.cursor() as cur:
                    cur.execute(sql.SQL("{} LIMIT 0").format(select_query(table, names[:1], opts.where)))
            except psycopg2.Error as exc:
                message = (exc.pgerror or str(exc)).strip().splitlines()[0]
                report.problems.append(
                    Problem(
                        f"{key}: the row filter of table {table} is not valid: {message}",
                        f"correct {key} (a boolean SQL expression over the columns of {table})",
                    )
                )


def failover_unsupported(version: int) -> Problem | None:
    """`source.postgres.failover: true` needs PostgreSQL 17 (failover slots, sync_replication_slots)."""
    if version >= 170000:
        return None
    return Problem(
        f"source.postgres.failover: true needs PostgreSQL 17 or later (the source runs {version // 10000}): before 17 "
        "a replication slot exists on the primary only, and a failover to a standby loses it (the stream then "
        "stops with 'replication slot ... no longer exists')",
        "remove failover: true from the pipeline file; after a failover, point source.postgres.dsn at the new primary "
        "and run `cdc snapshot` (it creates the slot there and re-copies every table)",
    )


def _check_failover(conn, report: CheckReport, info: ServerInfo, slot: str, exists: bool) -> None:
    problem = failover_unsupported(info.version)
    if problem is not None:
        report.problems.append(problem)
        return
    if not exists:
        return  # `cdc snapshot` creates it as a failover slot
    with conn.cursor() as cur:
        cur.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        row = cur.fetchone()
    if row is not None and not row[0]:
        report.notes.append(
            f"replication slot {slot} is not a failover slot yet (it was created without source.postgres.failover): "
            "`cdc stream` makes it one when it starts (ALTER_REPLICATION_SLOT ... (FAILOVER true))"
        )
