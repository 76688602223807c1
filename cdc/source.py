"""Connecting to the source PostgreSQL and checking that it can be captured.

Every check that fails produces a SourceError naming the problem and the exact statement
that fixes it. Nothing here changes the source.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

import psycopg2
import psycopg2.extensions
import psycopg2.extras
from psycopg2 import sql

from cdc.filters import (
    MIN_FILTER_VERSION,
    CaptureFilter,
    filter_problems,
    identity_columns,
    predicate_shape_problem,
    publication_member,
    resolve_filter,
    select_query,
)
from cdc.ground.config import SourceTableOptions
from cdc.ground.errors import PipelineFileError, SourceError
from cdc.ground.remedy import Command, placeholder
from cdc.ground.secrets import redact_with
from cdc.ground.tables import TableName, TableSelector, quote_ident
from cdc.session import libpq_options

MIN_SERVER_VERSION = 140000  # pgoutput streaming of truncates, logical messages, TID range scans


def _password_of(dsn: str) -> list[str]:
    try:
        return [psycopg2.extensions.parse_dsn(dsn).get("password", "")]
    except psycopg2.ProgrammingError:
        return []


def connect(dsn: str, *, replication: bool = False, application_name: str = "cdc", autocommit: bool = True):
    """Open a connection with our canonical session settings; turn failures into readable errors."""
    try:
        psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError as exc:
        raise PipelineFileError(
            f"source.postgres.dsn is not a valid connection string: {redact_with(str(exc).strip(), _password_of(dsn))}",
            "use a URI like postgresql://user:password@host:5432/dbname or key=value pairs",
        ) from None
    kwargs = {"options": libpq_options(), "connect_timeout": 10, "application_name": application_name}
    if replication:
        kwargs["connection_factory"] = psycopg2.extras.LogicalReplicationConnection
    try:
        conn = psycopg2.connect(dsn, **kwargs)
    except psycopg2.OperationalError as exc:
        message = redact_with(" ".join(str(exc).split()), _password_of(dsn))
        if "invalid" in message and (
            "connection option" in message or "value for parameter" in message or "integer value" in message
        ):
            raise PipelineFileError(
                f"source.postgres.dsn has an invalid value: {message}",
                "fix that parameter of the connection string",
            ) from None
        fix = "check host, port, user and password in source.postgres.dsn and that the server accepts connections"
        if "replication" in message and "pg_hba" in message:
            fix = "allow replication connections for this user in pg_hba.conf (host replication ... or host all ...)"
        raise SourceError(f"cannot connect to the source database: {message}", fix) from None
    if not replication:
        conn.autocommit = autocommit
    return conn


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    attnum: int
    type_oid: int
    typmod: int
    not_null: bool


@dataclass(frozen=True)
class TableInfo:
    table: TableName
    oid: int
    relkind: str
    replica_identity: str  # d(efault) n(othing) f(ull) i(ndex)
    columns: tuple[ColumnInfo, ...]
    key_columns: tuple[str, ...]  # empty when the table has no usable key
    key_source: str  # 'primary key' | 'replica identity index' | 'unique index' | ''
    can_select: bool
    owned: bool

    @property
    def insert_only(self) -> bool:
        """No key and the default (or no) replica identity: followed by its inserts (and truncates)
        only, keyed by log position, through the pipeline's insert-only publication."""
        return not self.key_columns and self.replica_identity in ("d", "n")


@dataclass
class ServerInfo:
    version: int
    version_text: str
    wal_level: str
    encoding: str
    max_replication_slots: int
    used_slots: int
    max_wal_senders: int
    used_wal_senders: int
    system_id: str
    database: str
    user: str
    superuser: bool
    replication_role: bool
    can_create_in_db: bool


@dataclass
class Problem:
    what: str
    fix: str


