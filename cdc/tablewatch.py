"""Captured tables that are renamed or dropped in the source (docs/schema-changes.md).

pgoutput says nothing when a table is renamed or dropped: a Relation message just carries the
new name (its relation id is the table's OID, which a rename keeps), and a dropped table sends
nothing more. The log records the OID of every table it captures (`tables.relid`), so:

* a change under a name the log does not know, of an OID the log captures under another name,
  is a rename. If the pipeline file names the new name, the log table is renamed in the same
  batch as the change (history, schemas and base go with it: followers build the new name from
  the log, no snapshot needed). If not, the stream stops before that change with the remedy;
  nothing from there on is acknowledged, so nothing is lost.
* a change under a captured name but of another OID is another table (dropped and created
  again, or a table renamed to that name): the stream stops the same way.
* a captured table whose OID is gone from the catalog was dropped. Every change it had was
  committed before the WAL position current when that is noticed, so once the log is durable
  past that position the table is marked dropped: its events stay in the log and in cuts (a
  follower that has not applied its last changes still gets them); `cdc log remove-table`
  takes it out. With DDL capture (cdc/ddl.py) the `sql_drop` trigger's message says the same at
  the DROP's commit: the table is marked dropped at that position (every change it had precedes it).
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable

from cdc.ground.errors import LogError, SourceError
from cdc.ground.lsn import format_lsn
from cdc.ground.remedy import Command, placeholder
from cdc.ground.source_config import SourceTableOptions
from cdc.ground.tables import TableName
from cdc.keyless import keyless_problems
from cdc.log.base import TableSchema
from cdc.source import CheckReport, check_source, flushed_wal_lsn, table_info

logger = logging.getLogger(__name__)

POLL_S = 10.0  # how often a running stream looks for captured tables gone from the source
_FOLLOWED = ("live", "dropped")  # states whose rows followers have


def relid_exists(conn, relid: int) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_class WHERE oid = %s", (relid,))
        return cur.fetchone() is not None


def catalog_oid(conn, table: TableName) -> int | None:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (table.schema, table.name),
        )
        row = cur.fetchone()
    return int(row[0]) if row else None


def check_pipeline_source(pipeline, conn, dropped: set[TableName]) -> CheckReport:
    """check_source for a pipeline's tables, slot and publication; `dropped` tables the file still
    names are notes, and fix lines name the pipeline file; keyless tables only where they can be followed."""
    report = check_source(
        conn,
        pipeline.table_selectors,
        pipeline.slot,
        pipeline.publication,
        dropped=dropped,
        command=pipeline.command,
        failover=pipeline.source.postgres.failover,
        options=table_options(pipeline),
        followed=followed_tables(pipeline),
    )
    report.problems += keyless_problems(pipeline, report)
    return report


def raise_unless_captured(report: CheckReport) -> set[TableName]:
    """Raise the report's problems (exit 3), but say as warnings those that break the application and
    not the capture (Problem.moved_by_snapshot: a keyless table switched from REPLICA IDENTITY FULL to
    DEFAULT while followed, whose inserts are all its changes now): the command goes on, and only
    `cdc validate` stops on them. Returns the tables warned of."""
    warned: set[TableName] = set()
    for problem in list(report.problems):
        if problem.moved_by_snapshot is not None:
            logger.warning(f"{problem.what}\n  fix: {problem.fix}")
            report.problems.remove(problem)
            warned.add(problem.moved_by_snapshot)
    report.raise_if_problems()
    return warned


def table_options(pipeline) -> dict[TableName, SourceTableOptions]:
    """source.postgres.table_options by table name."""
    return {TableName.parse(k): v for k, v in pipeline.source.postgres.table_options.items()}


def followed_tables(pipeline) -> set[TableName]:
    """The tables the pipeline's log follows (their rows are in followers), none before its first snapshot."""
    from cdc.log import open_log

    if not (pipeline.local_log_path / "log.db").exists():
        return set()
    log = open_log(pipeline, readonly=True)
    try:
        return {t.table for t in log.tables() if t.state in _FOLLOWED}
    finally:
        log.close()


