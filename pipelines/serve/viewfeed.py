"""Derived views served like tables (docs/change-feed.md), read with delta-rs (no JVM in the server).

The view stage keeps each view's rows in its own Delta table, Change Data Feed on, at
`<state_dir>/views/out/<view>` (pipelines/views/state.py); each maintained cut is one MERGE, one
Delta commit tagged with the Delta txn (`cdc-view:<pipeline>:<view>`, cut id), and the view's state
file records the cut it was maintained to and the out table's `version` after it. So:

  * initial rows: the out table at the state file's `version` (the latest applied cut; a cut being
    maintained right now is not served until its state is saved);
  * live changes: the out table's change data feed from the client's version to that version, one
    event per cut (per Delta commit, named by its txn's cut id);
  * position (event id): `<table id>-<version>`, the first 8 hex digits of the out table's Delta
    table id, then the Delta version. A rebuilt view (a new epoch: the out table is made anew, with
    a new table id) answers must-refetch `rebuilt`; a version whose change data is gone (VACUUM or
    log cleanup) must-refetch `compacted`.

One watcher per server reads the state files (every poll, a stat unless one changed) and wakes the
view's clients; each client's catch-up reads at most READ_VERSIONS cuts at a time, and reads of the
same range are shared by every client at that position (a small cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from cdc.ground.errors import UsageError
from pipelines.serve.feed import Control
from pipelines.serve.logview import Change
from pipelines.views.state import load_view_state, out_path, state_path_of
from sinks.delta.arrowread import read_delta

SCHEMA = "views"  # a view is named views.<name> in token lists, like a sink names it
READ_VERSIONS = 64  # cuts per change data read: bounds one read's memory
_POSITION = re.compile(r"^([0-9a-f]{8})-(\d+)$")


@dataclass(frozen=True)
class ViewAt:
    """Where a view stands: its out table (Delta table id), the version after its latest cut."""

    view: str
    table_id: str
    version: int
    cut_id: int
    lsn: int
    key: tuple[str, ...]

    @property
    def position(self) -> str:
        return f"{self.table_id[:8]}-{self.version}"


def parse_position(text: str) -> tuple[str, int]:
    m = _POSITION.match(text.strip())
    if m is None:
        raise UsageError(
            f"{text!r} is not a view position",
            "a view's position is `<8 hex digits>-<version>`, as its initial rows' `position` and its event ids",
        )
    return m.group(1), int(m.group(2))


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        import base64

        return base64.b64encode(value).decode()
    return str(value)  # Decimal as its exact text (like the log's numeric)


def _dumps(value: Any) -> bytes:
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS)


@dataclass
class ViewEvents:
    events: list[tuple[int, int | None, list[Change]]]  # (last version, cut id, changes)
    upto: int  # the version read up to


class ViewAccess:
    """Reads of the view stage's files; every method runs in a worker thread."""

    def __init__(self, state_dir: Path, views: list[str]):
        self.state_dir = state_dir
        self.views = views
        self._stamp: dict[str, tuple[int, int]] = {}
        self._at: dict[str, ViewAt | None] = {}
        self._rows: OrderedDict[tuple[str, str, int], list[Change]] = OrderedDict()
        self._reads: OrderedDict[tuple[str, str, int, int], ViewEvents] = OrderedDict()
        self._lock = threading.Lock()

    def path(self, view: str) -> Path:
        return out_path(self.state_dir, view)

    def at(self, view: str) -> ViewAt | None:
        """The view's latest maintained cut (None: not built yet); the state file read again only
        when it changed."""
        file = state_path_of(self.state_dir, view)
        try:
            st = file.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            self._at[view] = None
            self._stamp.pop(view, None)
            return None
        if self._stamp.get(view) == stamp:
            return self._at[view]
        state = load_view_state(self.state_dir, view)
        at = None
        if state is not None and state.epoch > 0 and state.version >= 0:
            from deltalake import DeltaTable

            # str(): deltalake types the id int, it is the table's UUID text
            table_id = str(DeltaTable(str(self.path(view)), version=state.version).metadata().id)
            at = ViewAt(
                view, table_id.replace("-", ""), state.version, state.cut_id, state.lsn, tuple(state.key)
            )
        self._at[view], self._stamp[view] = at, stamp
        return at

    def rows(self, at: ViewAt) -> list[Change]:
        """The view's rows at `at` as `r` envelopes, sorted by key (pages are stable)."""
        key = (at.view, at.table_id, at.version)
        with self._lock:
            if key in self._rows:
                self._rows.move_to_end(key)
                return self._rows[key]
        rows = read_delta(self.path(at.view), at.version).to_pylist()
        rows.sort(key=lambda r: tuple(str(r.get(k)) for k in at.key))
        source = {"view": at.view, "cut": at.cut_id, "lsn": at.lsn, "version": at.version, "snapshot": True}
        changes = [Change(_dumps({"before": None, "after": r, "source": source, "op": "r"})) for r in rows]
        with self._lock:
            self._rows[key] = changes
            while len(self._rows) > 4:
                self._rows.popitem(last=False)
        return changes

    def _cut_of(self, view: str, version: int) -> int | None:
        """The cut id of a commit of the out table: its Delta txn (None when the commit file is gone)."""
        try:
            text = (self.path(view) / "_delta_log" / f"{version:020d}.json").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if '"txn"' in line:
                txn = orjson.loads(line).get("txn")
                if txn and str(txn.get("appId", "")).endswith(f":{view}"):
                    return int(txn["version"])
        return None

    def changes(self, at: ViewAt, table_id: str, version: int) -> tuple[ViewEvents, Control | None]:
        """The cuts after `version` of the out table `table_id`, up to `at` (at most READ_VERSIONS)."""
        if table_id != at.table_id[:8]:
            return ViewEvents([], version), Control(
                "rebuilt", f"view {at.view} was rebuilt (a new epoch); fetch its rows anew"
            )
        if version > at.version:
            return ViewEvents([], version), Control(
                "unknown-position",
                f"version {version} is past view {at.view}'s latest ({at.version}); fetch its rows anew",
            )
        if version == at.version:
            return ViewEvents([], version), None
        end = min(at.version, version + READ_VERSIONS)
        key = (at.view, at.table_id, version, end)
        with self._lock:
            if key in self._reads:
                return self._reads[key], None
        try:
            got = self._read(at, version, end)
        except Exception as exc:  # a version vacuumed, its commit file cleaned up: nothing to resume from
            why = f"{type(exc).__name__}: {str(exc)[:160]}"
            return ViewEvents([], version), Control(
                "compacted",
                f"view {at.view}'s change data after version {version} is no longer readable ({why}); fetch its rows anew",
            )
        with self._lock:
            self._reads[key] = got
            while len(self._reads) > 16:
                self._reads.popitem(last=False)
        return got, None

    def _read(self, at: ViewAt, version: int, end: int) -> ViewEvents:
        import pyarrow as pa
        from deltalake import DeltaTable

        table = DeltaTable(str(self.path(at.view)), version=end)
        if str(table.metadata().id).replace("-", "") != at.table_id:
            raise RuntimeError("the out table was replaced while reading")
        rows = pa.table(table.load_cdf(starting_version=version + 1, ending_version=end)).to_pylist()
        by_version: dict[int, list[dict[str, Any]]] = {}
        for row in rows:
            by_version.setdefault(int(row.pop("_commit_version")), []).append(row)
        events: list[tuple[int, int | None, list[Change]]] = []
        for v in sorted(by_version):
            cut = self._cut_of(at.view, v)
            pairs: dict[tuple[str, ...], dict[str, Any]] = {}
            for row in by_version[v]:
                kind = row.pop("_change_type")
                row.pop("_commit_timestamp", None)
                k = tuple(str(row.get(c)) for c in at.key)
                slot = pairs.setdefault(k, {"before": None, "after": None})
                if kind in ("update_preimage", "delete"):
                    slot["before"] = row
                else:
                    slot["after"] = row
            source = {"view": at.view, "cut": cut, "version": v}
            changes = []
            for k in sorted(pairs):
                before, after = pairs[k]["before"], pairs[k]["after"]
                op = "u" if before is not None and after is not None else ("c" if after is not None else "d")
                changes.append(Change(_dumps({"before": before, "after": after, "source": source, "op": op})))
            if events and cut is not None and events[-1][1] == cut:  # one cut in two commits: one event
                events[-1] = (v, cut, events[-1][2] + changes)
            else:
                events.append((v, cut, changes))
        return ViewEvents(events, end)


@dataclass(eq=False)
class ViewFeed:
    name: str
    at: ViewAt | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)


class ViewHub:
    """One watcher of the views' state files for the whole server."""

    def __init__(self, access: ViewAccess, poll_s: float):
        self.access = access
        self.poll_s = max(poll_s, 0.1)
        self.feeds = {name: ViewFeed(name) for name in access.views}
        self.error: str | None = None

    async def start(self) -> None:
        await self.look()

    async def look(self) -> None:
        error = None
        for feed in self.feeds.values():
            try:
                at = await asyncio.to_thread(self.access.at, feed.name)
            except Exception as exc:  # a state file or out table unreadable now: said on /healthz
                error = f"view {feed.name}: {type(exc).__name__}: {str(exc)[:200]}"
                continue
            if at != feed.at:
                feed.at = at
                feed.wake()
        self.error = error

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self.look()
