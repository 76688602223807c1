"""Source-side column lists and row filters (`source.postgres.table_options`,
docs/choosing-what-is-captured.md).

One resolved CaptureFilter per table is used everywhere rows leave PostgreSQL, so they agree:
the publication (a column list and a row filter, PostgreSQL 15 or later: excluded data never
reaches the WAL sender's output), the snapshot's COPY and `cdc verify`'s read of the source
(`select_query`). PostgreSQL's rules are checked before anything changes at the source
(`filter_problems`): an UPDATE/DELETE publication's row filter may use replica identity columns
only, and its column list must keep them (else PostgreSQL refuses the table's UPDATEs and DELETEs).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import psycopg2
from psycopg2 import sql

from cdc.ground.errors import SourceError
from cdc.ground.source_config import SourceTableOptions
from cdc.ground.tables import TableName, quote_ident

MIN_FILTER_VERSION = 150000  # publication column lists and row filters


@dataclass(frozen=True)
class CaptureFilter:
    """What of one table is captured: `columns` (in table order; None: every column) and rows
    matching `where` (None: every row)."""

    table: TableName
    columns: tuple[str, ...] | None = None
    where: str | None = None

    @property
    def active(self) -> bool:
        return self.columns is not None or self.where is not None

    def keeps(self, column: str) -> bool:
        return self.columns is None or column in self.columns

    def describe(self) -> str:
        parts = []
        if self.columns is not None:
            parts.append(f"columns ({', '.join(self.columns)})")
        if self.where is not None:
            parts.append(f"rows WHERE {self.where}")
        return " and ".join(parts) or "every column and row"


def resolve_filter(
    table: TableName, options: SourceTableOptions | None, column_names: Sequence[str]
) -> CaptureFilter:
    """The filter of `table` whose (non-generated) columns are `column_names` in table order.
    `exclude_columns` becomes an explicit list: a publication column list names what it keeps, so
    a column added to the table later is not captured until the publication is set again."""
    if options is None:
        return CaptureFilter(table)
    columns: tuple[str, ...] | None = None
    if options.columns is not None:
        chosen = set(options.columns)
        columns = tuple(c for c in column_names if c in chosen)
    elif options.exclude_columns is not None:
        excluded = set(options.exclude_columns)
        columns = tuple(c for c in column_names if c not in excluded)
    return CaptureFilter(table, columns, options.where)


# ---- PostgreSQL's rules (pure) --------------------------------------------------------------------------
_TOKEN = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|[A-Za-z_][A-Za-z0-9_$]*|\$\$|.""", re.S)


def predicate_columns(predicate: str, column_names: Iterable[str]) -> list[str]:
    """Columns of the table that `predicate` names, in the order they first appear. String literals
    are skipped; "quoted" identifiers keep their case, plain ones fold to lower case (as in SQL)."""
    names = set(column_names)
    found: list[str] = []
    for token in _TOKEN.findall(predicate):
        if token.startswith("'"):
            continue
        name = token[1:-1].replace('""', '"') if token.startswith('"') else token.lower()
        if name in names and name not in found:
            found.append(name)
    return found


def predicate_shape_problem(predicate: str) -> str | None:
    """Why `predicate` cannot be one SQL expression put inside parentheses (checked before it goes
    into any statement), or None."""
    depth = 0
    for token in _TOKEN.findall(predicate):
        if token == ";":
            return "it contains ';' (a row filter is one expression, not statements)"
        if token == "$$":
            return "dollar-quoted text is not allowed in a row filter"
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
            if depth < 0:
                return "it has a ')' without its '('"
        elif token in ("'", '"'):  # a quote the string/identifier patterns could not close
            return "it has an unterminated quote"
    if depth:
        return "it has a '(' without its ')'"
    return None


def _option_key(table: TableName, option: str) -> str:
    return f"source.postgres.table_options.{table}.{option}"