@dataclass
class CheckReport:
    server: ServerInfo | None = None
    tables: list[TableInfo] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # what of each table is captured (source.postgres.table_options, cdc/filters.py)
    filters: dict[TableName, CaptureFilter] = field(default_factory=dict)

    def raise_if_problems(self) -> None:
        if self.problems:
            raise SourceError(
                "the source database cannot be captured as configured:\n  - "
                + "\n  - ".join(p.what for p in self.problems),
                "\n       ".join(p.fix for p in self.problems),
            )


def server_info(conn) -> ServerInfo:
    with conn.cursor() as cur:
        cur.execute(
            """
            SELECT current_setting('server_version_num')::int, version(), current_setting('wal_level'),
                   current_setting('server_encoding'), current_setting('max_replication_slots')::int,
                   (SELECT count(*) FROM pg_replication_slots)::int,
                   current_setting('max_wal_senders')::int,
                   (SELECT count(*) FROM pg_stat_replication)::int,
                   (SELECT system_identifier::text FROM pg_control_system()),
                   current_database(), current_user, r.rolsuper,
                   -- Amazon RDS/Aurora grant replication by membership in rds_replication, not the attribute
                   r.rolreplication OR EXISTS (
                       SELECT FROM pg_roles g WHERE g.rolname = 'rds_replication' AND pg_has_role(r.oid, g.oid, 'MEMBER')
                   ),
                   has_database_privilege(current_database(), 'CREATE')
            FROM pg_roles r WHERE r.rolname = current_user
            """
        )
        row = cur.fetchone()
    return ServerInfo(*row)


def resolve_tables(conn, selectors: Iterable[TableSelector]) -> tuple[list[TableName], list[str]]:
    """Expand `schema.*`; return (tables found, selectors that matched nothing) in config order."""
    found: list[TableName] = []
    missing: list[str] = []
    with conn.cursor() as cur:
        for sel in selectors:
            if sel.name is None:
                cur.execute(
                    "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relkind IN ('r','p') AND NOT c.relispartition ORDER BY c.relname",
                    (sel.schema,),
                )
            else:
                cur.execute(
                    "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r','p','v','m','f')",
                    (sel.schema, sel.name),
                )
            rows = [TableName(s, n) for s, n in cur.fetchall()]
            if not rows:
                missing.append(str(sel))
            for t in rows:
                if t not in found:
                    found.append(t)
    return found, missing


def case_matches(conn, selector: TableSelector | TableName) -> list[str]:
    """Tables (or, for `schema.*`, schemas) the selector names when case is ignored, quoted as a
    pipeline file must write them: `Orders` folds to `orders`, which misses the table "Orders"."""
    name = getattr(selector, "name", None)
    with conn.cursor() as cur:
        if name is None:
            cur.execute(
                "SELECT nspname FROM pg_namespace WHERE lower(nspname) = lower(%s) AND nspname <> %s ORDER BY 1",
                (selector.schema, selector.schema),
            )
            return [f"{quote_ident(s)}.*" for (s,) in cur.fetchall()]
        cur.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE lower(n.nspname) = lower(%s) AND lower(c.relname) = lower(%s) AND c.relkind IN ('r','p','v','m','f') "
            "ORDER BY 1, 2",
            (selector.schema, name),
        )
        return [str(TableName(s, n)) for s, n in cur.fetchall()]


def missing_table(conn, selector: TableSelector | TableName, where: str) -> Problem:
    """`table X does not exist`, with a "did you mean" when only the case differs."""
    close = case_matches(conn, selector)
    if not close:
        return Problem(f"table {selector} does not exist in {where}", "create it, or fix source.postgres.tables")
    return Problem(
        f"table {selector} does not exist in {where}; did you mean {' or '.join(close)}?",
        f"quote mixed-case names in source.postgres.tables: '{close[0]}' (unquoted names fold to lower case, as in SQL; "
        "the single quotes keep YAML from reading the double ones)",
    )


