"""Noticing that a table's rows changed without row-level change events, so the log must re-base it.

Some DDL and maintenance rewrites a table: ALTER COLUMN ... TYPE (with or without USING),
ADD COLUMN ... DEFAULT <volatile> (VACUUM FULL and CLUSTER rewrite storage, not rows). Logical decoding sends no row for a
rewrite, and a rewrite also clears the fast defaults (`attmissingval`) an earlier ADD COLUMN
left, which the stream reads from the catalog only when it gets to that ADD COLUMN, possibly
after the rewrite. Attaching or detaching a partition adds or removes rows the same silent way.
Followers would then keep stale rows (or NULL where a default belongs) with nothing in the log
saying otherwise.

Every rewrite gives the table's storage a new relfilenode. The log keeps the relfilenodes of
the table's leaves (the table itself, or its leaf partitions) as of its snapshot; whenever the
stream gets a table's columns (a Relation message: the first change of a table in a session
and the first after any DDL on it), it compares them with the catalog. Partitions detached or
attached with rows re-base the table at once. A new relfilenode alone (VACUUM FULL, CLUSTER)
changes no row and re-bases nothing: only what the columns show counts then (a column type
changed, or a new column with a DEFAULT whose value the catalog no longer keeps), as for a log
without a storage baseline. With DDL capture (cdc/ddl.py) the `table_rewrite` trigger says so
at the DDL's commit (`RewriteWatch.rewritten`), and the re-base starts once the stream has that
transaction. A re-base is a snapshot of that one table into the log at a new consistent point,
as `cdc snapshot --tables` does, which the stream's own events then continue.

The state of each re-base is kept in <state_dir>/rebase.json for `cdc status` and for a stream
restarted before a re-base finished (it starts it again).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import threading
from pathlib import Path
from typing import Any, Protocol

from cdc.ground.clock import now_ms
from cdc.ground.private import private_dir, private_open
from cdc.ground.remedy import Command, placeholder
from cdc.ground.tables import TableName
from cdc.log.base import TableSchema
from cdc.schema import RelationCatalog, table_catalog

logger = logging.getLogger(__name__)

STATE_FILE = "rebase.json"
_lock = threading.Lock()


def filenodes_key(table_id: int) -> str:
    return f"filenodes:{table_id}"


def encode_filenodes(catalog: RelationCatalog) -> str:
    return json.dumps([list(p) for p in catalog.filenodes])


# ---- the re-base state file ---------------------------------------------------------------------------
def load_states(state_dir: Path) -> dict[str, dict[str, Any]]:
    try:
        return json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def save_state(state_dir: Path, table: TableName, **fields: Any) -> None:
    """Update one table's entry (atomically: readers never see half a file)."""
    with _lock:
        path = Path(state_dir) / STATE_FILE
        states = load_states(state_dir)
        entry = states.setdefault(str(table), {})
        entry.update(fields, updated_ms=now_ms())
        private_dir(path.parent)
        tmp = path.with_suffix(".tmp")
        with private_open(tmp, "w") as f:
            f.write(json.dumps(states, indent=1, sort_keys=True))
        os.replace(tmp, path)


def unfinished(state_dir: Path) -> dict[str, str]:
    """Tables whose re-base was needed or started and did not finish -> reason."""
    return {
        t: e.get("reason", "")
        for t, e in load_states(state_dir).items()
        if e.get("state") in ("needed", "running", "failed")
    }


class Rebaser(Protocol):
    """Runs re-bases for the stream (snapshot/rebase.py); the stream only detects."""

    def start(self, table: TableName, reason: str) -> None: ...

    def busy(self, table: TableName) -> bool: ...

    def wait(self) -> None: ...


