"""A follower's marker: which pipeline, sink and log it follows, and how far, kept inside the
engine next to the rows (docs/recovery-and-rewind.md).

The checkpoint (state_dir) says how far a follower got; only the engine can say whether it
still holds that. Each sink keeps one marker per table in the engine itself (Redis: the key
`__cdc:m:<table pattern>`; tantivy: `cdc_follower.json` in the table's index directory;
OpenSearch: the index's `_meta.cdc.follower`), written after every batch it applies to the table.

Delta and Iceberg keep no marker commit per cut: their table property `cdc.follower` holds the
parts that change only when the table is made or re-based (pipeline, sink, log, base), written
once then, and the position is the cut id the data commit itself carries (Delta's idempotent
transaction id for the follower's app id, the Iceberg snapshot summary's `pgcdc.cut`), so a cut
costs one commit per table. Such a marker has `end` and `cut_id` None as stored; read back, its
`cut_id` is the newest cut the table's commits carry (`with_cut`). The checkpoint keeps the cut
that last wrote each table (Checkpoint.written) to compare it with. Markers written before hold
`end` and `cut_id` and are compared by `end`, as before, until the table is written again.

Before each batch the apply job compares the marker with the checkpoint: a marker that is gone
(Redis flushed or restarted without persistence, an index or table deleted), names another
pipeline, sink or log (replaced by another one), or is behind the checkpoint (restored from an
older backup) means the follower lost data it had.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from cdc.ground.formats import MARKER, VERSION, check_version

if TYPE_CHECKING:
    from cdc.ground.tables import TableName
    from sinks.base import Sink


@dataclass(frozen=True)
class Marker:
    pipeline: str
    sink: str
    log_id: str
    base: int  # the log offset of the table's base (its snapshot) the follower started from
    # the last log offset of the table the follower applied; None: not kept in the marker (Delta,
    # Iceberg: the position is the cut id of the data commit)
    end: int | None
    # the cut that wrote `end` (read back from Delta/Iceberg: the newest cut their commits carry;
    # None when they carry none of this follower); as an expected marker: the cut the checkpoint
    # says last wrote the table (None: not recorded, as in checkpoints written before it was)
    cut_id: int | None

    def to_json(self) -> str:
        # `format`: the marker format (cdc/ground/formats.py); cdc 0.1.0 wrote none and ignores it
        fields = {k: v for k, v in asdict(self).items() if v is not None or k not in ("end", "cut_id")}
        return json.dumps({"format": MARKER.version, "cdc_version": VERSION, **fields}, sort_keys=True)

    def fixed(self) -> Marker:
        """The parts that change only when the table is made or re-based (what Delta and Iceberg
        keep in the table property)."""
        return replace(self, end=None, cut_id=None)

    def with_cut(self, cut_id: int | None) -> Marker:
        """A fixed marker with the position its engine's data commits carry."""
        return replace(self, cut_id=cut_id)

    @property
    def same_follower(self) -> tuple[str, str, str, int]:
        return self.pipeline, self.sink, self.log_id, self.base

    @classmethod
    def from_json(cls, text: str | bytes | None) -> Marker | None:
        """None when there is no marker or it cannot be read (both mean: not ours any more)."""
        if not text:
            return None
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if isinstance(data, dict):  # a newer cdc's marker is refused (FormatTooNew), not taken as lost
            where = f"the follower marker of pipeline {data.get('pipeline')} sink {data.get('sink')}"
            check_version(MARKER, data.get("format"), where, data.get("cdc_version"))
        try:
            fixed = {k: data[k] for k in ("pipeline", "sink", "log_id", "base")}
            return cls(**fixed, end=data.get("end"), cut_id=data.get("cut_id"))
        except (TypeError, KeyError):
            return None


def lost_reason(found: Marker | None, expected: Marker) -> str | None:
    """Why the follower no longer holds what its checkpoint says (None: it does)."""
    if found is None:
        return (
            "its marker is gone from the engine (flushed, restarted without persistence, deleted or replaced)"
        )
    if (found.pipeline, found.sink) != (expected.pipeline, expected.sink):
        return f"the engine holds pipeline {found.pipeline} sink {found.sink} there"
    if expected.log_id and found.log_id != expected.log_id:
        return f"the engine holds data of another log ({found.log_id}, this one is {expected.log_id})"
    if found.base != expected.base:
        return f"the engine holds the table from another base (offset {found.base}, the checkpoint says {expected.base})"
    if found.end is not None:  # a marker that keeps the position itself
        if expected.end is not None and found.end < expected.end:
            return (
                f"the engine holds the table up to log offset {found.end} (cut {found.cut_id}), the checkpoint says "
                f"{expected.end}: restored from an older backup?"
            )
        return None
    # the position is the cut id of the table's newest data commit of this follower
    if expected.cut_id is not None and (found.cut_id is None or found.cut_id < expected.cut_id):
        held = "no commit of this follower" if found.cut_id is None else f"commits up to cut {found.cut_id}"
        return (
            f"the engine holds the table with {held}, the checkpoint says cut {expected.cut_id} wrote it: "
            "rolled back or restored from an older backup?"
        )
    return None


def why_lost(engine: Sink, table: TableName, expected: Marker | None) -> str | None:
    """Why the engine no longer holds the table as `expected` says (None: it does). `expected`
    None: the follower has no markers yet, only the table's presence can be checked."""
    if not engine.has_table(table):
        return "the table is gone from the engine (deleted or moved away)"
    if expected is None:
        return None
    return lost_reason(Marker.from_json(engine.read_marker(table)), expected)