def table_info(conn, table: TableName) -> TableInfo:
    with conn.cursor() as cur:
        cur.execute(
            """
            SELECT c.oid, c.relkind, c.relreplident, has_table_privilege(c.oid, 'SELECT'),
                   pg_has_role(c.relowner, 'USAGE')
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %s AND c.relname = %s
            """,
            (table.schema, table.name),
        )
        row = cur.fetchone()
        if row is None:
            problem = missing_table(conn, table, "the source database")
            raise SourceError(problem.what, problem.fix)
        oid, relkind, replident, can_select, owned = row
        cur.execute(
            """
            SELECT attname, attnum, atttypid, atttypmod, attnotnull FROM pg_attribute
            WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND attgenerated = ''
            ORDER BY attnum
            """,
            (oid,),
        )
        columns = tuple(ColumnInfo(*r) for r in cur.fetchall())
        key_columns, key_source = _key_of(cur, oid, replident, columns)
    return TableInfo(table, oid, relkind, replident, columns, key_columns, key_source, can_select, owned)


def _index_columns(cur, where: str, oid: int) -> list[tuple[str, list[str]]]:
    cur.execute(
        f"""
        SELECT i.indexrelid::regclass::text,
               array(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.ord),
               bool_and(a2.attnotnull)
        FROM pg_index i JOIN pg_attribute a2 ON a2.attrelid = i.indrelid AND a2.attnum = ANY(i.indkey)
        WHERE i.indrelid = %s AND {where} AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indisvalid
        GROUP BY i.indexrelid, i.indkey ORDER BY i.indexrelid::regclass::text
        """,
        (oid,),
    )
    return [(name, cols) for name, cols, not_null in cur.fetchall() if not_null]


def replica_index_without_key(conn, table: TableName) -> str | None:
    """The index named by REPLICA IDENTITY USING INDEX when it lacks a primary-key column of a table
    that has one, else None. PostgreSQL then sends deleted (or key-changed) rows' old values with
    that index's columns only, so the primary key the log keys rows by is missing."""
    with conn.cursor() as cur:
        cur.execute(
            """
            SELECT ri.indexrelid::regclass::text
            FROM pg_class c
            JOIN pg_index ri ON ri.indrelid = c.oid AND ri.indisreplident
            JOIN pg_index pk ON pk.indrelid = c.oid AND pk.indisprimary
            WHERE c.oid = to_regclass(%s) AND c.relreplident = 'i' AND NOT (pk.indkey::int2[] <@ ri.indkey::int2[])
            """,
            (str(table),),
        )
        row = cur.fetchone()
    return row[0] if row else None


def _key_of(cur, oid: int, replident: str, columns: tuple[ColumnInfo, ...]) -> tuple[tuple[str, ...], str]:
    """The columns that identify a row: primary key, else the replica identity index, else (with
    REPLICA IDENTITY FULL) a unique index on NOT NULL columns. No key -> ((), '')."""
    pk = _index_columns(cur, "i.indisprimary", oid)
    if pk:
        return tuple(pk[0][1]), "primary key"
    if replident == "i":
        ri = _index_columns(cur, "i.indisreplident", oid)
        if ri:
            return tuple(ri[0][1]), "replica identity index"
    if replident == "f":
        unique = _index_columns(cur, "i.indisunique", oid)
        if unique:
            return tuple(unique[0][1]), "unique index"
    return (), ""