def gone_from_source(pipeline, conn) -> set[TableName]:
    """Tables of the pipeline's log the source no longer has (dropped, or renamed): `cdc stream`
    passes their last changes and marks them dropped, so a file that still names them does not
    stop `cdc validate`, `cdc snapshot` or `cdc run` (check_source's `dropped`)."""
    from cdc.log import open_log

    if not (pipeline.local_log_path / "log.db").exists():
        return set()
    log = open_log(pipeline, readonly=True)
    try:
        return {t.table for t in log.tables() if t.state in _FOLLOWED and catalog_oid(conn, t.table) is None}
    finally:
        log.close()


class TableWatch:
    def __init__(self, log, command: Command = placeholder):
        self.log = log
        self.command = command  # `cdc VERB <pipeline file> ...` for remedies (cdc/ground/remedy.py)
        # dropped tables (by log id) waiting for the log to be durable past _until
        self._pending: dict[int, TableName] = {}
        self._until = 0
        # dropped tables known from a DDL capture message: log id -> (name, the DROP's commit LSN)
        self._at: dict[int, tuple[TableName, int]] = {}
        self._checked = time.monotonic()

    # ---- gone tables -----------------------------------------------------------------------------
    def dropped(self, conn) -> dict[TableName, int]:
        """Live log tables dropped in the source (their OID is gone; without a recorded OID: their
        name) -> log id. Records the OID of live tables that have none yet (older logs)."""
        out: dict[TableName, int] = {}
        for st in self.log.tables():
            if st.state != "live":
                continue
            if st.relid is not None:
                if not relid_exists(conn, st.relid):
                    out[st.table] = st.id
                continue
            oid = catalog_oid(conn, st.table)
            if oid is None:
                out[st.table] = st.id
            else:
                self.log.set_relid(st.id, oid)
        return out

    def start(self, conn) -> set[TableName]:
        """At stream start: the log's tables whose name is not in the source now (dropped, or
        renamed: the stream follows a rename when it reaches it), for check_source's `dropped`."""
        dropped = self.dropped(conn)
        self._arm(conn, dropped)
        self._checked = time.monotonic()
        absent = set(dropped)
        for st in self.log.tables():
            if st.state in _FOLLOWED and st.table not in absent and catalog_oid(conn, st.table) is None:
                # marked dropped before, or renamed (its OID lives on under another name)
                absent.add(st.table)
                if st.state == "live":
                    logger.info(
                        f"table {st.table} was renamed in the source: the stream follows it when it gets there"
                    )
        return absent

    def dropped_at(self, table_id: int, table: TableName, lsn: int) -> None:
        """The DDL capture message of `DROP TABLE`, read at its commit `lsn`: the table is marked
        dropped at that position once the log is durable past it (not at the later position the
        catalog poll notices it at)."""
        self._pending.pop(table_id, None)
        if table_id not in self._at:
            self._at[table_id] = (table, lsn)

    def _arm(self, conn, gone: dict[TableName, int]) -> None:
        new = {tid: t for t, tid in gone.items() if tid not in self._pending and tid not in self._at}
        if not new:
            return
        self._pending.update(new)
        self._until = max(self._until, flushed_wal_lsn(conn))
        names = ", ".join(map(str, new.values()))
        logger.info(
            f"table(s) {names} dropped in the source: their changes up to {format_lsn(self._until)} go into the log, "
            "then they are marked dropped there"
        )

    def poll(self, conn, durable: int) -> None:
        """Between transactions (no log batch open): look for newly dropped tables now and then, and
        mark them dropped once the log is durable past every change they had."""
        now = time.monotonic()
        if now - self._checked >= POLL_S:
            self._checked = now
            self._arm(conn, self.dropped(conn))
        for lsn in sorted({at for _t, at in self._at.values() if at <= durable}):
            ids = [tid for tid, (_t, at) in self._at.items() if at == lsn]
            self.log.mark_dropped(ids, lsn)
            names = ", ".join(str(self._at.pop(tid)[0]) for tid in ids)
            logger.info(
                f"marked dropped in the log: {names} at {format_lsn(lsn)}, the DROP's commit (DDL capture; followers keep "
                f"their copy; `{self.command('log remove-table', '--table', 'TABLE', '--yes')}` takes a table out of the log)"
            )
        if self._pending and durable >= self._until:
            self.log.mark_dropped(list(self._pending), self._until)
            names = ", ".join(map(str, self._pending.values()))
            logger.info(
                f"marked dropped in the log: {names} (every change up to {format_lsn(self._until)} is in; followers keep "
                f"their copy; `{self.command('log remove-table', '--table', 'TABLE', '--yes')}` takes a table out of the log)"
            )
            self._pending.clear()

    def _cmd(self, verb: str, *args: object) -> str:
        return self.command(verb, *(shlex.quote(str(a)) for a in args))

    # ---- relations in the stream -------------------------------------------------------------------
    def resolve(self, relid: int, table: TableName, lsn: int, selected: bool, replay: bool) -> TableName:
        """The log table a Relation message's changes go to (usually its own name). A captured table
        under a new name is followed (or the stream stops, SourceError, when the file does not name
        the new name); another table under a captured name stops the stream. `replay`: a
        transaction the log has already (its changes are skipped): mapped by OID, nothing changed."""
        states = self.log.tables()  # read afresh: `cdc snapshot --tables` in another process changes them
        by_name = next((s for s in states if s.table == table), None)
        owner = next((s for s in states if s.relid == relid and s.state in _FOLLOWED), None)
        if replay:
            return owner.table if by_name is None and owner is not None else table
        if by_name is not None:
            if by_name.state not in _FOLLOWED or by_name.relid is None or by_name.relid == relid:
                return table
            if by_name.snapshot_lsn is not None and lsn < by_name.snapshot_lsn:
                return table  # the old table's changes before the current base: append() leaves them out
            raise SourceError(
                f"{table} in the source is not the table the log captured under that name (OID {relid}, the log's "
                f"{by_name.relid}): it was dropped and created again, or another table was renamed to {table}. "
                f"The stream stopped before its first change (transaction committed at {format_lsn(lsn)}); nothing "
                "from there on is acknowledged, so nothing is lost",
                f"run `{self._cmd('snapshot', '--tables', table)}` (the log takes the new table's rows as its base; "
                f"followers rebuild it), then `{self._cmd('stream')}`; or, to stop capturing it, remove it from "
                f"source.postgres.tables and run `{self._cmd('log remove-table', '--table', table, '--yes')}`",
            )
        if owner is None:
            if selected:
                logger.warning(
                    f"{table} is captured but has no snapshot in the log yet: its changes wait there and no "
                    f"follower gets them until `{self._cmd('snapshot', '--tables', table)}`"
                )
            return table
        if not selected:
            raise SourceError(
                f"table {owner.table} was renamed to {table} in the source (the same table, OID {relid}), and "
                f"source.postgres.tables does not name {table}. The stream stopped before its first change under the "
                f"new name (transaction committed at {format_lsn(lsn)}); nothing from there on is acknowledged, so "
                "nothing is lost",
                f"to go on capturing it, put {table} in source.postgres.tables in place of {owner.table} and run "
                f"`{self._cmd('stream')}` again (the log follows it under the new name with all its history; followers build "
                f"{table} and keep {owner.table} as it was); to stop capturing it, remove {owner.table} from "
                f"source.postgres.tables and run `{self._cmd('log remove-table', '--table', owner.table, '--yes')}`",
            )
        self.log.rename_table(owner.id, table)
        logger.info(
            f"table {owner.table} was renamed to {table} in the source (same table, OID {relid}): the log follows it "
            f"under the new name with its history; followers build {table} from the log and keep {owner.table} as it was"
        )
        return table

    # ---- catalog answers for tables that may be gone ----------------------------------------------------
    def _logged_schema(self, table: TableName) -> TableSchema | None:
        try:
            return self.log.schema(table)
        except LogError:
            return None

    def key_of(self, conn, table: TableName) -> tuple[str, ...]:
        """The table's key from the catalog; for a table gone from it since (its last changes are
        still streaming), the key the log recorded."""
        try:
            return table_info(conn, table).key_columns
        except SourceError:
            schema = self._logged_schema(table)
            if schema is None:
                raise
            return schema.key

    def extras(
        self, conn, table: TableName, from_catalog: Callable[[], dict]
    ) -> dict[str, tuple[int, str | None]]:
        """Array dimensions and fast defaults by column: from the catalog, or for a table gone from
        it, as the log recorded them (so a dropped table's defaults are not lost)."""
        if catalog_oid(conn, table) is not None:
            return from_catalog()
        schema = self._logged_schema(table)
        return {c.name: (c.ndims, c.missing) for c in schema.columns} if schema else {}
