"""The log rows of an update or a delete: keys cut out of the old and new tuples, a key change as a
delete and an insert (as Debezium does it), and the stops for old rows the log cannot key.

Inserts and truncates are built inline in the receive loop (cdc/stream/loop.py), the hot path.
"""

from __future__ import annotations

from typing import Any, NoReturn

import psycopg2

from cdc.ground.errors import SourceError
from cdc.keys import key_from_values, position_key
from cdc.log.base import ChangeRow
from cdc.log.local import LocalLog
from cdc.pgoutput import UNCHANGED, tuple_prefix
from cdc.source import insert_publication, replica_index_without_key
from cdc.stream.relations import Rel, snapshot_command
from cdc.stream.toast import fill_unchanged, has_unchanged


class ChangeRows:
    """Update and delete rows for the log (a part of `StreamReader`)."""

    pipeline: Any
    log: LocalLog
    _conn: Any

    def _old_key(self, rel: Rel, old_kind: str | None, old: bytes) -> bytes:
        old_vals = tuple_prefix(old, 0, rel.key_len)
        if old_kind == "K" and any(old_vals[i] is None for i in rel.key_idx):
            self._short_old_row(rel)  # key columns are NOT NULL: a None here was left out by PostgreSQL
        return key_from_values(old_vals, rel.key_idx)

    def _change_rows(
        self,
        rel: Rel,
        old_kind: str | None,
        old: bytes | None,
        new: bytes | None,
        rows: list[ChangeRow],
        commit_lsn: int,
        seq: int,
        xid: int,
        ts: int,
        elsn: int,
    ) -> int:
        """Append the log rows of an Update (`new` given; two rows when its key changed) or a Delete
        (`new` None), from its TupleData bytes (cdc/pgoutput.py `raw_update`, `raw_delete`); returns
        the new seq."""
        if rel.positional and old_kind == "O":  # keyless, REPLICA IDENTITY FULL: rows are their content
            return self._multiset_rows(rel, old, new, rows, commit_lsn, seq, xid, ts, elsn)
        if rel.positional:  # insert-only: its publication publishes inserts only, someone widened it
            raise SourceError(
                f"an update or delete of keyless table {rel.table} arrived, which is followed insert-only",
                f"run ALTER PUBLICATION {insert_publication(self.pipeline.publication)} SET (publish = 'insert, truncate');"
                f" then `{snapshot_command(self.pipeline, rel.table)}`",
            )
        old_key = None if old is None else self._old_key(rel, old_kind, old)
        if new is None:  # delete
            seq += 1
            rows.append(
                (commit_lsn, seq, "d", old_key, None, old, old_kind, rel.schema_version, xid, ts, elsn)
            )
            return seq
        key_vals = tuple_prefix(new, 0, rel.key_len)
        if any(key_vals[i] is UNCHANGED or key_vals[i] is None for i in rel.key_idx):
            if old_key is None:
                raise SourceError(
                    f"an update of {rel.table} arrived without its key (a key column is an unchanged TOAST value)",
                    f"run ALTER TABLE {rel.table} REPLICA IDENTITY FULL; then `{snapshot_command(self.pipeline, rel.table)}`",
                )
            new_key = old_key
        else:
            new_key = key_from_values(key_vals, rel.key_idx)
        if old_key is not None and old_key != new_key:
            # The key changed: the old row goes away and a new one appears (as Debezium does it).
            if has_unchanged(new):
                schema = self.log.schema_by_version(rel.table_id, rel.schema_version)
                new = fill_unchanged(
                    self._conn, rel.table, schema, rel.key_idx, new, old if old_kind == "O" else None
                )
            seq += 1
            rows.append(
                (commit_lsn, seq, "d", old_key, None, old, old_kind, rel.schema_version, xid, ts, elsn)
            )
            seq += 1
            rows.append((commit_lsn, seq, "c", new_key, new, None, None, rel.schema_version, xid, ts, elsn))
            return seq
        seq += 1
        rows.append((commit_lsn, seq, "u", new_key, new, old, old_kind, rel.schema_version, xid, ts, elsn))
        return seq

    def _multiset_rows(
        self,
        rel: Rel,
        old: bytes | None,
        new: bytes | None,
        rows: list[ChangeRow],
        commit_lsn: int,
        seq: int,
        xid: int,
        ts: int,
        elsn: int,
    ) -> int:
        """A keyless REPLICA IDENTITY FULL table: a row is its content. A delete is a 'd' carrying the
        whole old row (followers remove one row equal to it); an update is that delete and an insert of
        the new row (its identity, the content, changed), each keyed by its own position, so no log
        record ever replaces another. The new row's unchanged TOAST values come from the old row, which
        PostgreSQL sends whole (detoasted) under REPLICA IDENTITY FULL."""
        seq += 1
        rows.append(
            (
                commit_lsn,
                seq,
                "d",
                position_key(commit_lsn, seq),
                None,
                old,
                "O",
                rel.schema_version,
                xid,
                ts,
                elsn,
            )
        )
        if new is None:
            return seq
        if has_unchanged(new):
            schema = self.log.schema_by_version(rel.table_id, rel.schema_version)
            new = fill_unchanged(self._conn, rel.table, schema, (), new, old, read_back=False)
        seq += 1
        rows.append(
            (
                commit_lsn,
                seq,
                "c",
                position_key(commit_lsn, seq),
                new,
                None,
                None,
                rel.schema_version,
                xid,
                ts,
                elsn,
            )
        )
        return seq

    def _short_old_row(self, rel: Rel) -> NoReturn:
        """REPLICA IDENTITY USING INDEX on an index without the primary key: the old row has no key.
        Stop before this transaction's batch commits, so nothing past it is acknowledged."""
        try:
            index = replica_index_without_key(self._conn, rel.table) or "an index"
        except psycopg2.Error:
            index = "an index"  # the catalog connection is gone: the message still holds
        raise SourceError(
            f"table {rel.table} has REPLICA IDENTITY USING INDEX {index}, without the primary key columns: PostgreSQL "
            "sent a deleted (or key-changed) row's old values without the primary key the log keys rows by; "
            "the stream stopped there and acknowledged nothing past it",
            f"run ALTER TABLE {rel.table} REPLICA IDENTITY DEFAULT (or FULL); then start the pipeline over, as the WAL "
            f"already written keeps the short old rows: `{self.pipeline.command('teardown', '--drop-slot', '--yes')}` "
            f"and `{self.pipeline.command('snapshot')}`",
        )
