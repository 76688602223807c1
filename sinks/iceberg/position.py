"""A follower's position in an Iceberg table: the newest snapshot its app id committed with a cut
(`pgcdc.cut`, sinks/iceberg/commit.py) among the snapshots the table's current state descends from.

Only the ancestors count: after a rollback behind the tool (`CALL <catalog>.system.
rollback_to_snapshot(...)`), the snapshots of the cuts rolled back stay in the metadata but are no
longer in the table; counting them would make the follower believe it still holds those cuts. The
walk goes from the current snapshot through parent ids and stops at the first snapshot of the
follower (a follower's cut ids only grow along its commits). It is one function for both readers:
the Iceberg Java API on the driver (commit.py applied_cut) and pyiceberg without Spark
(catalogread.py, `cdc status`), each giving the snapshots by id as (parent id, summary).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

APP_ID = "pgcdc.app-id"
CUT = "pgcdc.cut"

# (parent snapshot id or None, the snapshot's summary); None: the metadata no longer has it (expired)
Lookup = Callable[[int], "tuple[int | None, Mapping[str, Any]] | None"]


def carries(summary: Mapping[str, Any], app_id: str) -> bool:
    """The snapshot is a commit of `app_id` that carries its cut."""
    return summary.get(APP_ID) == app_id and summary.get(CUT) is not None


@dataclass(frozen=True)
class Walk:
    """The walk from the current snapshot through parent ids towards the follower's snapshot."""

    ids: list[int]  # the snapshots walked, from the current one; the follower's last when found
    summary: Mapping[str, Any] | None  # the follower's snapshot's summary; None: not found
    chain_cut: bool  # stopped at a snapshot the metadata no longer has (expired), not at the root


def walk_to_follower(current: int | None, lookup: Lookup, app_id: str) -> Walk:
    """From `current` through parent ids to the newest snapshot of `app_id` with a cut."""
    seen: list[int] = []
    at = current
    while at is not None:
        found = None if at in seen else lookup(at)  # `seen`: a loop in broken metadata
        if found is None:
            return Walk(seen, None, chain_cut=True)  # expired: the chain is cut here
        seen.append(at)
        parent, summary = found
        if carries(summary, app_id):
            return Walk(seen, summary, chain_cut=False)
        at = parent
    return Walk(seen, None, chain_cut=False)  # the table's first snapshot (or none) reached


def follower_snapshot(
    current: int | None,
    lookup: Lookup,
    kept_newest_first: Callable[[], Iterable[tuple[int, Mapping[str, Any]]]],
    app_id: str,
) -> tuple[int, Mapping[str, Any]] | None:
    """(snapshot id, summary) of the newest snapshot of `app_id` with a cut among the ancestors of
    the `current` snapshot (itself included); None when the current state holds none (no snapshot,
    or a chain down to the first snapshot without one: rolled back before the follower's first cut).

    Where the chain is cut (a user expired a snapshot between the current one and the follower's
    newest ancestor), the ancestry cannot be told further: the answer is then the newest snapshot
    of `app_id` the metadata keeps (`kept_newest_first`, commit order, read only in that case), as
    before ancestry was checked. `cdc maintain` keeps every snapshot of that walk (maintain.py
    `protected`), so it never cuts the chain itself; a rollback whose chain a user expired
    afterwards is not seen then."""
    walked = walk_to_follower(current, lookup, app_id)
    if walked.summary is not None:
        return walked.ids[-1], walked.summary
    if not walked.chain_cut:
        return None  # walked to the table's first snapshot (or none): the current state has no cut
    for snapshot_id, summary in kept_newest_first():
        if carries(summary, app_id):
            return snapshot_id, summary
    return None
