"""A sink's derived views in a cut: what the apply job adds to the tables' batches.

The view stage (pipelines/views/) leaves per view its out table (Delta, Change Data Feed) and a
state file: the cut it was maintained to, its epoch and the out table's version then. A follower
of view v holds in its checkpoint `tables["views.<v>"] = [epoch, version]` (like a table's
[base, end offset]) and applies, per cut, the out table's changes from that version to the view's
version at the cut (sinks/viewbatch.py). A new epoch (the view rebuilt: its SQL or columns
changed), or a follower that never applied the view, starts it over: the follower's copy is
cleared and every row at that version is written. The pending checkpoint records each view's
[epoch, version, lsn] with the cut, so a crashed cut is applied again with exactly those rows.

A sink applies a cut only when its views are at that cut (the stage may stand at an older or
newer cut than the log's latest when cuts arrive during the run): the follower's tables and
views then always describe the same cut, and a cut id never stands for two different contents
of a view (Delta's idempotent writes skip a cut id seen before).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from cdc.ground.config import Pipeline, SinkConfig, sink_views
from cdc.ground.errors import SinkError
from pipelines.checkpoints import Checkpoint
from pipelines.views.state import ViewState, out_path, view_state
from sinks.base import Sink
from sinks.viewbatch import ViewBatch, view_table

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ViewTarget:
    view: str
    epoch: int
    version: int
    lsn: int
    state: ViewState

    def record(self) -> list[int]:
        return [self.epoch, self.version, self.lsn]


def _apply_hint(pipeline: Pipeline, sink_cfg: SinkConfig) -> str:
    return f"`{pipeline.command('apply', '--once', '--sink', sink_cfg.name)}` brings the view and this follower to the cut"


def view_states(pipeline: Pipeline, sink_cfg: SinkConfig) -> dict[str, ViewState]:
    """The state of each view the sink follows; a view the stage could not maintain (or never built)
    stops this follower with the view's own error."""
    states: dict[str, ViewState] = {}
    for name in sink_views(sink_cfg):
        state = view_state(pipeline, name)
        failure = state.failure() if state is not None else None
        if failure is not None:
            raise SinkError(
                f"sink {sink_cfg.name} follows view {name}, which failed: {failure.problem}", failure.fix
            )
        if state is None or state.epoch == 0 or state.version < 0:
            raise SinkError(
                f"sink {sink_cfg.name}: view {name} has not been built yet", _apply_hint(pipeline, sink_cfg)
            )
        states[name] = state
    return states


def views_cut(pipeline: Pipeline, sink_cfg: SinkConfig, states: dict[str, ViewState]) -> int | None:
    """The one cut every followed view stands at (None: the sink follows no views)."""
    cuts = {s.cut_id for s in states.values()}
    if len(cuts) > 1:
        at = ", ".join(f"{n} at cut {s.cut_id}" for n, s in sorted(states.items()))
        raise SinkError(
            f"sink {sink_cfg.name}: its views stand at different cuts ({at})", _apply_hint(pipeline, sink_cfg)
        )
    return cuts.pop() if cuts else None


def views_moved(states: dict[str, ViewState], ckpt: Checkpoint) -> bool:
    """Whether a view changed since the follower applied it at this same cut (a rebuild of the view
    at the cut it stood at: a new epoch)."""
    for name, state in states.items():
        done = ckpt.tables.get(str(view_table(name)))
        if done is None or done[0] != state.epoch or done[1] != state.version:
            return True
    return False


def view_targets(states: dict[str, ViewState], ckpt: Checkpoint) -> dict[str, ViewTarget]:
    """Per view, the [epoch, version] this cut brings the follower to: the pending cut's when a run
    died mid-way (the same rows again), else the view's state."""
    recorded = (ckpt.pending or {}).get("views") or {}
    targets = {}
    for name, state in states.items():
        again = recorded.get(name)
        if again is not None and again[0] == state.epoch:  # an older epoch's table is gone: start over
            targets[name] = ViewTarget(name, again[0], again[1], again[2], state)
        else:
            targets[name] = ViewTarget(name, state.epoch, state.version, state.lsn, state)
    return targets


def view_batches(
    spark: SparkSession, pipeline: Pipeline, sink: Sink, targets: dict[str, ViewTarget], ckpt: Checkpoint
) -> list[ViewBatch]:
    """The views' batches of the cut; a view the follower starts over is cleared first (its rows of
    an older epoch carry positions the new rows would not be newer than)."""
    batches = []
    for name, target in targets.items():
        table = view_table(name)
        done = ckpt.tables.get(str(table))
        # the out table's version the follower reached in this epoch (None: it starts the view over)
        reached = None if done is None or done[0] != target.epoch else done[1]
        bootstrap = reached is None
        if reached is not None and reached >= target.version:
            continue  # nothing new in the view
        if bootstrap:
            if done is not None:
                logger.info(
                    f"sink {sink.name}: {table}: the view was rebuilt (epoch {target.epoch}): starting it over"
                )
            sink.clear_table(table)
            ckpt.tables.pop(str(table), None)
        columns = [(n, T._parse_datatype_json_string(t)) for n, t in target.state.columns]
        batches.append(
            ViewBatch(
                spark,
                name,
                str(out_path(pipeline.state_path, name)),
                -1 if reached is None else reached,
                target.version,
                bootstrap,
                columns,
                tuple(target.state.key),
                target.lsn,
                target.epoch,
            )
        )
    return batches
