"""What the view stage leaves for the sinks: one small JSON file per view under `<state_dir>/views/`
(owner-only, cdc/ground/private.py), like a sink's checkpoint (pipelines/checkpoints.py).

Per view: the last cut it was maintained to (`cut_id`, `lsn`), the out table's `epoch` (a rebuild
starts a new one: followers then start the view over) and Delta `version` after that cut, the
SQL `fingerprint`, the out table's `columns` and `key`, and per base table the [base offset,
Delta version, Delta table id] it was computed from (the next cut reads the base tables' change
data feed from there). `pending` is the cut a run started: after a crash the next run maintains
exactly that cut again (the out table's MERGE is idempotent per cut id). `error` is why the view
could not be maintained (followers of it fail naming it; the others go on).

Layout under `<state_dir>/views/`: `<view>.json` (this file), `base/` (the internal Delta follower
`_views` of every table the views read), `out/<view>` (each view's own Delta table, CDF on).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc.ground.errors import LogError, SinkError
from pipelines.checkpoints import read_record, write_record

if TYPE_CHECKING:
    from cdc.ground.config import Pipeline

BASE_SINK = "_views"  # the internal Delta follower of the views' base tables (never a user sink name)


@dataclass
class ViewState:
    view: str
    cut_id: int = 0
    lsn: int = 0
    epoch: int = 0  # 0: never built
    version: int = -1  # the out table's Delta version after cut_id
    fingerprint: str = ""
    columns: list[list[str]] = field(default_factory=list)  # [name, Spark type as JSON]
    key: list[str] = field(default_factory=list)
    pending: dict[str, Any] | None = None  # {"cut_id", "lsn", "epoch", "mode", "reason", "base"}
    # str(TableName) -> [base offset, Delta version, Delta table id] of the base table at cut_id
    base: dict[str, list[Any]] = field(default_factory=dict)
    error: dict[str, Any] | None = None  # {"problem", "fix", "cut_id"}: the last run could not maintain it
    mode: str = ""  # how the last cut was maintained: incremental | full
    reason: str = ""  # why full
    ts_ms: int = 0
    # the whole cut at cut_id (every table's [base, end offset]): a follower of the view applies its
    # tables at this cut without asking the log for an old cut (its retention may
    # have dropped it)
    cut_tables: dict[str, list[int]] = field(default_factory=dict)

    def failure(self) -> SinkError | None:
        """The error a follower of this view stops with (None: the view is fine)."""
        if not self.error:
            return None
        return SinkError(self.error["problem"], self.error.get("fix", ""))


def views_dir(state_path: Path) -> Path:
    return state_path / "views"


def base_path(state_path: Path) -> Path:
    """The internal Delta follower of the base tables: <state_dir>/views/base/<schema>/<table>."""
    return views_dir(state_path) / "base"


def out_path(state_path: Path, view: str) -> Path:
    """The view's own Delta table (Change Data Feed on): <state_dir>/views/out/<view>."""
    return views_dir(state_path) / "out" / view


def state_path_of(state_path: Path, view: str) -> Path:
    return views_dir(state_path) / f"{view}.json"


def load_view_state(state_path: Path, view: str) -> ViewState | None:
    path = state_path_of(state_path, view)
    try:
        data = read_record(path, "view", view)
        return None if data is None else ViewState(**data)
    except (OSError, ValueError, TypeError) as exc:
        # save_view_state never leaves half a file: this one was damaged outside the tool
        raise LogError(
            f"view {view}: its state file {path} cannot be read ({type(exc).__name__}: {str(exc)[:120]})",
            f"remove {path}: the next apply rebuilds the view from the base tables (a new epoch: "
            "its followers start it over)",
        ) from None


def view_state(pipeline: Pipeline, view: str) -> ViewState | None:
    """The view's state as the stage left it (None: never maintained yet)."""
    return load_view_state(pipeline.state_path, view)


def save_view_state(state_path: Path, state: ViewState) -> None:
    """Atomic replace + fsync: a crash leaves the old or the new state, never half of one."""
    write_record(views_dir(state_path), state_path_of(state_path, state.view), asdict(state))