def check_source(
    conn,
    selectors: list[TableSelector],
    slot: str,
    publication: str,
    dropped: Collection[TableName] = (),
    command: Command = placeholder,
    failover: bool = False,
    options: Mapping[TableName, SourceTableOptions] | None = None,
) -> CheckReport:
    """Run every check `cdc validate` reports; collect all problems rather than stopping at the first.
    `dropped`: tables the log knows were dropped in the source; naming one is a note, not a problem
    (the stream still has to pass their last changes, README "Schema changes")."""
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
        if not ti.key_columns and ti.replica_identity in ("d", "n"):
            # followed insert-only, keyed by log position, through the insert-only publication
            continue
        if not ti.key_columns:
            report.problems.append(
                Problem(
                    f"table {name} has no primary key"
                    + (
                        " (REPLICA IDENTITY FULL but no unique index on NOT NULL columns)"
                        if ti.replica_identity == "f"
                        else ""
                    ),
                    f"add one: ALTER TABLE {name} ADD PRIMARY KEY (...); or give it a unique index on NOT NULL columns "
                    f"and run ALTER TABLE {name} REPLICA IDENTITY USING INDEX <index>; or, to follow its inserts only, "
                    f"run ALTER TABLE {name} REPLICA IDENTITY DEFAULT; (updates and deletes of keyless REPLICA IDENTITY "
                    "FULL tables are not followed yet: docs/keyless-tables.md)",
                )
            )
    _check_filters(conn, report, info, options or {})
    _check_publication(conn, report, info, publication)
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
        names = ", ".join(map(str, chosen))
        report.problems.append(
            Problem(
                f"source.postgres.table_options ({names}) needs PostgreSQL 15 or later (publication column lists and "
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


def _check_publication(conn, report: CheckReport, info: ServerInfo, publication: str) -> None:
    """Can `cdc snapshot` create the publication or add the pipeline's tables to it, and does it
    publish partitioned tables as themselves? Each problem gets one statement that works as printed
    (the tool's own publications are FOR TABLE ... WITH (publish_via_partition_root = true))."""
    _check_insert_publication(conn, report, info, publication)
    tables = [t for t in report.tables if t.relkind in ("r", "p") and not t.insert_only]
    if not tables:
        return
    pub = quote_ident(publication)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT oid, pubviaroot, pg_has_role(pubowner, 'USAGE'), pg_get_userbyid(pubowner), puballtables "
            "FROM pg_publication WHERE pubname = %s",
            (publication,),
        )
        row = cur.fetchone()
    if row is None:
        others = [str(t.table) for t in tables if not t.owned]
        if info.superuser or (not others and info.can_create_in_db):
            return  # `cdc snapshot` creates it
        names = ", ".join(str(t.table) for t in tables)
        statement = f"CREATE PUBLICATION {pub} FOR TABLE {names} WITH (publish_via_partition_root = true);"
        if others:
            why = f"role {info.user} does not own {', '.join(others)}"
            fix = f"ask the tables' owner (or a superuser) to run {statement}"
        else:  # the role owns every table and only lacks CREATE on the database
            why = f"role {info.user} has no CREATE on database {info.database}"
            fix = (
                f"run GRANT CREATE ON DATABASE {quote_ident(info.database)} TO {quote_ident(info.user)}; "
                f"or, as a superuser, {statement}"
            )
        report.problems.append(
            Problem(f"publication {publication} does not exist and {why}, so it cannot create it", fix)
        )
        return
    pub_oid, via_root, own_pub, pub_owner, all_tables = row
    with conn.cursor() as cur:
        cur.execute("SELECT prrelid FROM pg_publication_rel WHERE prpubid = %s", (pub_oid,))
        members = {oid for (oid,) in cur.fetchall()}
        if info.version >= 150000:  # FOR TABLES IN SCHEMA
            cur.execute(
                "SELECT c.oid FROM pg_publication_namespace pn JOIN pg_class c ON c.relnamespace = pn.pnnspid "
                "WHERE pn.pnpubid = %s",
                (pub_oid,),
            )
            members |= {oid for (oid,) in cur.fetchall()}
    missing = [t for t in tables if not all_tables and t.oid not in members]
    cannot = [t for t in missing if not (info.superuser or (t.owned and own_pub))]
    if cannot:
        names = ", ".join(str(t.table) for t in missing)  # every missing table in one statement
        report.problems.append(
            Problem(
                f"{', '.join(str(t.table) for t in cannot)} not in publication {publication}, and role {info.user} "
                f"cannot add {'them' if len(cannot) > 1 else 'it'} (that needs ownership of the publication, "
                f"owned by {pub_owner}, and of the table)",
                f"ask the owner (or a superuser) to run ALTER PUBLICATION {pub} ADD TABLE {names};",
            )
        )
    if info.version >= 180000:
        _check_generated_columns(conn, report, info, publication, own_pub, pub_owner)
    if not via_root and any(t.relkind == "p" for t in tables):
        # Without it a partitioned table's changes are published under its partitions' names,
        # which the pipeline does not capture.
        who = "run" if own_pub or info.superuser else f"ask {pub_owner} (or a superuser) to run"
        parents = ", ".join(str(t.table) for t in tables if t.relkind == "p")
        report.problems.append(
            Problem(
                f"publication {publication} has publish_via_partition_root off, so changes of the partitioned "
                f"table(s) {parents} would come as changes of their partitions, which this pipeline does not capture",
                f"{who} ALTER PUBLICATION {pub} SET (publish_via_partition_root = true);",
            )
        )


def _check_insert_publication(conn, report: CheckReport, info: ServerInfo, publication: str) -> None:
    """Keyless tables: never in a publication of the pipeline that publishes updates or deletes
    (PostgreSQL would then refuse the application's own UPDATE and DELETE on them), and the
    insert-only publication can be created or has them (or the statement to run)."""
    keyless = [t for t in report.tables if t.relkind in ("r", "p") and t.insert_only]
    if not keyless:
        return
    inserts = insert_publication(publication)
    with conn.cursor() as cur:
        for t in keyless:
            cur.execute(
                "SELECT p.pubname FROM pg_publication p WHERE p.pubname = ANY(%s) AND (p.pubupdate OR p.pubdelete)"
                " AND p.oid IN (SELECT prpubid FROM pg_publication_rel WHERE prrelid = %s"
                " UNION SELECT oid FROM pg_publication WHERE puballtables)",
                ([publication, inserts], t.oid),
            )
            for (pub,) in cur.fetchall():
                report.problems.append(
                    Problem(
                        f"table {t.table} has no primary key and is in publication {pub}, which publishes updates "
                        "and deletes: PostgreSQL refuses UPDATE and DELETE on it until it has a replica identity",
                        f"run ALTER PUBLICATION {quote_ident(pub)} DROP TABLE {t.table}; (the pipeline follows it "
                        f"through publication {inserts}, inserts only), or give it a primary key",
                    )
                )
        cur.execute(
            "SELECT pg_has_role(pubowner, 'USAGE'), pg_get_userbyid(pubowner) FROM pg_publication WHERE pubname = %s",
            (inserts,),
        )
        row = cur.fetchone()
    names = ", ".join(str(t.table) for t in keyless)
    others = [str(t.table) for t in keyless if not t.owned]
    statement = f"CREATE PUBLICATION {quote_ident(inserts)} FOR TABLE {names} WITH (publish = 'insert, truncate');"
    if row is None and not (info.superuser or (not others and info.can_create_in_db)):
        report.problems.append(
            Problem(
                f"publication {inserts} (the insert-only publication for keyless tables) does not exist and role "
                f"{info.user} cannot create it",
                f"ask the tables' owner (or a superuser) to run {statement}",
            )
        )
    elif row is not None and not (info.superuser or (row[0] and not others)):
        present = _publication_tables(conn, inserts) or set()
        missing = [str(t.table) for t in keyless if t.table not in present]
        if missing:
            report.problems.append(
                Problem(
                    f"{', '.join(missing)} not in publication {inserts}, and role {info.user} cannot add them",
                    f"ask {row[1]} (or a superuser) to run ALTER PUBLICATION {quote_ident(inserts)} ADD TABLE {', '.join(missing)};",
                )
            )


def _check_generated_columns(
    conn, report: CheckReport, info: ServerInfo, publication: str, own_pub: bool, pub_owner: str
) -> None:
    """PostgreSQL 18 publishes stored generated columns when the publication says
    publish_generated_columns = stored. Followers get no generated columns on any major (the same
    follower schema whatever the source runs, and across an upgrade), and the snapshot, the column
    identity and verify all leave them out: a publication that sends them would give followers a
    column the snapshot never filled, so it is refused (the tool's own publications keep `none`)."""
    with conn.cursor() as cur:
        cur.execute("SELECT pubgencols FROM pg_publication WHERE pubname = %s", (publication,))
        row = cur.fetchone()
    if row is None or row[0] in ("n", None):
        return
    pub = quote_ident(publication)
    who = "run" if own_pub or info.superuser else f"ask {pub_owner} (or a superuser) to run"
    report.problems.append(
        Problem(
            f"publication {publication} has publish_generated_columns = stored: followers do not get generated "
            "columns (on any PostgreSQL version), and the snapshot leaves them out, so streamed rows would not match it",
            f"{who} ALTER PUBLICATION {pub} SET (publish_generated_columns = none);",
        )
    )


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


def _publication_tables(conn, publication: str) -> set[TableName] | None:
    """Tables in the publication, or None when it does not exist."""
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,))
        if cur.fetchone() is None:
            return None
        # pg_publication_tables names the partitions of a partitioned member when the publication
        # does not publish via the root; the member itself counts too (adding it again fails)
        cur.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s "
            "UNION SELECT n.nspname, c.relname FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
            "JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s",
            (publication, publication),
        )
        return {TableName(s, t) for s, t in cur.fetchall()}


