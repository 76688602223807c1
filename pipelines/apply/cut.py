"""One cut applied to one follower (pipelines/apply/job.py runs it per sink, under the sink's
lock), as a short sequence of named steps: load the checkpoint and the followed views, take the
cut (the pending one, else the latest), check the idle follower, clear and rebuild what must start
over, plan each table's range, build the batches, save the cut as pending, check + prepare + apply
the tables, write the markers, let the sink record the cut, save the checkpoint. Each step keeps
its place among the others' side effects (and the crash points tests kill the run at), so a crash
between two leaves what the checkpoint says. It stays one module (over 450 lines) for that reason:
the steps are SinkCut's methods, handing the run's state on in that order, and the functions after the
class are the rules they apply, so the sequence reads in one file.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import pyarrow.compute as pc
from pyspark.sql import functions as F

from cdc import metrics
from cdc.ground.clock import now_ms
from cdc.ground.config import SinkConfig
from cdc.ground.errors import CdcError, LogError, SinkError
from cdc.ground.tables import TableName
from cdc.log.base import Cut, TableRange, TableState
from cdc.log.history import FollowedSchema, followed_schema
from pipelines.apply.parallel import Slot, run_tasks
from pipelines.apply.readers import ChangeReader
from pipelines.apply.viewfollow import (
    ViewTarget,
    view_batches,
    view_states,
    view_targets,
    views_cut,
    views_moved,
)
from pipelines.checkpoints import Checkpoint, load_checkpoint, save_checkpoint
from pipelines.faults import crash_point
from pipelines.stages import stage
from pipelines.views.state import ViewState
from sinks.base import ApplyStats, Sink
from sinks.changes import Batch, TableBatch, then
from sinks.marker import Marker
from sinks.shaping import shape_batch, shape_of, shape_record
from sinks.viewbatch import ViewBatch, view_table

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

    from cdc.ground.config import Pipeline


@dataclass
class SinkRun:
    """What one follower's run did (reported by the apply job, recorded in the metrics)."""

    sink: str
    cut_id: int | None = None
    lsn: int | None = None
    tables: list[ApplyStats] = field(default_factory=list)
    error: CdcError | None = None
    up_to_date: bool = False
    seconds: float = 0.0
    used_pending: bool = False  # this run finished a cut an earlier run had started


class CutRunner(Protocol):
    """What the steps ask of the apply job (pipelines/apply/job.py ApplyJob)."""

    pipeline: Pipeline
    spark: SparkSession

    def wanted_tables(self, sink_cfg: SinkConfig, latest: Cut) -> list[str]: ...
    def sink_for(self, log, sink_cfg: SinkConfig) -> Sink: ...
    def parallelism(self, sink: Sink) -> int: ...
    def lost_tables(
        self,
        sink: Sink,
        sink_cfg: SinkConfig,
        ckpt: Checkpoint,
        applied: list[str],
        by_name: dict[str, TableName],
    ) -> dict[str, str]: ...
    def lost_while_idle(
        self, log, latest: Cut, sink_cfg: SinkConfig, ckpt: Checkpoint, views: dict, by_name: dict
    ) -> bool: ...