def filter_problems(
    table: TableName,
    options: SourceTableOptions,
    column_names: Sequence[str],
    generated: Sequence[str],
    replica_identity: str,
    identity_columns: Sequence[str],
) -> list[tuple[str, str]]:
    """(problem, fix) for every rule `options` break on a table with these (non-generated) columns,
    replica identity kind (d/i/f/n) and identity columns (for `f`: every column)."""
    problems: list[tuple[str, str]] = []
    listed = [("columns", c) for c in options.columns or []] + [
        ("exclude_columns", c) for c in options.exclude_columns or []
    ]
    known = set(column_names)
    for option, column in listed:
        if column in known:
            continue
        key = _option_key(table, option)
        if column in generated:
            problems.append(
                (
                    f"{key}: column {column} of table {table} is a generated column, which is never captured "
                    "(rule: only stored, non-generated columns are published)",
                    f"remove {column} from {key}",
                )
            )
            continue
        close = difflib.get_close_matches(column, list(column_names), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(
            (
                f"{key}: table {table} has no column {column!r}{hint} (rule: a column list names columns of the table)",
                f"correct the name in {key}; the columns of {table} are {', '.join(map(quote_ident, column_names))}",
            )
        )
    captured = resolve_filter(table, options, column_names)
    if captured.columns is not None:
        left_out = [c for c in identity_columns if c not in captured.columns]
        option = "columns" if options.columns is not None else "exclude_columns"
        key = _option_key(table, option)
        if replica_identity == "f" and left_out:
            problems.append(
                (
                    f"{key}: table {table} has REPLICA IDENTITY FULL, so every column is part of its replica identity and "
                    f"none can be left out (rule: a publication's column list must keep the replica identity columns, "
                    f"else PostgreSQL refuses UPDATE and DELETE on the table); left out: {', '.join(left_out)}",
                    f"give {table} a primary key and run ALTER TABLE {table} REPLICA IDENTITY DEFAULT; or remove {key}",
                )
            )
        else:
            for column in left_out:
                verb = "add it to" if option == "columns" else "remove it from"
                problems.append(
                    (
                        f"{key}: column {column} of table {table} is a key (replica identity) column and cannot be left "
                        f"out (rule: a publication's column list must keep the replica identity columns, else PostgreSQL "
                        "refuses UPDATE and DELETE on the table; the log keys rows on them)",
                        f"{verb} {key}",
                    )
                )
    if options.where is not None:
        key = _option_key(table, "where")
        shape = predicate_shape_problem(options.where)
        if shape:
            problems.append(
                (f"{key}: the row filter of table {table} is not valid: {shape}", f"correct {key}")
            )
        elif replica_identity != "f":
            allowed = set(identity_columns)
            for column in predicate_columns(options.where, column_names):
                if column not in allowed:
                    problems.append(
                        (
                            f"{key}: the row filter of table {table} uses column {column}, which is not part of its replica "
                            f"identity ({', '.join(identity_columns) or 'none'}) (rule: a row filter of a publication that "
                            "publishes UPDATE and DELETE may use replica identity columns only)",
                            f"filter on the key columns only, or make {column} part of the replica identity, e.g. "
                            f"ALTER TABLE {table} REPLICA IDENTITY FULL; (every update and delete then carries the whole old "
                            "row; no column can be left out then)",
                        )
                    )
    return problems


# ---- SQL ----------------------------------------------------------------------------------------------
def select_query(
    table: TableName,
    columns: Iterable[str],
    where: str | None = None,
    extra: Sequence[sql.Composable] = (),
) -> sql.Composed:
    """`SELECT <columns> FROM <table> [WHERE (<where>) AND <extra>...]`: the rows a filtered table
    has in the log. The snapshot's COPY (whole table or a chunk: `extra` holds the chunk's bounds)
    and `cdc verify` read the source through this, so both see what the publication sends."""
    ident = sql.Identifier(table.schema, table.name)
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    conds: list[sql.Composable] = []
    if where is not None:
        conds.append(sql.SQL("({})").format(sql.SQL(where)))
    conds.extend(extra)
    if not conds:
        return sql.SQL("SELECT {} FROM {}").format(cols, ident)
    return sql.SQL("SELECT {} FROM {} WHERE {}").format(cols, ident, sql.SQL(" AND ").join(conds))


def publication_member(captured: CaptureFilter) -> sql.Composed:
    """`<table> [(<columns>)] [WHERE (<where>)]` for CREATE/ALTER PUBLICATION."""
    parts: list[sql.Composable] = [sql.Identifier(captured.table.schema, captured.table.name)]
    if captured.columns is not None:
        parts.append(sql.SQL(" ({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in captured.columns)))
    if captured.where is not None:
        parts.append(sql.SQL(" WHERE ({})").format(sql.SQL(captured.where)))
    return sql.Composed(parts)


def filters_by_table(
    options: Mapping[TableName, SourceTableOptions], columns: Mapping[TableName, Sequence[str]]
) -> dict[TableName, CaptureFilter]:
    return {t: resolve_filter(t, options.get(t), names) for t, names in columns.items()}


# ---- against the source -------------------------------------------------------------------------------
def identity_columns(
    replica_identity: str, key_columns: Sequence[str], column_names: Sequence[str]
) -> tuple[str, ...]:
    """The replica identity columns: the primary key (d), the identity index's columns (i), every
    column (f), none (n)."""
    if replica_identity == "f":
        return tuple(column_names)
    return tuple(key_columns) if replica_identity in ("d", "i") else ()


def _server_version(conn) -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('server_version_num')::int")
        return int(cur.fetchone()[0])


PUBLISHED_SQL = (
    "SELECT n.nspname, c.relname, pr.prattrs IS NULL,"
    " ARRAY(SELECT a.attname FROM pg_attribute a WHERE a.attrelid = pr.prrelid AND a.attnum = ANY(pr.prattrs::int2[])"
    " ORDER BY a.attnum)::text[],"
    " pg_get_expr(pr.prqual, pr.prrelid)"
    " FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid JOIN pg_class c ON c.oid = pr.prrelid"
    " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s"
)


def published(conn, publication: str) -> dict[TableName, tuple[tuple[str, ...] | None, str | None]]:
    """Column list (None: every column) and row filter (deparsed by PostgreSQL) of each table the
    publication names (PostgreSQL 15 or later)."""
    with conn.cursor() as cur:
        cur.execute(PUBLISHED_SQL, (publication,))
        return {
            TableName(s, t): (None if every else tuple(cols), where)
            for s, t, every, cols, where in cur.fetchall()
        }


def _set_members(cur, publication: str, filters: Sequence[CaptureFilter]) -> None:
    pub = sql.Identifier(publication)
    names = sql.SQL(", ").join(sql.Identifier(f.table.schema, f.table.name) for f in filters)
    cur.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(pub, names))
    cur.execute(
        sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
            pub, sql.SQL(", ").join(publication_member(f) for f in filters)
        )
    )


def _deparsed(conn, publication: str, captured: CaptureFilter) -> str | None:
    """How PostgreSQL writes `captured.where` back (pg_get_expr), so it can be compared with the
    publication's: the member is set in a transaction that is rolled back (nothing changes)."""
    was = conn.autocommit
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            _set_members(cur, publication, [captured])
            cur.execute(
                PUBLISHED_SQL + " AND n.nspname = %s AND c.relname = %s",
                (publication, captured.table.schema, captured.table.name),
            )
            row = cur.fetchone()
        return row[4] if row else None
    finally:
        conn.rollback()
        conn.autocommit = was


def publication_drift(
    conn, publication: str, filters: Mapping[TableName, CaptureFilter]
) -> dict[TableName, str]:
    """Tables of the publication whose column list or row filter is not what `filters` say -> what
    differs. Tables not in the publication yet are not drift (they are added with their filter).
    Raises psycopg2.Error when PostgreSQL refuses a row filter (compare_error turns it readable)."""
    if _server_version(conn) < MIN_FILTER_VERSION:
        return {}  # no column lists or row filters before 15 (check_source refuses table_options there)
    current = published(conn, publication)
    drift: dict[TableName, str] = {}
    for table, captured in filters.items():
        if table not in current:
            continue
        columns, where = current[table]
        reasons = []
        if columns != captured.columns and not (
            columns is not None and captured.columns is not None and set(columns) == set(captured.columns)
        ):
            was = "every column" if columns is None else f"columns ({', '.join(columns)})"
            reasons.append(
                f"the publication captures {was}, the pipeline file {CaptureFilter(table, captured.columns).describe()}"
            )
        if (where is None) != (captured.where is None) or (
            where is not None and where != _deparsed(conn, publication, captured)
        ):
            was = "every row" if where is None else f"rows WHERE {where}"
            now = "every row" if captured.where is None else f"rows WHERE {captured.where}"
            reasons.append(f"the publication captures {was}, the pipeline file {now}")
        if reasons:
            drift[table] = "; ".join(reasons)
    return drift


def set_filters(conn, publication: str, filters: Sequence[CaptureFilter]) -> None:
    """Give tables of the publication their column list and row filter, in one transaction (a running
    stream sees the old or the new members, never a table missing)."""
    was = conn.autocommit
    conn.autocommit = False
    try:
        with conn.cursor() as cur:
            _set_members(cur, publication, filters)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.autocommit = was


def refused(exc: psycopg2.Error, publication: str) -> SourceError:
    """PostgreSQL refused a publication's column list or row filter (a rule checked only there,
    e.g. a row filter calling a mutable or user-defined function): exit 3 with its message."""
    message = (exc.pgerror or str(exc)).strip()
    return SourceError(
        f"publication {publication}: PostgreSQL refused a column list or row filter of source.postgres.table_options: "
        f"{' '.join(message.split())}",
        "correct source.postgres.table_options (a row filter may use only immutable built-in functions and operators "
        "on replica identity columns); setting them needs ownership of the publication and the table",
    )
