"""Compaction of the local log: the newest event per key survives (DESIGN.md §6).

Per live table:
  * rows below the table's base (an older snapshot's history) go;
  * everything before the newest truncate goes (the truncate itself stays);
  * for each key only the newest event stays. When that event is an update carrying
    unchanged-TOAST markers, the values are filled in from the older events being dropped,
    so nothing a bootstrapping follower needs is lost;
  * deletes older than the tombstone retention go as well; the table remembers the highest
    offset purged (`purged_below`), and a follower whose position is below it must bootstrap
    again instead of silently missing a delete;
  * snapshot segment files are rewritten without rows whose key has a newer event;
  * keyless tables (records keyed by position: docs/keyless-tables.md) keep every record after
    the base and the newest truncate: a delete there removes one row of its content, not a key.

Order matters for crash safety: segments are rewritten first (dropping only superseded rows,
while the superseding events still exist), then the event deletions commit in one SQLite
transaction. A crash between the two leaves a correct log.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc.ground.errors import UsageError
from cdc.ground.private import private_open
from cdc.keys import key_from_copy_fields
from cdc.log.base import TableState
from cdc.log.local import LocalLog, iter_segment
from cdc.pgoutput import UNCHANGED, decode_tuple
from cdc.pgoutput_encode import encode_tuple

if TYPE_CHECKING:
    from cdc.ground.config import Pipeline

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(text: str) -> float:
    m = _DURATION.match(text)
    if not m:
        raise UsageError(f"not a duration: {text!r}", "write it like 30s, 15m, 24h or 7d")
    return float(m.group(1)) * _UNIT[m.group(2)]


@dataclass
class TableCompaction:
    table: str
    events_before: int = 0
    events_after: int = 0
    segment_rows_before: int = 0
    segment_rows_after: int = 0
    purged_deletes: int = 0
    merged_toast: int = 0


@dataclass
class _Plan:
    delete_offsets: list[int] = field(default_factory=list)
    rewrites: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, new payload)
    superseded: set[bytes] = field(default_factory=set)  # keys whose snapshot row is no longer needed
    purged_below: int = 0
    start: int = 0  # first offset that survives (the base, or the newest truncate)


def _groups(rows: Iterator[tuple[Any, ...]]) -> Iterator[list[tuple[Any, ...]]]:
    group: list[tuple[Any, ...]] = []
    for row in rows:
        if group and row[1] != group[0][1]:
            yield group
            group = []
        group.append(row)
    if group:
        yield group


def _merge_unchanged(group: list[tuple[Any, ...]]) -> tuple[bytes | None, bool]:
    """Fill the newest update's unchanged-TOAST values from older events of the same key.
    Returns (new payload or None if nothing changed, fully resolved?)."""
    newest = group[-1]
    values = list(decode_tuple(newest[3], 0)[0])
    missing = [i for i, v in enumerate(values) if v is UNCHANGED]
    if not missing:
        return None, True
    if any(row[4] != newest[4] for row in group):
        return None, False  # schema changed in between: keep the history as it is
    for row in reversed(group[:-1]):
        if row[2] == "d" or row[3] is None:
            break
        older = decode_tuple(row[3], 0)[0]
        for i in list(missing):
            if older[i] is not UNCHANGED:
                values[i] = older[i]
                missing.remove(i)
        if not missing or row[2] == "c":
            break
    changed = len(missing) < sum(1 for v in decode_tuple(newest[3], 0)[0] if v is UNCHANGED)
    return (encode_tuple(values) if changed else None), not missing


def _plan_table(log: LocalLog, state: TableState, retention_s: float, stats: TableCompaction) -> _Plan:
    tid, base = state.id, state.base or 0
    db = log.db
    plan = _Plan(purged_below=state.purged_below)
    cutoff_us = int((time.time() - retention_s) * 1_000_000)
    plan.delete_offsets += [r[0] for r in db.execute(f"SELECT off FROM ev_{tid} WHERE off < ?", (base,))]
    last_truncate = db.execute(
        f"SELECT max(off) FROM ev_{tid} WHERE op = 't' AND off >= ?", (base,)
    ).fetchone()[0]
    start = base
    if last_truncate is not None:
        plan.delete_offsets += [
            r[0]
            for r in db.execute(f"SELECT off FROM ev_{tid} WHERE off >= ? AND off < ?", (base, last_truncate))
        ]
        start = last_truncate
    plan.start = start
    latest = log._load_latest_version(tid)
    if latest is not None and not latest[1].key:
        # a keyless table's records are keyed by position, so none replaces another; a delete (of a
        # REPLICA IDENTITY FULL table) removes one row of its content, which may be any earlier
        # record: it must stay as long as they do. Only what the base and truncates end goes.
        return plan
    rows = db.execute(
        f"SELECT off, key, op, payload, sv, ts FROM ev_{tid} WHERE key IS NOT NULL AND off >= ? ORDER BY key, off",
        (start,),
    )
    for group in _groups(rows):
        newest = group[-1]
        resolved = True
        if newest[2] == "u":
            payload, resolved = _merge_unchanged(group)
            if payload is not None:
                plan.rewrites.append((newest[0], payload))
                stats.merged_toast += 1
        if resolved:
            plan.delete_offsets += [row[0] for row in group[:-1]]
            plan.superseded.add(newest[1])
        if newest[2] == "d" and newest[5] is not None and newest[5] < cutoff_us and resolved:
            plan.delete_offsets.append(newest[0])
            plan.purged_below = max(plan.purged_below, newest[0])
            stats.purged_deletes += 1
    return plan


def _rewrite_segments(
    log: LocalLog, state: TableState, plan: _Plan, stats: TableCompaction
) -> list[tuple[int, int, int]]:
    """Rewrite this table's live segments without superseded keys; returns (segment id, rows, bytes)."""
    updates = []
    markers = log.db.execute(
        f"SELECT e.sv, s.id, s.path, s.rows FROM ev_{state.id} e JOIN segments s ON e.op = 'S' AND e.payload != x''"
        " AND s.id = CAST(e.payload AS INTEGER) WHERE e.off >= ?",
        (plan.start,),
    ).fetchall()
    for version, seg_id, rel_path, rows in markers:
        stats.segment_rows_before += rows
        if not plan.superseded:
            stats.segment_rows_after += rows
            continue
        key_idx = log.schema_by_version(state.id, version).key_indexes
        path = log.path / rel_path
        tmp = Path(str(path) + ".compact")
        kept = nbytes = 0
        with private_open(tmp, "wb") as out:
            for fields in iter_segment(path):
                if key_from_copy_fields(fields, key_idx) in plan.superseded:
                    continue
                line = b"\t".join(fields) + b"\n"
                out.write(line)
                kept += 1
                nbytes += len(line)
            out.flush()
            os.fsync(out.fileno())
        if kept == rows:
            tmp.unlink()
        else:
            os.replace(tmp, path)
            updates.append((seg_id, kept, nbytes))
        stats.segment_rows_after += kept
    return updates