class SinkCut:
    """One run of one follower through a cut; the steps hand on what they found as attributes."""

    def __init__(self, job: CutRunner, log, reader: ChangeReader, sink_cfg: SinkConfig, run: SinkRun):
        self.job, self.log, self.reader, self.sink_cfg, self.run = job, log, reader, sink_cfg, run
        self.pipeline, self.spark = job.pipeline, job.spark
        self.ckpt = Checkpoint(sink_cfg.name)
        self.names: dict[TableName, TableState] = {}  # the log's tables
        self.by_name: dict[str, TableName] = {}
        self.views: dict[str, ViewState] = {}  # the derived views the sink follows
        self.again = False  # a previous run had started this cut: it may be partly applied already
        self.cut_id = self.cut_lsn = 0
        self.cut_tables: dict[str, TableRange] = {}
        self.wanted: list[str] = []  # the tables the sink follows now
        self.targets: dict[str, ViewTarget] = {}  # the views' versions at this cut
        self.written: dict[str, int] = {}  # table -> the cut its commits carry after this one

    def apply(self, latest: Cut) -> None:
        run = self.run
        self._load()
        at_views = self._cut_of_views(latest)
        if at_views is None:  # the views stand behind this follower: never go back
            run.cut_id, run.lsn, run.up_to_date = self.ckpt.cut_id, self.ckpt.lsn, True
            return
        latest = at_views
        self._take_cut(latest)
        if self._idle(latest):
            run.up_to_date = True
            return
        self.wanted = self.job.wanted_tables(self.sink_cfg, latest)
        purged = self._purged()
        sink = self.job.sink_for(self.log, self.sink_cfg)
        sink.check_engine()  # e.g. a Redis that may evict keys: refused before anything is read or written
        if sink.markers:  # before the check: a wipe from here on is seen when the markers are written
            sink.begin_cut(self.cut_id)
        self._clear_for_rebuild(sink)
        self._rebuild_reshaped(sink)
        self._check_markers(sink)
        batches: list[Batch] = [*self._table_batches(self._plan_ranges(purged))]
        self.targets = view_targets(self.views, self.ckpt)
        # the followed views' changes in this cut, applied like tables
        batches += view_batches(self.spark, self.pipeline, sink, self.targets, self.ckpt)
        self._save_pending()
        if batches:
            self._apply_tables(sink, batches)
            crash_point("apply:after-merge")
        if sink.markers:
            self._write_markers(sink, batches)
        self._record_cut(sink)
        crash_point("apply:before-checkpoint")  # a replay must not record the cut twice
        self._save_applied()

    def _load(self) -> None:
        """The sink's checkpoint, the log's tables and the derived views the sink follows
        (pipelines/apply/viewfollow.py): a failed view stops it here."""
        self.ckpt = load_checkpoint(self.pipeline.state_path, self.sink_cfg.name, self.pipeline.file)
        self.names = {t.table: t for t in self.log.tables()}
        self.by_name = {str(t): t for t in self.names}
        self.run.used_pending = self.again = bool(self.ckpt.pending)
        self.views = view_states(self.pipeline, self.sink_cfg)

    def _cut_of_views(self, latest: Cut) -> Cut | None:
        """The cut to read the tables at: the latest, or the one the followed views stand at (so
        both describe the same cut); None when the views stand behind the follower."""
        at = views_cut(self.pipeline, self.sink_cfg, self.views)
        if at is None or self.ckpt.pending or at == latest.id:
            return latest
        if at < self.ckpt.cut_id:
            return None
        # the view states carry the cut (no old cut needed from the log), else the log's retention
        # keeps it (cdc/log/holds.py: the views' state files hold their cut)
        log = self.log
        found = recorded_cut(self.views, at, self.names) or (log.cut(at) if hasattr(log, "cut") else None)
        if found is None:
            raise SinkError(
                f"sink {self.sink_cfg.name}: its views stand at cut {at}, which the log no longer has"
                " (see `cdc status`: the log's cut retention)",
                f"run `{self.pipeline.command('apply', '--once', '--sink', self.sink_cfg.name)}` again",
            )
        return found

    def _take_cut(self, latest: Cut) -> None:
        """The cut this run applies: the pending one a previous run died in (the same cut again, so
        idempotent writes line up), else `latest`."""
        if self.ckpt.pending:
            self.cut_id, self.cut_lsn, tables = _cut_from_pending(self.ckpt.pending)
            self.cut_tables = {k: TableRange(v[0], v[1]) for k, v in tables.items()}
        else:
            self.cut_id, self.cut_lsn = latest.id, latest.lsn
            self.cut_tables = {str(t): r for t, r in latest.tables.items()}
        self.run.cut_id, self.run.lsn = self.cut_id, self.cut_lsn

    def _idle(self, latest: Cut) -> bool:
        """True when the follower has this cut already and its self-check finds nothing lost."""
        ckpt = self.ckpt
        idle = self.cut_id == ckpt.cut_id and not ckpt.pending and not views_moved(self.views, ckpt)
        return idle and not self.job.lost_while_idle(
            self.log, latest, self.sink_cfg, ckpt, self.views, self.by_name
        )

    def _purged(self) -> dict[str, int]:
        """Per table, the offset below which the log compacted deletes away."""
        purged = {str(t): s.purged_below for t, s in self.names.items()}
        retention = getattr(self.log, "retention_ms", None)
        if retention and self.ckpt.ts_ms and now_ms() - self.ckpt.ts_ms > retention:
            # Kafka may have dropped tombstones this follower never saw: bootstrapping is the only safe way.
            purged = {name: self.cut_tables[name].end + 1 for name in self.wanted if name in self.cut_tables}
        return purged

    def _clear_for_rebuild(self, sink: Sink) -> None:
        """`cdc reset --rebuild`: start from nothing (changed rows would survive a replay)."""
        if not self.ckpt.clear:
            return
        logger.info(f"sink {self.sink_cfg.name}: clearing its tables for the rebuild (cdc reset --rebuild)")
        for name in self.wanted:
            if name in self.by_name:
                sink.clear_table(self.by_name[name])
        for view in self.views:
            sink.clear_table(view_table(view))
        self.ckpt.tables, self.ckpt.written, self.ckpt.clear = {}, {}, False

    def _rebuild_reshaped(self, sink: Sink) -> None:
        """A table whose table_options (columns, masks, rename, mask_key) changed since it was applied
        holds values shaped the old way: it is cleared and rebuilt from the log's base in this cut.
        The new shapes are recorded with the cut (saved with its pending checkpoint)."""
        sink_cfg, ckpt, by_name = self.sink_cfg, self.ckpt, self.by_name
        shapes = {name: shape_record(sink_cfg, by_name[name]) for name in self.wanted if name in by_name}
        if ckpt.shapes is not None:
            for name, shape in shapes.items():
                before = ckpt.shapes.get(name, "")
                if name not in ckpt.tables or before == shape:
                    continue
                # new options with a typo stop here (exit 2), before the follower is cleared
                shape_of(sink_cfg, by_name[name], self.log.schema(by_name[name]))
                logger.info(
                    f"sink {sink_cfg.name}: {name}: its table_options changed since it was applied"
                    f" ({before or 'none'} -> {shape or 'none'}): rebuilding it from the log's base"
                )
                if _renamed(before, shape):
                    logger.info(
                        f"sink {sink_cfg.name}: {name}: the follower under its old name is left as it was;"
                        " remove it if it holds values the new options leave out or mask"
                    )
                sink.clear_table(by_name[name])
                del ckpt.tables[name]  # planned from the base (bootstrap): the sink starts the table over
                ckpt.written.pop(name, None)
        ckpt.shapes = shapes

    def _check_markers(self, sink: Sink) -> None:
        """Does the engine still hold what the checkpoint says this follower applied? (sinks/marker.py)
        Tables it lost are rebuilt from the log's base, or the run stops (on_lost: stop)."""
        sink_cfg, ckpt, pipeline = self.sink_cfg, self.ckpt, self.pipeline
        applied, by_name = held_tables(self.wanted, self.views, ckpt, self.by_name)
        lost = self.job.lost_tables(sink, sink_cfg, ckpt, applied, by_name)
        if not lost:
            return
        what = "; ".join(f"{t}: {why}" for t, why in sorted(lost.items()))
        note = {"ts_ms": now_ms(), "tables": lost}
        if sink_cfg.on_lost == "stop":
            fix = (
                f"rebuild it from the log's base: `{pipeline.command('reset', '--sink', sink_cfg.name, '--rebuild', '--yes')}`, "
                f"then `{pipeline.command('apply', '--once', '--sink', sink_cfg.name)}`"
            )
            ckpt.lost = note | {"action": "stopped", "fix": fix}
            save_checkpoint(pipeline.state_path, ckpt)
            raise SinkError(
                f"sink {sink_cfg.name}: the follower lost data it had applied ({what}); on_lost: stop", fix
            )
        logger.info(
            f"sink {sink_cfg.name}: the follower lost data it had applied ({what}): rebuilding from the log's base"
        )
        for name in lost:
            sink.clear_table(by_name[name])  # what is left (an older backup, another pipeline's data) goes
            del ckpt.tables[name]  # planned from the base (bootstrap): the sink starts the table over
            ckpt.written.pop(name, None)
        ckpt.lost = note | {"action": "rebuilt"}

    def _plan_ranges(self, purged: dict[str, int]) -> dict[str, tuple[int, int, bool]]:
        """Per table, the offsets to read (plan_ranges), with remedies that name this pipeline file
        and sink, so they run as printed."""
        hint = getattr(self.log, "rebuild_hint", None) or (
            f"run `{self.pipeline.command('snapshot')} --tables {{table}}` to give the table a new base; "
            "every follower then rebuilds it"
        )
        reset = self.pipeline.command("reset", "--sink", self.sink_cfg.name, "--rebuild", "--yes")
        return plan_ranges(self.ckpt, self.cut_tables, purged, self.wanted, hint.replace("{reset}", reset))

    def _table_batches(self, plans: dict[str, tuple[int, int, bool]]) -> list[TableBatch]:
        """Each planned table's events as a batch (read in Spark, never through the driver), shaped to
        the sink's columns and masks (sinks/shaping.py)."""
        log, ckpt = self.log, self.ckpt
        batches = []
        for name, (after, upto, bootstrap) in plans.items():
            table = self.by_name[name]
            if upto <= after and not bootstrap and not schema_changed(log, table, ckpt.lsn, self.cut_lsn):
                continue  # a schema change alone (DDL capture, cdc/ddl.py) is applied with no rows
            st = self.names[table]
            followed = followed_schema_of(log, table, st.snapshot_lsn if bootstrap else ckpt.lsn)
            schema = followed.schema
            # Each event is read with its own schema version's columns, matched by attnum (renames, drops).
            frame, held = self.reader.read_changes_held(
                self.spark, table, after, upto, schema, followed.retired
            )
            if not bootstrap and ckpt.lsn:
                # Every transaction committed before the last applied cut's LSN is applied already:
                # an event older than that in a later range is a copy (a producer retry, a replay).
                # Dropping it keeps a follower without tombstones (SCD1 Delta) from bringing a
                # since-deleted key back with it.
                frame = then(frame, _from_lsn(ckpt.lsn))
                held = None if held is None else held.filter(pc.greater_equal(held["lsn"], ckpt.lsn))
            batch = TableBatch(table, schema, frame, bootstrap, st.snapshot_lsn, after, upto, log.value_kind)
            batch.held = held
            batch.defaults = log.column_defaults(table)
            batch.retired, batch.renames = followed.retired, followed.renames
            batch.base = self.cut_tables[name].base
            batch.written_at = ckpt.written.get(name)
            # a range read from the base holds its snapshot: only later ranges can be inserts alone
            batch.inserts_new = getattr(log, "inserts_are_new", False) and not bootstrap
            batches.append(shape_batch(batch, self.sink_cfg))
        return batches

    def _save_pending(self) -> None:
        """The cut recorded as pending before anything is written: a run that dies applies it again."""
        ckpt = self.ckpt
        ckpt.pending = {
            "cut_id": self.cut_id,
            "lsn": self.cut_lsn,
            "tables": {k: [r.base, r.end] for k, r in self.cut_tables.items()},
        }
        if self.targets:  # the views' versions of this cut: a crashed cut applies exactly these rows again
            ckpt.pending["views"] = {n: t.record() for n, t in self.targets.items()}
        save_checkpoint(self.pipeline.state_path, ckpt)

    def _apply_tables(self, sink: Sink, batches: list[Batch]) -> None:
        """Every batch read and checked, the follower prepared (schemas checked and evolved), then
        each table applied, side by side where the sink allows (pipelines/apply/parallel.py)."""
        name, cut_id = self.sink_cfg.name, self.cut_id
        stages = metrics.APPLY_STAGE
        parallelism = self.job.parallelism(sink)
        try:
            with (
                stage(f"sink {name}: cut {cut_id}: reading and checking {len(batches)} table(s)"),
                stages.labels(self.pipeline.name, name, "read").time(),
            ):
                # a value no follower type can hold stops the cut before any table is written
                run_tasks(batches, lambda slot: slot.item.check(), parallelism, self.spark, name)
            with (
                stage(f"sink {name}: preparing the follower"),
                stages.labels(self.pipeline.name, name, "prepare").time(),
            ):
                sink.prepare(batches)
            applied = run_tasks(
                batches, lambda slot: self._apply_table(sink, slot), parallelism, self.spark, name
            )
            self.run.tables.extend(applied)
        finally:
            for batch in batches:  # those a failure kept from starting (the others released theirs)
                batch.release()

    def _apply_table(self, sink: Sink, slot: Slot[Batch]) -> ApplyStats:
        """One table of the cut, in the session of the thread it runs on."""
        batch = slot.item
        if slot.finished_before:  # another table of the cut is committed, this one not yet written
            crash_point("apply:between-tables")
        name = sink.name
        offsets = f"{batch.first_offset + 1}..{batch.last_offset}"
        try:
            with (
                stage(f"sink {name}: {batch.table}: applying offsets {offsets}"),
                metrics.APPLY_TABLE.labels(self.pipeline.name, name, str(batch.table)).time(),
            ):
                changes = batch.versions() if sink.wants_versions else batch.net()
                try:
                    return sink.in_session(slot.session).apply(batch, changes, self.cut_id)
                finally:
                    changes.release()
        finally:
            batch.release()  # its cached events, as soon as the table is done

    def _write_markers(self, sink: Sink, batches: list[Batch]) -> None:
        """Each applied table's marker (sinks/marker.py), after the rows: a marker never claims more
        than the engine holds. Delta and Iceberg keep only its fixed parts (a commit when the table
        is made or re-based, none otherwise): their data commit carries the cut."""
        ckpt, by_name = self.ckpt, self.by_name
        # older followers: markers for the tables applied before the sink kept them
        redo = [] if ckpt.markers else [n for n in ckpt.tables if n in by_name and n in self.wanted]
        ends = {
            b.table: (b.epoch, b.last_offset)
            if isinstance(b, ViewBatch)
            else (self.cut_tables[str(b.table)].base, b.last_offset)
            for b in batches
        }
        ends |= {by_name[n]: (ckpt.tables[n][0], ckpt.tables[n][1]) for n in redo if by_name[n] not in ends}
        name = self.sink_cfg.name
        markers = [
            (table, Marker(self.pipeline.name, name, sink.log_id, base, end, self.cut_id).to_json())
            for table, (base, end) in ends.items()
        ]
        with stage(f"sink {name}: cut {self.cut_id}: writing {len(markers)} marker(s)"):
            held = run_tasks(
                markers,
                lambda slot: sink.in_session(slot.session).write_marker(*slot.item),
                self.job.parallelism(sink),
                self.spark,
                name,
            )
        # Delta, Iceberg: the cut their commits carry now, which the checkpoint keeps to compare with
        self.written = {str(t): cut for (t, _), cut in zip(markers, held, strict=True) if cut is not None}
        ckpt.markers = True

    def _record_cut(self, sink: Sink) -> None:
        """The sink's own record of the cut (e.g. Delta's _cdc_cuts), once rows and markers are in."""
        applied = [self.by_name[n] for n in self.wanted if n in self.by_name]
        applied += [view_table(v) for v in self.targets]
        with stage(f"sink {self.sink_cfg.name}: cut {self.cut_id}: recording the cut"):
            sink.cut_applied(self.cut_id, self.cut_lsn, applied, self.again)

    def _save_applied(self) -> None:
        """The checkpoint moved to the cut, its pending record dropped; with the cut each written
        table's commits carry (Delta, Iceberg: sinks/marker.py)."""
        ckpt, cut_tables = self.ckpt, self.cut_tables
        ckpt.cut_id, ckpt.lsn, ckpt.ts_ms = self.cut_id, self.cut_lsn, now_ms()
        ckpt.written |= self.written
        for name in self.wanted:
            if name in cut_tables:
                ckpt.tables[name] = [cut_tables[name].base, cut_tables[name].end]
        for view, target in self.targets.items():
            ckpt.tables[str(view_table(view))] = [target.epoch, target.version]
        ckpt.pending = None
        save_checkpoint(self.pipeline.state_path, ckpt)


