"""Cuts of the embedded log: recording them, keeping the ones followers hold, looking them up.

A cut (cdc/log/base.py) is written inside the transaction that makes a batch, a finished
snapshot or a table change durable. Retention: the newest `keep` cuts always stay, older ones
while a follower of the pipeline holds them (cdc/log/holds.py), up to a bound in count and age;
past the bound the oldest go and an alarm names the followers that needed them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from cdc.ground.logsetup import STDERR
from cdc.ground.remedy import Command, placeholder
from cdc.ground.tables import TableName
from cdc.log.base import Cut, TableRange
from cdc.log.local.store import LocalStore, now_ms

logger = logging.getLogger(__name__)

KEEP_CUTS = 200


class CutStore(LocalStore):
    """Cuts written inside the open write transaction, pruned as retention allows, read back."""

    def __init__(
        self, path: Path, synchronous: str = "full", readonly: bool = False, command: Command = placeholder
    ):
        super().__init__(path, synchronous, readonly, command)
        self.set_retention(
            KEEP_CUTS, KEEP_CUTS, 0, None
        )  # no holds: the newest KEEP_CUTS (open_log sets the pipeline's)
        self._alarmed: dict[str, int] = {}

    def _write_cut(self, lsn: int) -> Cut:
        """Record the current end of every live (or dropped) table (inside the open write transaction)."""
        previous = self.db.execute("SELECT lsn FROM cuts ORDER BY id DESC LIMIT 1").fetchone()
        lsn = max(lsn, previous[0]) if previous else lsn  # a cut never moves back
        ranges: dict[TableName, TableRange] = {}
        body: dict[str, list[int]] = {}
        for tid, schema_name, table_name, base in self.db.execute(
            "SELECT id, schema_name, table_name, base FROM tables WHERE state IN ('live', 'dropped')"
        ).fetchall():
            end = self.db.execute(f"SELECT coalesce(max(off), 0) FROM ev_{tid}").fetchone()[0]
            ranges[TableName(schema_name, table_name)] = TableRange(base, end)
            body[str(tid)] = [base, end]
        ts = now_ms()
        cur = self.db.execute(
            "INSERT INTO cuts(lsn, ts_ms, tables) VALUES (?, ?, ?)", (lsn, ts, orjson.dumps(body).decode())
        )
        cut_id = cur.lastrowid
        assert cut_id is not None  # set by every INSERT
        if cut_id % 50 == 0:
            self._prune_cuts(cut_id, ts)
        return Cut(cut_id, lsn, ts, ranges)

    # ---- cut retention ---------------------------------------------------------------------------
    def set_retention(
        self,
        keep: int,
        held_max: int,
        held_max_age_s: float,
        holds: Callable[[], dict[str, int]] | None,
        pipeline: str = "",
    ) -> None:
        """Keep the newest `keep` cuts, and older ones from the slowest follower's position on
        (`holds`: follower -> oldest cut id it needs, cdc/log/holds.py), but never more than
        `held_max` cuts nor cuts older than `held_max_age_s`: past that bound the oldest go and
        the alarm (meta `cut_retention_alarm`, a metric, a warning on stderr) names the followers."""
        self.keep_cuts, self.held_max, self.held_max_age_s, self._holds = (
            keep,
            held_max,
            held_max_age_s,
            holds,
        )
        self._pipeline = pipeline

    def _first_cut_since(self, ts_ms: int) -> int | None:
        """The oldest cut id written at or after ts_ms (ids are contiguous: cuts only go from the
        oldest on), by bisection on the primary key, not a scan of a long-held table."""
        lo, hi = self.db.execute("SELECT min(id), max(id) FROM cuts").fetchone()
        if lo is None:
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            row = self.db.execute(
                "SELECT id, ts_ms FROM cuts WHERE id >= ? ORDER BY id LIMIT 1", (mid,)
            ).fetchone()
            if row[1] >= ts_ms:
                hi = mid
            else:
                lo = row[0] + 1
        return int(lo)

    def _prune_cuts(self, cut_id: int, ts_ms: int) -> None:
        """Drop the cuts no one holds (inside the open write transaction)."""
        below = cut_id - self.keep_cuts + 1  # the newest keep_cuts always stay
        holds = self._holds() if self._holds is not None else {}
        if holds and min(holds.values()) < below:
            by_age = self._first_cut_since(ts_ms - int(self.held_max_age_s * 1000)) or below
            bound = min(below, max(cut_id - self.held_max + 1, by_age))
            below = max(min(holds.values()), bound)
        overdue = {f: c for f, c in sorted(holds.items()) if c < below}
        alarm = (
            orjson.dumps({"ts_ms": ts_ms, "below": below, "followers": overdue}).decode() if overdue else ""
        )
        if bool(alarm) != bool(self._meta("cut_retention_alarm")) or (overdue and overdue != self._alarmed):
            self._set_meta("cut_retention_alarm", alarm)
            if overdue:
                from cdc import metrics

                metrics.CUTS_DROPPED_HELD.labels(self._pipeline).inc()
                who = ", ".join(f"{f} (at cut {c})" for f, c in overdue.items())
                logger.warning(
                    f"the log dropped cuts below {below} that {who} still needed: it reached its bound"
                    f" (log.local.held_cuts_max {self.held_max:,} cuts / held_cuts_max_age_s {self.held_max_age_s:g} s);"
                    " such a follower is rebuilt by `cdc reset PIPELINE --sink NAME --rebuild`",
                    extra=STDERR,
                )
        self._alarmed = overdue
        self.db.execute("DELETE FROM cuts WHERE id < ?", (below,))

    def retention(self) -> dict[str, Any]:
        """What `cdc status` shows of cut retention: the oldest cut kept (how far back a rewind
        reaches) and the alarm, if the bound dropped cuts a follower held."""
        row = self.db.execute("SELECT id, ts_ms FROM cuts ORDER BY id LIMIT 1").fetchone()
        alarm = self._meta("cut_retention_alarm")
        out: dict[str, Any] = {"oldest_cut": None if row is None else {"id": row[0], "ts_ms": row[1]}}
        if alarm:
            out["alarm"] = orjson.loads(alarm)
        return out

    def cut(self, cut_id: int) -> Cut | None:
        """An earlier cut by id (see set_retention for which are kept; None when it is gone or never was)."""
        row = self.db.execute("SELECT id, lsn, ts_ms, tables FROM cuts WHERE id = ?", (cut_id,)).fetchone()
        return None if row is None else self._cut_of(row)

    def latest_cut(self) -> Cut | None:
        row = self.db.execute("SELECT id, lsn, ts_ms, tables FROM cuts ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            return None
        return self._cut_of(row)

    def _cut_of(self, row: tuple[Any, ...]) -> Cut:
        names = {t.id: t.table for t in self.tables()}
        body = orjson.loads(row[3])
        ranges = {names[int(k)]: TableRange(b, e) for k, (b, e) in body.items() if int(k) in names}
        return Cut(row[0], row[1], row[2], ranges)