# ---- detection -------------------------------------------------------------------------------------
class RewriteWatch:
    def __init__(
        self,
        log,
        state_dir: Path,
        rebaser: Rebaser | None,
        command: Command = placeholder,
    ):
        self.log = log
        self.command = command  # `cdc VERB <pipeline file> ...` for the printed fix (cdc/ground/remedy.py)
        self.state_dir = Path(state_dir)
        self.rebaser = rebaser
        # table id -> (table, reason, filenodes, WAL position when the catalog was read): a storage
        # change is only a rewrite once the stream passed that position without decoding a TRUNCATE
        # of the table (a lagging stream reads the catalog before it gets to the TRUNCATE).
        self.suspects: dict[int, tuple[TableName, str, str, int]] = {}

    def truncate(self, table_id: int) -> None:
        """A decoded TRUNCATE explains a new storage, but not necessarily all of it: from here on
        only what the columns show counts, until the table's next check records the storage again.
        Kept in the log (with the batch), so a stream restarted after the TRUNCATE knows it too."""
        self.suspects.pop(table_id, None)
        self.log.set_meta(filenodes_key(table_id), "")

    def due(self, position: int) -> None:
        """The stream has decoded everything before `position`: suspects read before it are rewrites."""
        for table_id, (table, reason, now, at) in list(self.suspects.items()):
            if at <= position:
                del self.suspects[table_id]
                self.log.set_meta(filenodes_key(table_id), now)
                self._rebase(table, reason)

    def settle(self) -> None:
        """A stream stopping at its --until target: suspects it cannot follow further are re-based
        (a needless re-base costs a snapshot of the table; a missed one leaves followers stale)."""
        self.due(1 << 64)

    def resume(self) -> None:
        """Re-bases an earlier stream needed or started and did not see finished."""
        for name, reason in unfinished(self.state_dir).items():
            schema, _, table = name.partition(".")
            self._rebase(TableName(schema, table), f"{reason} (re-base not finished before)")

    def request(self, table: TableName, reason: str) -> None:
        """Re-base `table` for a reason found outside the stream's messages (changed table_options)."""
        if self.rebaser is not None and self.rebaser.busy(table):
            return
        self._rebase(table, reason)

    def check(
        self,
        conn,
        table: TableName,
        table_id: int,
        previous: TableSchema | None,
        schema: TableSchema,
        catalog: RelationCatalog | None,
        lsn: int,
    ) -> None:
        """At a Relation message of `table` in the transaction committing at `lsn`."""
        if catalog is None:
            return
        state = self.log.table_state(table) if hasattr(self.log, "table_state") else None
        if state is None or state.snapshot_lsn is None or lsn < state.snapshot_lsn:
            return  # no snapshot yet (it records the baseline), or the snapshot is newer than this point
        if self.rebaser is not None and self.rebaser.busy(table):
            return  # a re-base at a newer point is running; it records the new baseline
        if table_id in self.suspects:
            return
        key = filenodes_key(table_id)
        known, now = self.log.meta(key), encode_filenodes(catalog)
        reasons = []
        fresh = [c for c in schema.columns if previous is not None and c.name not in previous.column_names]
        rewritten = False
        if known and known != now:
            storage = _partition_change(conn, json.loads(known), catalog)
            if storage:
                self.suspects[table_id] = (table, storage, now, _wal_lsn(conn))
                return
            rewritten = _rewritten(json.loads(known), catalog)
        # A new relfilenode alone (VACUUM FULL, CLUSTER) changes no row: only what the columns show
        # counts, as for a log without a storage baseline (or after a TRUNCATE).
        how = "its storage was rewritten (a new relfilenode) and " if rewritten else ""
        if not known or rewritten:  # a type change that keeps the storage (varchar widening) rewrites nothing
            changed = _type_changes(previous, schema)
            if changed:
                reasons.append(f"{how}column type changed ({changed}), which may rewrite every row")
        # Whatever the storage shows now (an earlier Relation message may have recorded the rewrite's
        # new relfilenode already): a new column whose default the catalog keeps no value of.
        lost = _defaults_without_value(conn, catalog.oid, [c.name for c in fresh if c.missing is None])
        if lost:
            reasons.append(
                f"{how}new column(s) {', '.join(lost)} have a default that rows not written since hold, but the "
                "catalog keeps no value for them (a volatile default, or a rewrite such as VACUUM FULL cleared it)"
            )
        conflicts = [c.name for c in fresh if c.name in catalog.conflicts]
        if conflicts:
            values = "; ".join(
                f"{c}: " + ", ".join(f"{leaf}={v!r}" for leaf, v in sorted(catalog.conflicts[c].items()))
                for c in conflicts
            )
            reasons.append(
                f"its partitions hold different values for new column(s) that rows not written since have ({values})"
            )
        self.log.set_meta(key, now)
        if reasons:
            self._rebase(table, "; ".join(r for r in reasons if r))

    def rewritten(self, conn, table: TableName, table_id: int, lsn: int, reason: str) -> None:
        """The DDL trigger said the table's rows are rewritten in the transaction committing at `lsn`
        (cdc/ddl.py): re-base once the stream has that transaction, not at the table's next change."""
        state = self.log.table_state(table) if hasattr(self.log, "table_state") else None
        if state is None or state.snapshot_lsn is None or lsn < state.snapshot_lsn:
            return  # the table's base is newer than the rewrite
        if self.rebaser is not None and self.rebaser.busy(table):
            return
        catalog = table_catalog(conn, table)
        self.suspects[table_id] = (table, reason, encode_filenodes(catalog) if catalog else "", lsn)

    def _rebase(self, table: TableName, reason: str) -> None:
        if self.rebaser is None:
            save_state(self.state_dir, table, state="needed", reason=reason)
            logger.warning(
                f"{table}: {reason}: its rows may have changed without change events, so followers may be stale; "
                f"fix: run `{self.command('snapshot', '--tables', shlex.quote(str(table)))}` (`cdc stream` from the CLI "
                "does this by itself)"
            )
            return
        logger.info(
            f"{table}: {reason}: re-basing the table (a new snapshot of it into the log, as `cdc snapshot --tables {table}`)"
        )
        save_state(self.state_dir, table, state="running", reason=reason, started_ms=now_ms())
        self.rebaser.start(table, reason)