def _cut_from_pending(pending: dict) -> tuple[int, int, dict[str, list[int]]]:
    return pending["cut_id"], pending["lsn"], pending["tables"]


def plan_ranges(
    ckpt: Checkpoint,
    cut_tables: dict[str, TableRange],
    purged: dict[str, int],
    wanted: list[str],
    remedy: str = "run `cdc snapshot PIPELINE --tables {table}` to give the table a new base; the follower then rebuilds it",
) -> dict[str, tuple[int, int, bool]]:
    """Per table: (after, upto, bootstrap) to read for this sink."""
    plans = {}
    for name in wanted:
        rng = cut_tables.get(name)
        if rng is None:
            continue
        prev = ckpt.tables.get(name)
        if prev is None or prev[0] != rng.base:
            plans[name] = (rng.base - 1, rng.end, True)
            continue
        after = prev[1]
        if after < purged.get(name, 0):
            raise LogError(
                f"the log no longer holds {name} from offset {after + 1} (deletes up to offset {purged[name]} were "
                "compacted away), so this follower would miss them",
                remedy.format(table=name, state_dir="<state_dir>"),
            )
        plans[name] = (after, max(after, rng.end), False)
    return plans


def held_tables(
    wanted: list[str], views: dict, ckpt: Checkpoint, by_name: dict[str, TableName]
) -> tuple[list[str], dict[str, TableName]]:
    """The tables (and view tables) the sink follows and has applied, and every name's TableName."""
    followed = by_name | {str(view_table(v)): view_table(v) for v in views}
    held = [n for n in wanted if n in by_name] + [str(view_table(v)) for v in views]
    return [n for n in held if n in ckpt.tables], followed


