"""Which table each relation of the change stream is, with its key and its schema version in the log.

Kept current from three sources: pgoutput's Relation messages (before a table's first change and
after each change of its columns), the DDL capture trigger's messages (cdc/ddl.py: the schema change
at its own commit, among the rows), and, without DDL capture, an idle-time check of the catalog.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg2

from cdc import ddl
from cdc.ground.errors import LogError, SourceError
from cdc.ground.lsn import format_lsn
from cdc.ground.tables import TableName, TableSelector
from cdc.log.base import TableSchema
from cdc.log.local import LocalLog
from cdc.pgoutput import Relation
from cdc.rebase import RewriteWatch
from cdc.schema import TypeCache, build_schema, column_extras, relation_attnums, table_catalog, with_attnums
from cdc.source import (
    followed_insert_only,
    in_publication,
    insert_publication,
    switched_to_default,
    table_info,
)
from cdc.tablewatch import TableWatch

logger = logging.getLogger(__name__)


@dataclass
class Rel:
    """A captured relation as the receive loop needs it per change."""

    table: TableName
    table_id: int
    schema_version: int
    key_idx: tuple[int, ...]
    key_len: int  # columns to decode to reach every key column
    positional: bool = False  # keyless: each change keyed by its position "<commit lsn>\t<seq>"


def snapshot_command(pipeline, table: TableName) -> str:
    """The command that re-copies one table (the fix of a table the stream cannot follow)."""
    return pipeline.command("snapshot", "--tables", shlex.quote(str(table)))


def _same_columns(a: TableSchema, b: TableSchema) -> bool:
    return a.key == b.key and [(c.name, c.type_oid, c.typmod) for c in a.columns] == [
        (c.name, c.type_oid, c.typmod) for c in b.columns
    ]


class RelationTracking:
    """The stream reader's tables and schema versions (a part of `StreamReader`)."""

    pipeline: Any
    log: LocalLog
    selectors: list[TableSelector]
    _rels: dict[int, Rel | None]
    _keys: dict[TableName, tuple[str, ...]]
    _keyless: set[TableName]
    identity_warned: set[TableName]  # keyless tables switched from FULL to DEFAULT, said once
    _types: TypeCache
    _watch: TableWatch
    _rewrites: RewriteWatch
    _ddl_prefix: str
    _ddl_on: bool
    _ddl_checked: float
    _idle_checked: float

    def _relation(self, conn, msg: Relation, lsn: int, replay: bool = False) -> None:
        table = TableName(msg.namespace, msg.name)
        selected = any(s.matches(table) for s in self.selectors)
        # A captured table renamed in the source is followed by OID (or stops the stream): cdc/tablewatch.py
        table = self._watch.resolve(msg.relation_id, table, lsn, selected, replay)
        # Tables `cdc snapshot --tables` added while we run are registered in the log before
        # they join the publication, so the log knows them by the time their first change comes.
        if not selected and self.log.table_id(table) is None:
            self._rels[msg.relation_id] = None  # published but not part of this pipeline
            return
        key = self._keys.get(table)
        names = [c.name for c in msg.columns]
        if key is None or any(k not in names for k in key):
            key = self._keys[table] = self._watch.key_of(
                conn, table
            )  # new table or key changed (or gone since)
        missing = [k for k in key if k not in names]
        # a keyless table followed (insert-only or as a multiset) from the start (a table that loses its
        # key still stops here)
        positional = not key and (table in self._keyless or self._new_keyless(conn, table))
        if positional and msg.replica_identity == "f":
            self._check_full_published(conn, table)
        elif positional and msg.replica_identity in ("d", "n"):
            self._check_default_published(conn, table, msg.replica_identity)
        if (not key and not positional) or missing:
            raise SourceError(
                f"table {table} has no usable key in the change stream (key columns {list(key)}, stream columns {names})",
                f"give the table a primary key again, then run `{snapshot_command(self.pipeline, table)}`",
            )
        columns = [(c.name, c.type_oid, c.typmod) for c in msg.columns]
        catalog = table_catalog(conn, table)  # fast defaults of every leaf partition, relfilenodes
        extras = self._watch.extras(
            conn, table, lambda: catalog.extras if catalog else column_extras(conn, table)
        )
        schema = build_schema(conn, columns, key, self._types, extras)
        table_id = self.log.ensure_table(table)
        # Column identity (attnum), so followers can tell a rename from a drop + add.
        schema = with_attnums(schema, relation_attnums(conn, table, names, self._previous_schema(table)))
        previous = self._previous_schema(table)
        if not replay:  # rows changed without change events (a rewrite, partitions): re-base (cdc/rebase.py)
            self._rewrites.check(conn, table, table_id, previous, schema, catalog, lsn)
        if self._ddl_on and previous is not None and _same_columns(previous, schema):
            # the trigger's message recorded this version at the DDL's commit, with the fast defaults
            # as of then: the catalog read now may have lost them to a later rewrite
            schema = previous
        version = self.log.schema_version(table_id, schema, lsn)
        idx = schema.key_indexes
        self._rels[msg.relation_id] = Rel(table, table_id, version, idx, max(idx, default=-1) + 1, positional)

    def _check_full_published(self, conn, table: TableName) -> None:
        """A keyless table followed insert-only that got REPLICA IDENTITY FULL while followed: it is
        still in the insert-only publication alone, so its updates and deletes never reach us. Stop
        before this change (nothing past it is acknowledged): a new copy in the main publication
        makes the follower exact again."""
        publication = self.pipeline.publication
        if not followed_insert_only(conn, publication, table):
            return
        raise SourceError(
            f"table {table} got REPLICA IDENTITY FULL while followed insert-only: it is in publication "
            f"{insert_publication(publication)} (inserts only), not in {publication}, so its updates and deletes "
            "are not captured; the stream stopped before its next change and acknowledged nothing past it",
            f"run `{snapshot_command(self.pipeline, table)}` (it adds {table} to publication {publication} and copies "
            "it again, as its updates and deletes since the change were not captured), then start the stream again",
        )

    def _check_default_published(self, conn, table: TableName, identity: str) -> None:
        """A keyless table followed as a multiset that got REPLICA IDENTITY DEFAULT (or NOTHING) while
        followed: still in the main publication, so PostgreSQL refuses the application's UPDATE and
        DELETE on it, and its inserts are all its changes: captured exactly, so the stream goes on
        and says so once (at start the check did: `identity_warned`)."""
        publication = self.pipeline.publication
        if table in self.identity_warned or not in_publication(conn, publication, table):
            return
        if not table_info(conn, table).insert_only:
            return  # FULL again by now (older WAL decoded): nothing to fix
        self.identity_warned.add(table)
        problem = switched_to_default(
            table, identity, publication, lambda t: snapshot_command(self.pipeline, t)
        )
        logger.warning(f"{problem.what}\n  fix: {problem.fix}")

    def _new_keyless(self, conn, table: TableName) -> bool:
        """A keyless table that joined while streaming (`cdc snapshot --tables`): followed by position
        when the log never had it with a key (rows keyed by their key before cannot continue by position)."""
        previous = self._previous_schema(table)
        if previous is not None and previous.key:
            return False
        info = table_info(conn, table)
        if not (info.insert_only or info.multiset):
            return False
        self._keyless.add(table)
        return True

    # DDL capture (cdc/ddl.py)
    def _check_ddl(self, conn, start: bool = False) -> None:
        """Whether the event trigger is there: said at start, and when it goes or comes back."""
        self._ddl_checked = time.monotonic()
        try:
            state = ddl.trigger_state(conn, self.pipeline.name)
        except psycopg2.Error:
            return  # the catalog connection is gone: the next check tells
        on = state.complete
        installed = ddl.load_installed(self.pipeline.state_path) is not None
        if start or on != self._ddl_on:
            line, fix = ddl.mode_line(
                state,
                installed,
                self.pipeline.command("ddl install"),
                self.pipeline.command("ddl remove"),
            )
            if fix:
                logger.warning(f"{line}\n  fix: {fix}")
            elif start or on:
                logger.info(line)
        self._ddl_on = on

    def _ddl_message(self, conn, content: bytes, commit_lsn: int, flush: Callable[[], None]) -> None:
        """A schema change of a captured table, in its transaction's place among the rows."""
        try:
            event = ddl.parse(content)
        except ddl.DdlMessageError as exc:
            logger.warning(f"a DDL capture message at commit {format_lsn(commit_lsn)} was not read ({exc})")
            return
        owner = next(
            (s for s in self.log.tables() if s.relid == event.oid and s.state in ("live", "snapshotting")),
            None,
        )
        if owner is None:
            return  # not a table this log captures
        if event.event == "drop":
            flush()  # its rows of this transaction (before the DROP) go to the log first
            self._watch.dropped_at(owner.id, owner.table, commit_lsn)  # marked once the log has the commit
            return
        if event.event == "rewrite":
            self._rewrites.rewritten(
                conn,
                owner.table,
                owner.id,
                commit_lsn,
                "its rows were rewritten by DDL (a type change or a volatile default)",
            )
            return
        table = TableName(event.schema, event.table)
        if table != owner.table:  # RENAME TO / SET SCHEMA: followed by OID, or the stream stops (tablewatch)
            selected = any(s.matches(table) for s in self.selectors)
            table = self._watch.resolve(event.oid, table, commit_lsn, selected, False)
        self._new_version(conn, event, owner.id, table, commit_lsn, flush)

    def _new_version(
        self, conn, event: ddl.DdlEvent, table_id: int, table: TableName, lsn: int, flush: Callable[[], None]
    ) -> None:
        """Record the event's columns as the table's schema version at `lsn`."""
        if not event.columns:
            return
        key = event.key or self._keys.get(table) or ()
        if not key or any(k not in [c.name for c in event.columns] for k in key):
            return  # no usable key: the Relation message with the next change says so
        self._keys[table] = key
        schema = build_schema(
            conn,
            [(c.name, c.type_oid, c.typmod) for c in event.columns],
            key,
            self._types,
            {c.name: (c.ndims, c.missing) for c in event.columns},
        )
        schema = with_attnums(schema, {c.name: c.attnum for c in event.columns})
        flush()  # rows already buffered keep their old schema version
        version = self.log.schema_version(table_id, schema, lsn)
        if event.oid in self._rels:  # pgoutput sends a Relation message before the next row anyway
            idx = schema.key_indexes
            self._rels[event.oid] = Rel(table, table_id, version, idx, max(idx) + 1)

    def _idle_schema_check(self, conn, flushed: int) -> bool:
        """Without DDL capture: tables whose catalog columns differ from the log's latest schema get
        the catalog's columns as a new version at `flushed`, but only when the stream has decoded
        every transaction committed before the catalog was read (nothing of any table is pending,
        so no row still to come predates the catalog's state). Column changes only: a renamed
        table still waits for its next change. Returns whether a version was recorded."""
        self._idle_checked = time.monotonic()
        if self._ddl_on:
            return False
        found: list[tuple[ddl.DdlEvent, int, TableName]] = []
        try:
            for st in self.log.tables():
                if st.state != "live" or st.relid is None:
                    continue
                previous = self._previous_schema(st.table)
                event = ddl.catalog_event(conn, st.relid)
                if event is None or previous is None:
                    continue
                now = [(c.name, c.type_oid, c.typmod) for c in event.columns]
                if now != [(c.name, c.type_oid, c.typmod) for c in previous.columns]:
                    found.append((event, st.id, st.table))
            if not found:
                return False
            with conn.cursor() as cur:
                cur.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint")
                after = int(cur.fetchone()[0])
        except psycopg2.Error:
            return False  # the catalog connection is gone: the next check tells
        if after > flushed:
            return False  # WAL written since may hold rows with the old columns: not safe now
        for event, table_id, table in found:
            previous = self._previous_schema(table)
            self._new_version(conn, event, table_id, table, flushed, lambda: None)
            catalog = table_catalog(conn, table)
            new = self._previous_schema(table)
            if new is not None and previous is not None:
                self._rewrites.check(conn, table, table_id, previous, new, catalog, flushed)
            logger.info(
                f"{table}: its columns changed in the source with no change since (no DDL capture): the log has them "
                f"at {format_lsn(flushed)} ({', '.join(c.name for c in event.columns)})"
            )
        return True

    def _previous_schema(self, table: TableName) -> TableSchema | None:
        """The log's newest schema of `table` (None for a table it has none for yet)."""
        schema = getattr(self.log, "schema", None)  # the local (staging) log; other writers have no history
        try:
            return schema(table) if schema else None
        except LogError:
            return None
