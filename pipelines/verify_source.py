"""The source as `cdc verify` reads it: every table COPYed at one exact point (a temporary slot's
exported snapshot, pipelines/verify.py says why), with the columns to compare as the source has them then
(added, generated and renamed ones against the log's schema).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from psycopg2 import sql

from cdc.filters import CaptureFilter, select_query
from cdc.ground.config import Pipeline
from cdc.ground.private import private_open
from cdc.ground.tables import TableName
from cdc.log.base import Column, TableSchema
from cdc.schema import TypeCache, pgtype_to_dict
from cdc.source import connect
from snapshot.slots import slot_with_snapshot


@dataclass
class SourceCopy:
    point: int
    files: dict[TableName, Path]
    # The log's schema restricted to columns the source has, plus columns the source has that the
    # log does not know yet (added since the table's last change): a follower lacks those.
    schemas: dict[TableName, TableSchema]
    generated: dict[TableName, list[str]] = field(default_factory=dict)  # not compared (see source_columns)
    # new name -> old name of columns renamed in the source since the log last saw the table
    renamed: dict[TableName, dict[str, str]] = field(default_factory=dict)


def source_columns(
    cur, table: TableName, schema: TableSchema
) -> tuple[tuple[Column, ...], list[str], dict[str, str]]:
    """The columns to compare for `table` as the source has it now (at the verification point):
    the log's columns the source still has, then the source's columns the log does not know,
    except generated ones, which PostgreSQL before 18 does not publish (and 18 only with
    publish_generated_columns): those no follower has, and they are returned to be named. Also
    returned: new name -> old name of each log column the source has renamed since (the same
    attnum under another name): the log learns of a rename with the table's next change, so a
    follower still has the old name until then."""
    cur.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod, a.attndims, a.attgenerated <> '', a.attnum"
        " FROM pg_attribute a"
        " JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (table.schema, table.name),
    )
    rows = cur.fetchall()
    present = {r[0] for r in rows}
    known = set(schema.column_names)
    cols = [c for c in schema.columns if c.name in present]
    cols += [
        Column(name, oid, mod, dims, attnum=attnum)
        for name, oid, mod, dims, generated, attnum in rows
        if not generated and name not in known
    ]
    now = {attnum: name for name, _o, _m, _d, _g, attnum in rows}
    renamed = {
        now[c.attnum]: c.name
        for c in schema.columns
        if c.attnum and c.name not in present and now.get(c.attnum) not in (None, *known)
    }
    generated = [name for name, _o, _m, _d, gen, _a in rows if gen and name not in known]
    return tuple(cols), generated, renamed


def copy_source(
    pipeline: Pipeline,
    server_version: int,
    schemas: dict[TableName, TableSchema],
    directory: Path,
    filters: dict[TableName, CaptureFilter] | None = None,
) -> SourceCopy:
    """COPY every table at one exact point (a temporary slot's exported snapshot): of a table with
    source.postgres.table_options, `SELECT <columns> FROM t WHERE <where>` (what the log captures)."""
    filters = filters or {}
    dsn = pipeline.source.postgres.dsn
    files: dict[TableName, Path] = {}
    restricted: dict[TableName, TableSchema] = {}
    generated: dict[TableName, list[str]] = {}
    renamed: dict[TableName, dict[str, str]] = {}
    types = TypeCache()
    slot = f"cdc_verify_{secrets.token_hex(4)}"
    with slot_with_snapshot(dsn, slot, temporary=True, server_version=server_version) as snap:
        conn = connect(dsn, autocommit=False, application_name="cdc verify")
        try:
            conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snap.snapshot_name,))
                for table, schema in schemas.items():
                    cols, generated[table], renamed[table] = source_columns(cur, table, schema)
                    captured = filters.get(table) or CaptureFilter(table)
                    cols = tuple(c for c in cols if captured.keeps(c.name))
                    known = {**schema.types}
                    new_oids = {c.type_oid for c in cols if c.type_oid not in known}
                    known.update({o: pgtype_to_dict(t) for o, t in types.resolve(conn, new_oids).items()})
                    restricted[table] = TableSchema(cols, schema.key, known)
                    path = directory / f"{len(files)}.copy"
                    stmt = sql.SQL("COPY ({}) TO STDOUT").format(
                        select_query(table, [c.name for c in cols], captured.where)
                    )
                    with private_open(path, "wb") as f:  # the source's rows: owner-only
                        cur.copy_expert(stmt.as_string(conn), f, size=1 << 20)
                    files[table] = path
            conn.rollback()
        finally:
            conn.close()
        return SourceCopy(snap.consistent_point, files, restricted, generated, renamed)