def _renamed(before: str, after: str) -> bool:
    """Whether two shape records (sinks/shaping.py shape_record) name the follower differently."""

    def rename(text: str) -> str | None:
        return json.loads(text).get("rename") if text else None

    return rename(before) != rename(after)


def recorded_cut(views: dict, at: int, names: dict) -> Cut | None:
    """The cut the views stand at, as their state files recorded it (pipelines/views/state.py
    cut_tables); None for states written before they carried it."""
    for state in views.values():
        if state.cut_id == at and state.cut_tables:
            by_name = {str(t): t for t in names}
            ranges = {by_name[k]: TableRange(b, e) for k, (b, e) in state.cut_tables.items() if k in by_name}
            return Cut(at, state.lsn, state.ts_ms, ranges)
    return None


def schema_changed(log, table: TableName, after_lsn: int | None, upto_lsn: int) -> bool:
    """Whether the log has a schema version of `table` since the follower's last cut, up to this
    one: with DDL capture a rename or new column arrives with no row of the table."""
    if not after_lsn or not hasattr(log, "schema_history"):
        return False
    # <= upto: the idle-table check records a version at the cut's own position
    return any(after_lsn <= since <= upto_lsn for _v, since, _s in log.schema_history(table))


def followed_schema_of(log, table: TableName, from_lsn: int | None) -> FollowedSchema:
    """The columns a follower applies the table's events after `from_lsn` with (cdc.log.history);
    logs without a version history (Debezium topics) give their one schema."""
    history = log.schema_history(table) if hasattr(log, "schema_history") else []
    if not history:
        return FollowedSchema(log.schema(table))
    return followed_schema(history, from_lsn or None)


def _from_lsn(lsn: int) -> Callable[[DataFrame], DataFrame]:
    """A step keeping the events of transactions committed at `lsn` or later."""
    return lambda df: df.where(F.col("lsn") >= lsn)