def insert_publication(publication: str) -> str:
    """The pipeline's second publication, for keyless tables: it publishes inserts and truncates
    only, so PostgreSQL never asks for a replica identity on the application's UPDATE and DELETE
    (which it does for every table of a publication that publishes updates or deletes)."""
    return f"{publication[:55]}_inserts"


def publication_names(conn, publication: str) -> str:
    """pgoutput's publication_names: the main publication, plus the insert-only one when it exists
    (naming a publication that does not exist stops the stream)."""
    extra = insert_publication(publication)
    return f"{publication},{extra}" if _publication_tables(conn, extra) is not None else publication


def ensure_publication(
    conn, publication: str, tables: list[TableInfo], filters: Mapping[TableName, CaptureFilter] | None = None
) -> list[TableName]:
    """Create the publication, or add missing tables to it, each with its column list and row filter
    (`filters`); insert-only (keyless) tables go into the insert-only publication instead.
    Returns the tables added. (Changed filters of tables already in it: cdc.filters.set_filters.)"""
    keyless = [t for t in tables if t.insert_only]
    first = _publication_tables(conn, publication) is None
    added = _ensure(conn, publication, [t for t in tables if not t.insert_only], filters, "insert, update, delete, truncate")
    if keyless or first:  # made with the first: a stream started before a keyless table joins reads it too
        added += _ensure(conn, insert_publication(publication), keyless, filters, "insert, truncate")
    return added


def _ensure(
    conn, publication: str, tables: list[TableInfo], filters: Mapping[TableName, CaptureFilter] | None, publish: str
) -> list[TableName]:
    existing = _publication_tables(conn, publication)
    chosen = filters or {}
    idents = [publication_member(chosen.get(t.table) or CaptureFilter(t.table)) for t in tables]
    with conn.cursor() as cur:
        if existing is None:
            members = sql.SQL("FOR TABLE {} ").format(sql.SQL(", ").join(idents)) if idents else sql.SQL("")
            cur.execute(
                sql.SQL("CREATE PUBLICATION {} {}WITH (publish = {}, publish_via_partition_root = true)").format(
                    sql.Identifier(publication), members, sql.Literal(publish)
                )
            )
            return [t.table for t in tables]
        added = [t for t in tables if t.table not in existing]
        if added:
            cur.execute(
                sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                    sql.Identifier(publication),
                    sql.SQL(", ").join(publication_member(chosen.get(t.table) or CaptureFilter(t.table)) for t in added),
                )
            )
        return [t.table for t in added]


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
