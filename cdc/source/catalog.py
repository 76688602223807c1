"""Reading the source's catalog: the server and the role connected, the tables a pipeline's
selectors name, and each table's columns, key and replica identity. Read-only."""

from __future__ import annotations

from collections.abc import Iterable

from cdc.ground.errors import SourceError
from cdc.ground.tables import TableName, TableSelector, quote_ident
from cdc.source.report import ColumnInfo, Problem, ServerInfo, TableInfo


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
        return Problem(
            f"table {selector} does not exist in {where}", "create it, or fix source.postgres.tables"
        )
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