def compact_table(log: LocalLog, state: TableState, retention_s: float) -> TableCompaction:
    stats = TableCompaction(str(state.table))
    tid = state.id
    stats.events_before = log.db.execute(f"SELECT count(*) FROM ev_{tid} WHERE op != 'S'").fetchone()[0]
    plan = _plan_table(log, state, retention_s, stats)
    segment_updates = _rewrite_segments(log, state, plan, stats)
    with log.write():
        if segment_updates:
            log.db.executemany(
                "UPDATE segments SET rows = ?, bytes = ? WHERE id = ?",
                [(r, b, i) for i, r, b in segment_updates],
            )
        log.db.executemany(f"DELETE FROM ev_{tid} WHERE off = ?", [(o,) for o in plan.delete_offsets])
        log.db.executemany(
            f"UPDATE ev_{tid} SET payload = ? WHERE off = ?", [(p, o) for o, p in plan.rewrites]
        )
        # Segments no longer referenced by a marker at or after the base belong to older snapshots.
        dead = log.db.execute(
            "SELECT s.id, s.path FROM segments s JOIN snapshots p ON p.id = s.snapshot_id"
            f" WHERE p.table_id = ? AND p.state != 'running' AND s.id NOT IN"
            f" (SELECT CAST(payload AS INTEGER) FROM ev_{tid} WHERE op = 'S' AND payload != x'' AND off >= ?)",
            (tid, state.base or 0),
        ).fetchall()
        log.db.executemany("DELETE FROM segments WHERE id = ?", [(i,) for i, _ in dead])
        log.db.execute("UPDATE tables SET purged_below = ? WHERE id = ?", (plan.purged_below, tid))
    for _, rel in dead:
        with_path = log.path / rel
        if with_path.exists():
            with_path.unlink()
    stats.events_after = log.db.execute(f"SELECT count(*) FROM ev_{tid} WHERE op != 'S'").fetchone()[0]
    return stats


def compact_log(pipeline: Pipeline, retention_s: float) -> str:
    from cdc.log import open_log

    log = open_log(pipeline)
    try:
        if not isinstance(log, LocalLog):
            return "the kafka log is compacted by the broker (cleanup.policy=compact); nothing to do"
        lines = []
        for state in log.tables():
            if state.state not in ("live", "dropped"):
                continue
            s = compact_table(log, state, retention_s)
            lines.append(
                f"{s.table}: events {s.events_before:,} -> {s.events_after:,}, snapshot rows "
                f"{s.segment_rows_before:,} -> {s.segment_rows_after:,}, deletes purged {s.purged_deletes:,}, "
                f"TOAST values merged {s.merged_toast:,}"
            )
        log.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return "\n".join(lines) or "no live tables to compact"
    finally:
        log.close()
