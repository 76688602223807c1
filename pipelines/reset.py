"""`cdc reset PIPELINE --sink NAME (--rebuild | --to-cut N)`: start one follower over.

Only that sink's checkpoint changes; the log and every other follower are left alone.

* `--rebuild`: the checkpoint is replaced by an empty one that asks for a clean start: the next
  `cdc apply` removes the follower's tables (rows, its bookkeeping, markers) and rebuilds each
  from the log's base. For a follower that lost or damaged its data, or whose checkpoint cannot
  be read.
* `--to-cut N`: the checkpoint goes back to cut N (one the log still keeps), so the next apply
  applies every change after it again. Sinks never let an older position overwrite a newer one
  and are idempotent per cut, so changes the follower still holds are left as they are; what
  it lost after N (a restore from a backup taken at cut N) comes back.

The sink's apply lock (pipelines/locks.py) is held while the checkpoint changes, so a running
apply is never rewound under its feet.
"""

from __future__ import annotations

import logging

from cdc.ground.config import Pipeline
from cdc.ground.errors import CdcError, LogError, UsageError
from cdc.log import open_log_view
from pipelines.checkpoints import Checkpoint, checkpoint_path, load_checkpoint, save_checkpoint
from pipelines.locks import sink_lock

logger = logging.getLogger(__name__)


def run_reset(pipeline: Pipeline, sink: str, to_cut: int | None, rebuild: bool) -> None:
    pipeline.sink(sink)  # an unknown sink is exit 2
    if rebuild == (to_cut is not None):
        raise UsageError(
            "cdc reset needs exactly one of --rebuild and --to-cut N", "pass --rebuild or --to-cut N"
        )
    state = pipeline.state_path
    with sink_lock(state, sink):
        if rebuild:
            try:
                old = load_checkpoint(state, sink, pipeline.file)
                was = f"was at cut {old.cut_id}" if old.cut_id else "had not applied anything"
            except CdcError:
                was = "its checkpoint was unreadable"
            save_checkpoint(state, Checkpoint(sink, clear=True))
            logger.info(
                f"sink {sink}: reset ({was}); the next `cdc apply` clears its tables and rebuilds them from the log's base"
            )
            return
        assert to_cut is not None
        ckpt = load_checkpoint(state, sink, pipeline.file)
        if ckpt.pending:
            raise UsageError(
                f"sink {sink}: an apply of cut {ckpt.pending.get('cut_id')} did not finish",
                f"run `{pipeline.command('apply', '--once', '--sink', sink)}` first, then reset",
            )
        if to_cut > ckpt.cut_id:
            raise UsageError(
                f"sink {sink}: it is at cut {ckpt.cut_id}; --to-cut {to_cut} would skip changes",
                f"give a cut up to {ckpt.cut_id}, or run `{pipeline.command('apply', '--once', '--sink', sink)}` to move forward",
            )
        log = open_log_view(pipeline)
        try:
            cut = log.cut(to_cut) if hasattr(log, "cut") else None
            log_id = getattr(log, "log_id", "")
        finally:
            log.close()
        if cut is None:
            raise LogError(
                f"the log does not keep cut {to_cut} any more (or never had it)",
                f"rebuild the follower instead: `{pipeline.command('reset', '--sink', sink, '--rebuild', '--yes')}`",
            )
        rewound = Checkpoint(
            sink,
            cut_id=cut.id,
            lsn=cut.lsn,
            ts_ms=cut.ts_ms,
            tables={str(t): [r.base, r.end] for t, r in cut.tables.items() if str(t) in ckpt.tables},
            markers=ckpt.markers,
            # a table last written at or before the cut holds what it did then; one written after it
            # is ahead of the rewound checkpoint, its position unknown to it (sinks/marker.py)
            written={t: c for t, c in ckpt.written.items() if c <= cut.id},
        )
        save_checkpoint(state, rewound)
        logger.info(
            f"sink {sink}: rewound from cut {ckpt.cut_id} to cut {cut.id} (log {log_id or '?'}); "
            f"the next `cdc apply` applies the changes after it again ({checkpoint_path(state, sink)})"
        )