def _type_changes(previous: TableSchema | None, schema: TableSchema) -> str:
    if previous is None:
        return ""
    before = {c.name: (c.type_oid, c.typmod) for c in previous.columns}
    return ", ".join(
        c.name for c in schema.columns if c.name in before and before[c.name] != (c.type_oid, c.typmod)
    )


def _wal_lsn(conn) -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cur.fetchone()[0])


def _defaults_without_value(conn, oid: int, names: list[str]) -> list[str]:
    """Of these columns, those with a DEFAULT expression (a column added with one, or given one since)."""
    if not names:
        return []
    with conn.cursor() as cur:
        cur.execute(
            "SELECT a.attname FROM pg_attrdef d JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum"
            " WHERE d.adrelid = %s AND a.attname = ANY(%s) AND a.attgenerated = '' ORDER BY a.attnum",
            (oid, names),
        )
        return [r[0] for r in cur.fetchall()]


def _has_rows(conn, oid: int) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT %s::regclass::text", (oid,))
        (name,) = cur.fetchone()
        cur.execute(f"SELECT EXISTS (SELECT 1 FROM ONLY {name})")  # regclass text is quoted already
        return bool(cur.fetchone()[0])


def _rewritten(known: list[list[int]], catalog: RelationCatalog) -> bool:
    was = {oid: node for oid, node in known}
    return any(oid in was and was[oid] != node for oid, node in catalog.filenodes)


def _partition_change(conn, known: list[list[int]], catalog: RelationCatalog) -> str:
    """Partitions detached, dropped or attached with rows: rows that came or went without events."""
    was = {oid: node for oid, node in known}
    now = dict(catalog.filenodes)
    parts = []
    if [oid for oid in was if oid not in now]:
        parts.append("a partition was detached or dropped (its rows left without change events)")
    # A new partition that is empty brought no rows; its rows to come are change events.
    if any(_has_rows(conn, oid) for oid in now if oid not in was):
        parts.append("a partition was attached with rows (they came without change events)")
    return "; ".join(parts)
