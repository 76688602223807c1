"""What a snapshot copies and what it comes to: each table's captured columns, key and size as
of its snapshot (TablePlan), the reader connections it uses, its result, and what is recorded once
a table's copy is the table's new base in the log. Shared by the exported copy (exported.py) and
the chunked one (chunked.py), which snapshot/runner.py chooses between."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from cdc.filters import CaptureFilter
from cdc.ground.lsn import format_lsn
from cdc.ground.tables import TableName
from cdc.rebase import encode_filenodes, filenodes_key, load_states, save_state
from cdc.schema import ATTRIBUTES_SQL, relation_catalog
from cdc.source import connect


@dataclass
class TablePlan:
    table: TableName
    columns: tuple[tuple[str, int, int], ...]  # name, type oid, typmod
    extras: dict[str, tuple[int, str | None]]  # array dims and fast default by column
    key: tuple[str, ...]
    relpages: int
    reltuples: int
    relkind: str
    attnums: dict[str, int] = field(default_factory=dict)  # column identity (survives renames)
    filenodes: str | None = None  # relfilenodes of the table's leaves at the snapshot (cdc/rebase.py)


@dataclass
class SnapshotResult:
    consistent_point: int = 0
    created_slot: bool = False
    rows: dict[TableName, int] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: bool = False

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


def plan_tables(
    dsn: str,
    snapshot_name: str | None,
    tables: list[TableName],
    keys: dict[TableName, tuple[str, ...]],
    filters: dict[TableName, CaptureFilter] | None = None,
) -> list[TablePlan]:
    """Columns and sizes as of the exported snapshot (so they match what COPY will see); only the
    captured columns of a table with a column list (`filters`, as the publication sends them)."""
    filters = filters or {}
    conn = connect(dsn, autocommit=False, application_name="cdc snapshot plan")
    try:
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        plans = []
        with conn.cursor() as cur:
            if snapshot_name is not None:  # None: a chunked snapshot's plan (no exported snapshot)
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
            for table in tables:
                cur.execute(
                    "SELECT c.oid, c.relpages, c.reltuples::bigint, c.relkind FROM pg_class c"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                    (table.schema, table.name),
                )
                oid, relpages, reltuples, relkind = cur.fetchone()
                cur.execute(
                    "SELECT attname, atttypid, atttypmod FROM pg_attribute WHERE attrelid = %s AND attnum > 0"
                    " AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
                    (oid,),
                )
                captured = filters.get(table) or CaptureFilter(table)
                columns = tuple(c for c in cur.fetchall() if captured.keeps(c[0]))
                cur.execute(ATTRIBUTES_SQL, (oid,))
                attnums = {name: num for num, name, dropped in cur.fetchall() if not dropped}
                catalog = relation_catalog(cur, oid)  # fast defaults of every leaf partition too
                extras = catalog.extras
                plans.append(
                    TablePlan(
                        table,
                        columns,
                        extras,
                        keys[table],
                        relpages,
                        max(reltuples, 0),
                        relkind,
                        attnums,
                        encode_filenodes(catalog),
                    )
                )
        conn.rollback()
        return plans
    finally:
        conn.close()


def connections(parallel: int | None) -> int:
    """Reader connections of a snapshot (`cdc snapshot --parallel`): the exported snapshot's copy
    workers and a chunked snapshot's chunk readers alike; default min(4, CPUs)."""
    return max(1, parallel or min(4, os.cpu_count() or 2))


def record_new_base(pipeline, log, plans: list[TablePlan], table: TableName, lsn: int, rows: int) -> None:
    """The table's storage as of this snapshot is the baseline the stream compares with to notice
    rewrites; a re-base the stream asked for (or started) is done."""
    plan = next(p for p in plans if p.table == table)
    if plan.filenodes is not None:
        log.set_meta(filenodes_key(log.table_id(table)), plan.filenodes)
    if str(table) in load_states(pipeline.state_path):
        save_state(
            pipeline.state_path, table, state="done", lsn=format_lsn(lsn), rows=rows, error=None, fix=None
        )
