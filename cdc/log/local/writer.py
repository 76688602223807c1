"""The capture side of the embedded log: tables and schema versions registered, stream batches
appended and committed with a cut, snapshots written as segment files and made a table's base.

A snapshot becomes part of a table's history through marker rows (op 'S', one per segment
file) appended when the snapshot finishes; the first marker is the table's new `base`.
Events the stream appended for the table while it was snapshotting and that are newer than
the snapshot are copied forward behind the markers in the same transaction, so offsets stay
in position order (see docs/guarantees.md).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Collection, Sequence
from pathlib import Path

import orjson

from cdc.ground.errors import LogError
from cdc.ground.tables import TableName
from cdc.log.base import ChangeRow, Cut, LogWriter, TableSchema
from cdc.log.local.cuts import CutStore
from cdc.log.local.store import EV_DDL, EV_INSERT, now_ms


class LocalWriter(CutStore, LogWriter):
    """Capture's writes: rows appended inside an open batch, made durable with a cut by commit()."""

    # ---- tables and schemas ----------------------------------------------------------------------
    def ensure_table(self, table: TableName) -> int:
        tid = self.table_id(table)
        if tid is not None:
            return tid
        with self.write():
            tid = self.table_id(table)  # again under the write lock: another process may have added it
            if tid is not None:
                return tid
            cur = self.db.execute(
                "INSERT INTO tables(schema_name, table_name) VALUES (?, ?)", (table.schema, table.name)
            )
            tid = cur.lastrowid
            assert tid is not None  # set by every INSERT
            self.db.execute(EV_DDL.format(id=tid))
        return tid

    def schema_version(self, table_id: int, schema: TableSchema, since_lsn: int) -> int:
        latest = self._latest_version.get(table_id)
        if latest is not None and latest[1] == schema:
            return latest[0]
        with self.write():
            # Read again under the write lock: another process (a `cdc snapshot --tables` next to
            # `cdc stream`) may have added a version since this one cached the table's latest.
            latest = self._load_latest_version(table_id)
            if latest is not None and latest[1] == schema:
                return latest[0]
            # An equal older version (e.g. a column dropped then re-added the same way) is not reused:
            # versions only grow, which keeps "which layout does this row have" a simple lookup.
            version = (latest[0] + 1) if latest else 1
            self.db.execute(
                "INSERT INTO schemas(table_id, version, body, since_lsn) VALUES (?, ?, ?, ?)",
                (table_id, version, orjson.dumps(schema.to_json()).decode(), since_lsn),
            )
        self._latest_version[table_id] = (version, schema)
        self._schemas[(table_id, version)] = schema
        return version

    # ---- source identity, dropped tables -----------------------------------------------------------
    def set_relid(self, table_id: int, relid: int) -> None:
        """Record the source relation (pg_class OID) a log table captures."""
        with self.write():
            self.db.execute("UPDATE tables SET relid = ? WHERE id = ?", (relid, table_id))

    def rename_table(self, table_id: int, table: TableName) -> None:
        """Follow a source table renamed under the same OID: its history, schemas and base stay,
        under the new name (joins the open batch, so it is durable with the changes after it)."""
        with self.write():
            self.db.execute(
                "UPDATE tables SET schema_name = ?, table_name = ? WHERE id = ?",
                (table.schema, table.name, table_id),
            )

    def mark_dropped(self, table_ids: Collection[int], lsn: int) -> Cut:
        """Mark tables gone from the source (dropped, or renamed away) once the stream is durable
        past `lsn`: they keep their events and stay in cuts (a follower that has not applied
        their last changes still gets them), with state 'dropped'. A cut records the change."""
        with self.write():
            for tid in table_ids:
                self.db.execute(
                    "UPDATE tables SET state = 'dropped', dropped_lsn = ? WHERE id = ? AND state = 'live'",
                    (lsn, tid),
                )
            return self._write_cut(lsn)

    def remove_table(self, table: TableName) -> Cut:
        """Take a table out of the log: its events, schemas and snapshot files; later cuts do not
        list it. Followers keep what they have; a stream no longer captures it (unless the
        pipeline file still names it, which then needs `cdc snapshot --tables`)."""
        tid = self.require_table(table)
        with self.write():
            self.db.execute(
                "DELETE FROM segments WHERE snapshot_id IN (SELECT id FROM snapshots WHERE table_id = ?)",
                (tid,),
            )
            self.db.execute("DELETE FROM snapshots WHERE table_id = ?", (tid,))
            self.db.execute("DELETE FROM schemas WHERE table_id = ?", (tid,))
            self.db.execute("DELETE FROM tables WHERE id = ?", (tid,))
            self.db.execute(f"DROP TABLE IF EXISTS ev_{tid}")
            previous = self.db.execute("SELECT lsn FROM cuts ORDER BY id DESC LIMIT 1").fetchone()
            cut = self._write_cut(previous[0] if previous else 0)
        self._latest_version.pop(tid, None)
        shutil.rmtree(self.path / "segments" / f"t{tid}", ignore_errors=True)
        return cut

    # ---- stream writes ---------------------------------------------------------------------------
    def append(self, table_id: int, rows: Sequence[ChangeRow]) -> None:
        if not rows:
            return
        self._begin()
        since = self._snapshot_lsn.get(table_id)
        if since is not None and rows[0][0] < since:
            # A stream behind the table's snapshot: what committed before the snapshot's
            # consistent point is in the snapshot already; appending it after the base would
            # put offsets out of position order.
            rows = [r for r in rows if r[0] >= since]
        try:
            self.db.executemany(EV_INSERT.format(id=table_id), rows)
        except sqlite3.OperationalError as exc:
            raise self._write_failed(exc) from None

    def _write_failed(self, exc: sqlite3.OperationalError) -> Exception:
        """A full disk (or a failing one) under the log: one clear error instead of SQLite's
        "disk I/O error"; any other SQLite error is passed on as it is."""
        if not any(text in str(exc) for text in ("disk I/O error", "database or disk is full")):
            return exc
        free = shutil.disk_usage(self.path).free
        return LogError(
            f"the local log at {self.path} could not be written ({exc}; {free / 1e6:,.0f} MB free on its filesystem)",
            "free space on that filesystem (or move log.local.path to a bigger disk) and start the command again:"
            " it goes on from the last durable cut (PostgreSQL was told nothing past it)",
        )

    def stream_position(self) -> tuple[int, int] | None:
        value = self._meta("stream_position")
        if value is None:
            return None
        commit_lsn, end_lsn = value.split(",")
        return int(commit_lsn), int(end_lsn)

    def commit(self, lsn: int, stream_position: tuple[int, int] | None = None) -> Cut:
        self._begin()
        try:
            if stream_position is not None:
                self._set_meta("stream_position", f"{stream_position[0]},{stream_position[1]}")
            cut = self._write_cut(lsn)
            self.db.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if self.db.in_transaction:  # SQLite may have rolled back by itself
                self.db.execute("ROLLBACK")
            raise self._write_failed(exc) from None
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        finally:
            self._in_batch = False
        if self.on_commit is not None:
            self.on_commit(cut)
        return cut

    # ---- snapshots -------------------------------------------------------------------------------
    def begin_snapshot(self, table_id: int, lsn: int, schema_version: int) -> int:
        """Start a snapshot of a table at consistent point `lsn`; the table stays as it is for
        readers (invisible if new, its previous snapshot if live) until finish_snapshot()."""
        with self.write():
            self.db.execute(
                "UPDATE tables SET state = CASE WHEN state IN ('live', 'dropped') THEN state ELSE 'snapshotting' END WHERE id = ?",
                (table_id,),
            )
            cur = self.db.execute(
                "INSERT INTO snapshots(table_id, lsn, schema_version, state, started_ms) VALUES (?, ?, ?, 'running', ?)",
                (table_id, lsn, schema_version, now_ms()),
            )
        assert cur.lastrowid is not None  # set by every INSERT
        return cur.lastrowid

    def segment_path(self, table_id: int, snapshot_id: int, chunk: int) -> Path:
        return self.path / "segments" / f"t{table_id}" / f"s{snapshot_id}" / f"c{chunk:05d}.copy"

    def add_segment(self, snapshot_id: int, chunk: int, path: Path, rows: int, nbytes: int) -> None:
        rel = os.path.relpath(path, self.path)
        with self.write():
            self.db.execute(
                "INSERT INTO segments(snapshot_id, chunk, path, rows, bytes) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT(snapshot_id, chunk) DO UPDATE SET path = excluded.path, rows = excluded.rows, bytes = excluded.bytes",
                (snapshot_id, chunk, rel, rows, nbytes),
            )

    def done_chunks(self, snapshot_id: int) -> set[int]:
        return {
            r[0] for r in self.db.execute("SELECT chunk FROM segments WHERE snapshot_id = ?", (snapshot_id,))
        }

    def running_snapshots(self) -> list[tuple[int, int, int, int]]:
        """(snapshot_id, table_id, lsn, schema_version) of snapshots not finished."""
        return list(
            self.db.execute("SELECT id, table_id, lsn, schema_version FROM snapshots WHERE state = 'running'")
        )

    def abandon_snapshot(self, snapshot_id: int) -> None:
        """Forget a snapshot that cannot be finished (its exported snapshot is gone)."""
        row = self.db.execute("SELECT table_id FROM snapshots WHERE id = ?", (snapshot_id,)).fetchone()
        with self.write():
            self.db.execute(
                "UPDATE snapshots SET state = 'abandoned', finished_ms = ? WHERE id = ?",
                (now_ms(), snapshot_id),
            )
            self.db.execute("DELETE FROM segments WHERE snapshot_id = ?", (snapshot_id,))
        if row:
            shutil.rmtree(self.path / "segments" / f"t{row[0]}" / f"s{snapshot_id}", ignore_errors=True)

    def finish_snapshot(self, snapshot_id: int, relid: int | None = None) -> Cut:
        """Make a finished snapshot the table's new base, atomically (see module docstring);
        `relid`: the source relation it was copied from, recorded with it."""
        with self.write():
            table_id, lsn, version = self.db.execute(
                "SELECT table_id, lsn, schema_version FROM snapshots WHERE id = ?", (snapshot_id,)
            ).fetchone()
            first_new = self.db.execute(f"SELECT coalesce(max(off), 0) + 1 FROM ev_{table_id}").fetchone()[0]
            segments = self.db.execute(
                "SELECT id, rows FROM segments WHERE snapshot_id = ? ORDER BY chunk", (snapshot_id,)
            ).fetchall()
            markers = [
                (lsn, 0, "S", None, str(seg_id).encode(), None, None, version, None, None, lsn)
                for seg_id, _ in segments
            ]
            if not markers:  # an empty table still needs a base: an empty marker
                markers = [(lsn, 0, "S", None, b"", None, None, version, None, None, lsn)]
            self.db.executemany(EV_INSERT.format(id=table_id), markers)
            base = self.db.execute(
                f"SELECT min(off) FROM ev_{table_id} WHERE off >= ?", (first_new,)
            ).fetchone()[0]
            # Stream events newer than the snapshot, written while it ran, move behind the markers.
            self.db.execute(
                f"INSERT INTO ev_{table_id}(lsn, seq, op, key, payload, before, before_kind, sv, xid, ts, elsn)"
                f" SELECT lsn, seq, op, key, payload, before, before_kind, sv, xid, ts, elsn FROM ev_{table_id}"
                " WHERE off < ? AND op != 'S' AND (lsn > ? OR (lsn = ? AND seq > 0)) ORDER BY off",
                (first_new, lsn, lsn),
            )
            total = sum(r for _, r in segments)
            self.db.execute(
                "UPDATE tables SET state = 'live', base = ?, snapshot_lsn = ?, purged_below = 0, dropped_lsn = NULL,"
                " relid = coalesce(?, relid) WHERE id = ?",
                (base, lsn, relid, table_id),
            )
            self.db.execute(
                "UPDATE snapshots SET state = 'done', finished_ms = ?, rows = ? WHERE id = ?",
                (now_ms(), total, snapshot_id),
            )
            stream = self._meta("stream_position")
            cut_lsn = max(lsn, int(stream.split(",")[1])) if stream else lsn
            return self._write_cut(cut_lsn)
