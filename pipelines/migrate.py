"""`cdc migrate PIPELINE --sql FILE`: run a schema migration on tables captured with a publication
column list or row filter.

PostgreSQL refuses `ALTER COLUMN ... TYPE` (and DROP/RENAME) of a column a publication's column list
or row filter names ("cannot alter type of a column used by a publication ..."). Here, in ONE
transaction:
  1. every captured table of the pipeline whose publication member has a column list or row filter
     is taken out of the publication (ALTER PUBLICATION ... DROP TABLE);
  2. the file's SQL runs;
  3. each such table is put back with the column list and row filter the pipeline file gives it,
     computed from its columns after the migration (exclude_columns still leaves those columns out,
     and a column added by the migration is captured unless excluded);
  4. COMMIT; anything failing rolls all of it back (the publication as it was, the migration undone).
No moment exists at which the publication holds an excluded column: it goes from the old list to
"not published" to the new list, and a transaction's changes are decoded with the publication as it
stands at their commit. The table's rows are rewritten without change events by a type change; the
running stream re-bases such a table by itself (docs/schema-changes.md).

Keep the file to DDL: rows the file itself inserts, updates or deletes in those tables are not
captured (the table is out of the publication while they happen). The file is refused (rolled back)
when PostgreSQL counts such row changes in the transaction (pg_stat_xact_user_tables).
"""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg2
from psycopg2 import sql

from cdc.filters import CaptureFilter, publication_member, published, resolve_filter
from cdc.ground.config import Pipeline
from cdc.ground.errors import SourceError, UsageError
from cdc.ground.tables import TableName
from cdc.source import connect

logger = logging.getLogger(__name__)


def _columns(cur, table: TableName) -> list[str]:
    """The table's non-generated, non-dropped columns in attnum order (what a column list can name)."""
    cur.execute(
        "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = %s::regclass AND a.attnum > 0"
        " AND NOT a.attisdropped AND a.attgenerated = '' ORDER BY a.attnum",
        (str(table),),
    )
    return [r[0] for r in cur.fetchall()]


def _row_changes(cur, tables: list[TableName]) -> dict[TableName, int]:
    """Rows inserted, updated or deleted in each table by this transaction so far."""
    out = {}
    for table in tables:
        cur.execute(
            "SELECT coalesce(n_tup_ins + n_tup_upd + n_tup_del, 0) FROM pg_stat_xact_user_tables WHERE relid = %s::regclass",
            (str(table),),
        )
        row = cur.fetchone()
        out[table] = int(row[0]) if row else 0
    return out


def run_migrate(pipeline: Pipeline, sql_file: Path) -> None:
    try:
        text = sql_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(
            f"--sql: cannot read {sql_file}: {exc}", "give a readable file of SQL statements"
        ) from None
    if not text.strip():
        raise UsageError(f"--sql: {sql_file} holds no SQL", "put the migration's statements in the file")
    publication = pipeline.publication
    conn = connect(pipeline.source.postgres.dsn, application_name="cdc migrate", autocommit=False)
    try:
        members = published(conn, publication)
        narrowed = sorted(
            (t for t, (cols, where) in members.items() if cols is not None or where is not None), key=str
        )
        options = pipeline.source.postgres
        with conn.cursor() as cur:
            pub = sql.Identifier(publication)
            if narrowed:
                names = sql.SQL(", ").join(sql.Identifier(t.schema, t.name) for t in narrowed)
                cur.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(pub, names))
            before = _row_changes(cur, narrowed)
            try:
                cur.execute(text)
            except psycopg2.Error as exc:
                message = " ".join((exc.pgerror or str(exc)).split())
                raise SourceError(
                    f"the migration in {sql_file} failed, nothing was changed (rolled back): {message}",
                    "correct the SQL and run `cdc migrate` again",
                ) from None
            after = _row_changes(cur, narrowed)
            touched = [str(t) for t in narrowed if after[t] > before[t]]
            if touched:
                raise UsageError(
                    f"the migration in {sql_file} changes rows of {', '.join(touched)}, which would not be captured "
                    "(the table is out of the publication during the migration); nothing was changed (rolled back)",
                    "keep the file to DDL and change the rows in a transaction of their own, after `cdc migrate`",
                )
            restored: list[CaptureFilter] = []
            for table in narrowed:
                captured = resolve_filter(table, options.options_for(table), _columns(cur, table))
                if not captured.active:  # a member narrowed by hand, not by the pipeline file: as it was
                    cols, where = members[table]
                    captured = CaptureFilter(table, cols, where)
                restored.append(captured)
            if restored:
                try:
                    cur.execute(
                        sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                            pub, sql.SQL(", ").join(publication_member(f) for f in restored)
                        )
                    )
                except psycopg2.Error as exc:
                    message = " ".join((exc.pgerror or str(exc)).split())
                    raise SourceError(
                        f"after the migration the publication {publication} cannot take its tables back: {message}; "
                        "nothing was changed (rolled back)",
                        "a migration may not drop or rename a column the table's column list keeps or its row filter "
                        "uses: change source.postgres.table_options first",
                    ) from None
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    finally:
        conn.close()
    if not narrowed:
        logger.info(
            f"migration {sql_file} done (no table of publication {publication} has a column list or row filter)"
        )
        return
    for f in restored:
        logger.info(f"publication {publication}: {f.table} set again: captures {f.describe()}")
    logger.info(
        f"migration {sql_file} done in one transaction with the publication's column lists and row filters"
    )
