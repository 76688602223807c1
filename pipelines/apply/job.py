"""`cdc apply`: the log, up to its latest consistent cut, applied to each follower.

Per sink and per run:
  1. take the cut to apply: the sink's `pending` cut if a previous run died mid-way (the same
     cut again, so idempotent writes line up), else the log's latest cut;
  2. per table, read the log from the sink's checkpoint (or from the table's base when the
     follower starts it over) to the cut's end — in Spark, never through the driver;
  3. record the cut as pending, let the sink check/evolve all schemas, then apply each table;
  4. record the cut as applied.
Each sink has its own checkpoint; a failing sink is reported and the others go on.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from cdc import health, metrics
from cdc.ground.config import Pipeline, SinkConfig, pipeline_tables, sink_tables, sink_views
from cdc.ground.errors import CdcError, LogError, SinkError, UsageError
from cdc.ground.lsn import format_lsn
from cdc.ground.tables import TableName
from cdc.log import open_log_view
from cdc.log.base import Cut, TableRange, TableState
from cdc.log.history import FollowedSchema, followed_schema
from pipelines.apply.health import ApplyHealth
from pipelines.apply.parallel import POOL_PROPERTY, Slot, auto_parallelism, clone_session, run_tasks
from pipelines.apply.readers import ChangeReader, change_reader
from pipelines.apply.stall import StallGuard
from pipelines.apply.viewfollow import (
    ViewTarget,
    view_batches,
    view_states,
    view_targets,
    views_cut,
    views_moved,
)
from pipelines.checkpoints import Checkpoint, load_checkpoint, save_checkpoint
from pipelines.faults import crash_point, out_of_memory_point, pause_point
from pipelines.locks import sink_lock
from pipelines.spark import driver_exit_error, driver_jvm_exit
from pipelines.sparkerrors import spark_error_line
from pipelines.stages import stage
from pipelines.views.state import ViewState
from sinks.base import ApplyStats, Sink
from sinks.changes import TableBatch
from sinks.marker import Marker, why_lost
from sinks.registry import make_sink
from sinks.shaping import shape_batch, shape_of, shape_record
from sinks.viewbatch import ViewBatch, view_table


@dataclass
class SinkRun:
    sink: str
    cut_id: int | None = None
    lsn: int | None = None
    tables: list[ApplyStats] = field(default_factory=list)
    error: CdcError | None = None
    up_to_date: bool = False
    seconds: float = 0.0
    used_pending: bool = False  # this run finished a cut an earlier run had started


@dataclass
class _CutWork:
    """One cut of one follower as the steps of ApplyJob._apply_sink hand it on."""

    sink_cfg: SinkConfig
    ckpt: Checkpoint
    names: dict[TableName, TableState]  # the log's tables
    by_name: dict[str, TableName]
    views: dict[str, ViewState]  # the derived views the sink follows
    again: bool  # a previous run had started this cut: it may be partly applied already
    cut_id: int = 0
    cut_lsn: int = 0
    cut_tables: dict[str, TableRange] = field(default_factory=dict)
    wanted: list[str] = field(default_factory=list)  # the tables the sink follows now
    targets: dict[str, ViewTarget] = field(default_factory=dict)  # the views' versions at this cut


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


class ApplyJob:
    def __init__(
        self,
        pipeline: Pipeline,
        spark: SparkSession,
        say: Callable[[str], None] = print,
        lock_wait_s: float = 0.0,
    ):
        self.pipeline = pipeline
        self.spark = spark
        self.say = say
        self.lock_wait_s = lock_wait_s  # how long to wait for another apply of a sink (pipelines/locks.py)
        self._stop = False
        self.view_runs: list = []  # the view stage's runs of the last run_once (pipelines/views/maintain.py)
        self.guard: StallGuard | None = None
        # the self-check of an idle follower (_lost_while_idle): seconds between two (0: every
        # run, as `--once`), and when each sink's last ran (monotonic; shared with sink threads)
        self.check_every = 0.0
        self.checked: dict[str, float] = {}

    def guard_stalls(
        self, report: Callable[[str, str, int], None], before_exit: Callable[[], None] = lambda: None
    ) -> None:
        """End the process when a cut's apply stops moving (pipelines/apply/stall.py)."""
        timeout = self.pipeline.spark.stall_timeout_s
        if timeout > 0:
            self.guard = StallGuard(self.spark, timeout, report, before_exit)

    def request_stop(self, *_args) -> None:
        self._stop = True

    def _sinks(self, only: str | list[str] | None) -> list[SinkConfig]:
        if not self.pipeline.sinks:
            raise UsageError(
                f"pipeline {self.pipeline.name} has no sinks", "add one under `sinks:` in the pipeline file"
            )
        if not only:
            return list(self.pipeline.sinks)
        return [self.pipeline.sink(name) for name in ([only] if isinstance(only, str) else only)]

    def run_once(self, only: str | list[str] | None = None) -> list[SinkRun]:
        from pipelines.apply.filewatch import follow_file_tables

        follow_file_tables(self)  # a table added to the file beside a running `cdc run`, no restart
        sinks = self._sinks(only)
        try:
            if self.guard is None:
                runs = self._run_once(sinks)
            else:
                with self.guard.watching(f"applying the latest cut to {', '.join(s.name for s in sinks)}"):
                    runs = self._run_once(sinks)
        except Exception:
            self.check_driver()
            raise
        if any(r.error is not None for r in runs):
            self.check_driver()
        return runs

    def check_driver(self) -> None:
        """After a failure: a driver JVM that has exited fails the whole job (exit 4, for a supervisor
        to restart), its cause said plainly, instead of each follower's py4j error."""
        code = driver_jvm_exit(self.spark)
        if code is not None:
            memory = self.pipeline.spark.conf.get("spark.driver.memory")
            kept = "every follower keeps its checkpoint, and its pending cut is applied again exactly"
            raise driver_exit_error(code, memory, kept)

    def _run_once(self, sinks: list[SinkConfig]) -> list[SinkRun]:
        log = open_log_view(self.pipeline)
        try:
            cut = log.latest_cut()
            if cut is None:
                raise LogError("the log is empty", f"run `{self.pipeline.command('snapshot')}` first")
            # derived views first: their followers then apply the cut's view changes
            self._run_views(log, cut, sinks)
            if len(sinks) > 1 and self.pipeline.spark.apply_parallelism != 1:
                # the sinks side by side: each has its own checkpoint, lock, log view and session
                alone = lambda slot: self._run_sink_alone(cut, slot.item)  # noqa: E731
                return run_tasks(sinks, alone, len(sinks), None, "sinks")
            reader = change_reader(log)
            try:
                return [self._run_sink(log, reader, cut, sink_cfg) for sink_cfg in sinks]
            finally:
                reader.close()
        finally:
            log.close()

    def _run_views(self, log, cut: Cut, sinks: list[SinkConfig]) -> None:
        """The view stage (pipelines/views/maintain.py) for the views the selected sinks follow:
        its base follower and each view's out table brought to the latest cut, one line per view."""
        followed = {v for s in sinks for v in sink_views(s)}
        wanted = [v.name for v in self.pipeline.views if v.name in followed]
        if not wanted:
            return
        from pipelines.views.maintain import run_view_stage  # Spark/Delta work only for pipelines with views

        reader = change_reader(log)
        try:
            self.view_runs = run_view_stage(self, log, reader, cut, wanted)
        finally:
            reader.close()

    def _run_sink_alone(self, cut: Cut, sink_cfg: SinkConfig) -> SinkRun:
        """One sink in a thread of its own: its own session (Delta's idempotence confs are session
        confs, pipelines/apply/parallel.py), log view and reader, its Spark jobs in its FAIR pool."""
        spark = clone_session(self.spark)
        spark.sparkContext.setLocalProperty(POOL_PROPERTY, sink_cfg.name)
        job = ApplyJob(self.pipeline, spark, self.say, self.lock_wait_s)
        job.check_every, job.checked = self.check_every, self.checked
        log = open_log_view(self.pipeline)
        try:
            reader = change_reader(log)
            try:
                return job._run_sink(log, reader, cut, sink_cfg)
            finally:
                reader.close()
        finally:
            log.close()

    def _run_sink(self, log, reader: ChangeReader, cut: Cut, sink_cfg: SinkConfig) -> SinkRun:
        started = time.monotonic()
        run = SinkRun(sink_cfg.name)
        try:
            # one applier per follower: a second one would write the same cut and race on the checkpoint
            with sink_lock(self.pipeline.state_path, sink_cfg.name, self.lock_wait_s, self.say):
                pause_point("apply:locked")
                out_of_memory_point("apply:locked", self.spark)
                # another run may have applied a newer cut than the one read above (while this
                # one waited, or applied other sinks): read it again so the follower never goes back
                latest = log.latest_cut() or cut
                self._apply_sink(log, reader, latest, sink_cfg, run)
                if run.used_pending and run.cut_id != latest.id:  # then on to the latest cut: --once drains
                    self._apply_sink(log, reader, latest, sink_cfg, run)
        except CdcError as exc:
            run.error = exc
        except Exception as exc:  # one follower's failure must not stop the others
            if os.environ.get("CDC_DEBUG"):
                raise
            run.error = SinkError(
                f"{type(exc).__name__}: {spark_error_line(exc)}",
                "the follower keeps its checkpoint and resumes on the next run; CDC_DEBUG=1 shows a traceback",
            )
        run.seconds = time.monotonic() - started
        self._record(run)
        return run

    def _record(self, run: SinkRun) -> None:
        """Metrics of one follower's round (README "Monitoring")."""
        # cdc status shows a follower's last error and since when (pipelines/follower_errors.py)
        from pipelines.follower_errors import clear_error, record_error

        name = self.pipeline.name
        if run.error is not None:
            metrics.error(name, "apply", run.error)
            metrics.APPLY_ERROR.labels(name, run.sink).set(time.time())
            record_error(self.pipeline.state_path, run.sink, run.error)
            return
        clear_error(self.pipeline.state_path, run.sink)
        metrics.APPLY_SUCCESS.labels(name, run.sink).set(time.time())
        if not run.up_to_date:
            metrics.APPLY_CUTS.labels(name, run.sink).inc()
            metrics.APPLY_STAGE.labels(name, run.sink, "cut").observe(run.seconds)

    def _apply_sink(self, log, reader: ChangeReader, latest: Cut, sink_cfg: SinkConfig, run: SinkRun) -> None:
        """One cut applied to one follower (the module docstring's steps 1-4), step by step; each step
        keeps its place among the others' side effects, so a crash between two leaves what they say."""
        work = self._load(log, sink_cfg, run)
        at_views = self._cut_of_views(log, latest, work)
        if at_views is None:  # the views stand behind this follower: never go back
            run.cut_id, run.lsn, run.up_to_date = work.ckpt.cut_id, work.ckpt.lsn, True
            return
        latest = at_views
        self._take_cut(work, latest, run)
        if self._idle(log, latest, work):
            run.up_to_date = True
            return
        work.wanted = self._wanted(sink_cfg, latest)
        purged = self._purged(log, work)
        sink = self._make_sink(log, sink_cfg)
        sink.check_engine()  # e.g. a Redis that may evict keys: refused before anything is read or written
        self._clear_for_rebuild(sink, work)
        self._rebuild_reshaped(log, sink, sink_cfg, work.ckpt, work.wanted, work.by_name)
        held, followed = _held(work.wanted, work.views, work.ckpt, work.by_name)
        self._check_markers(sink, sink_cfg, work.ckpt, held, followed)
        plans = self._plan_ranges(log, work, purged)
        batches = self._table_batches(log, reader, work, plans)
        work.targets = view_targets(work.views, work.ckpt)
        # the followed views' changes in this cut, applied like tables
        batches += view_batches(self.spark, self.pipeline, sink, work.targets, work.ckpt)
        self._save_pending(work)
        if batches:
            self._apply_tables(sink, work, batches, run)
            crash_point("apply:after-merge")
        if sink.markers:
            self._write_markers(sink, work, batches)
        self._record_cut(sink, work)
        crash_point("apply:before-checkpoint")  # a replay must not record the cut twice
        self._save_applied(work)

    def _load(self, log, sink_cfg: SinkConfig, run: SinkRun) -> _CutWork:
        """The sink's checkpoint, the log's tables and the derived views the sink follows
        (pipelines/apply/viewfollow.py): a failed view stops it here."""
        ckpt = load_checkpoint(self.pipeline.state_path, sink_cfg.name, self.pipeline.file)
        names = {t.table: t for t in log.tables()}
        run.used_pending = bool(ckpt.pending)
        views = view_states(self.pipeline, sink_cfg)
        # again: this cut may be partly applied already
        return _CutWork(sink_cfg, ckpt, names, {str(t): t for t in names}, views, again=bool(ckpt.pending))

    def _cut_of_views(self, log, latest: Cut, work: _CutWork) -> Cut | None:
        """The cut to read the tables at: the latest, or the one the followed views stand at (so
        both describe the same cut); None when the views stand behind the follower."""
        at = views_cut(self.pipeline, work.sink_cfg, work.views)
        if at is None or work.ckpt.pending or at == latest.id:
            return latest
        if at < work.ckpt.cut_id:
            return None
        # the view states carry the cut (no old cut needed from the log), else the log's retention
        # keeps it (cdc/log/holds.py: the views' state files hold their cut)
        found = recorded_cut(work.views, at, work.names) or (log.cut(at) if hasattr(log, "cut") else None)
        if found is None:
            raise SinkError(
                f"sink {work.sink_cfg.name}: its views stand at cut {at}, which the log no longer has"
                " (see `cdc status`: the log's cut retention)",
                f"run `{self.pipeline.command('apply', '--once', '--sink', work.sink_cfg.name)}` again",
            )
        return found

    @staticmethod
    def _take_cut(work: _CutWork, latest: Cut, run: SinkRun) -> None:
        """The cut this run applies: the pending one a previous run died in (the same cut again, so
        idempotent writes line up), else `latest`."""
        if work.ckpt.pending:
            work.cut_id, work.cut_lsn, tables = _cut_from_pending(work.ckpt.pending)
            work.cut_tables = {k: TableRange(v[0], v[1]) for k, v in tables.items()}
        else:
            work.cut_id, work.cut_lsn = latest.id, latest.lsn
            work.cut_tables = {str(t): r for t, r in latest.tables.items()}
        run.cut_id, run.lsn = work.cut_id, work.cut_lsn

    def _idle(self, log, latest: Cut, work: _CutWork) -> bool:
        """True when the follower has this cut already and its self-check finds nothing lost."""
        ckpt = work.ckpt
        idle = work.cut_id == ckpt.cut_id and not ckpt.pending and not views_moved(work.views, ckpt)
        return idle and not self._lost_while_idle(log, latest, work.sink_cfg, ckpt, work.views, work.by_name)

    def _wanted(self, sink_cfg: SinkConfig, latest: Cut) -> list[str]:
        """The tables the sink follows: those the file names now, not every table the log still holds."""
        return [str(t) for t in sink_tables(sink_cfg, pipeline_tables(self.pipeline, list(latest.tables)))]

    @staticmethod
    def _purged(log, work: _CutWork) -> dict[str, int]:
        """Per table, the offset below which the log compacted deletes away."""
        purged = {str(t): s.purged_below for t, s in work.names.items()}
        retention = getattr(log, "retention_ms", None)
        if retention and work.ckpt.ts_ms and time.time() * 1000 - work.ckpt.ts_ms > retention:
            # Kafka may have dropped tombstones this follower never saw: bootstrapping is the only safe way.
            purged = {name: work.cut_tables[name].end + 1 for name in work.wanted if name in work.cut_tables}
        return purged

    def _clear_for_rebuild(self, sink: Sink, work: _CutWork) -> None:
        """`cdc reset --rebuild`: start from nothing (changed rows would survive a replay)."""
        if not work.ckpt.clear:
            return
        self.say(f"sink {work.sink_cfg.name}: clearing its tables for the rebuild (cdc reset --rebuild)")
        for name in work.wanted:
            if name in work.by_name:
                sink.clear_table(work.by_name[name])
        for view in work.views:
            sink.clear_table(view_table(view))
        work.ckpt.tables, work.ckpt.clear = {}, False

    def _plan_ranges(self, log, work: _CutWork, purged: dict[str, int]) -> dict[str, tuple[int, int, bool]]:
        """Per table, the offsets to read (plan_ranges), with remedies that name this pipeline file
        and sink, so they run as printed."""
        hint = getattr(log, "rebuild_hint", None) or (
            f"run `{self.pipeline.command('snapshot')} --tables {{table}}` to give the table a new base; "
            "every follower then rebuilds it"
        )
        reset = self.pipeline.command("reset", "--sink", work.sink_cfg.name, "--rebuild", "--yes")
        return plan_ranges(work.ckpt, work.cut_tables, purged, work.wanted, hint.replace("{reset}", reset))

    def _table_batches(
        self, log, reader: ChangeReader, work: _CutWork, plans: dict[str, tuple[int, int, bool]]
    ) -> list:
        """Each planned table's events as a batch (read in Spark), shaped to the sink's columns and
        masks (sinks/shaping.py)."""
        ckpt = work.ckpt
        batches = []
        for name, (after, upto, bootstrap) in plans.items():
            table = work.by_name[name]
            if upto <= after and not bootstrap and not schema_changed(log, table, ckpt.lsn, work.cut_lsn):
                continue  # a schema change alone (DDL capture, cdc/ddl.py) is applied with no rows
            st = work.names[table]
            followed = followed_schema_of(log, table, st.snapshot_lsn if bootstrap else ckpt.lsn)
            schema = followed.schema
            # Each event is read with its own schema version's columns, matched by attnum (renames, drops).
            raw = reader.read_changes(self.spark, table, after, upto, schema, followed.retired)
            if not bootstrap and ckpt.lsn:
                # Every transaction committed before the last applied cut's LSN is applied already:
                # an event older than that in a later range is a copy (a producer retry, a replay).
                # Dropping it keeps a follower without tombstones (SCD1 Delta) from bringing a
                # since-deleted key back with it.
                raw = raw.where(F.col("lsn") >= ckpt.lsn)
            batch = TableBatch(table, schema, raw, bootstrap, st.snapshot_lsn, after, upto, log.value_kind)
            batch.defaults = log.column_defaults(table)
            batch.retired, batch.renames = followed.retired, followed.renames
            batches.append(shape_batch(batch, work.sink_cfg))
        return batches

    def _save_pending(self, work: _CutWork) -> None:
        """The cut recorded as pending before anything is written: a run that dies applies it again."""
        ckpt = work.ckpt
        ckpt.pending = {
            "cut_id": work.cut_id,
            "lsn": work.cut_lsn,
            "tables": {k: [r.base, r.end] for k, r in work.cut_tables.items()},
        }
        if work.targets:  # the views' versions of this cut: a crashed cut applies exactly these rows again
            ckpt.pending["views"] = {n: t.record() for n, t in work.targets.items()}
        save_checkpoint(self.pipeline.state_path, ckpt)

    def _apply_tables(self, sink: Sink, work: _CutWork, batches: list, run: SinkRun) -> None:
        """Every batch read and checked, the follower prepared (schemas checked and evolved), then
        each table applied, side by side where the sink allows (pipelines/apply/parallel.py)."""
        name, cut_id = work.sink_cfg.name, work.cut_id
        stages = metrics.APPLY_STAGE
        parallelism = self._parallelism(sink)
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
                batches, lambda slot: self._apply_table(sink, slot, cut_id), parallelism, self.spark, name
            )
            run.tables.extend(applied)
        finally:
            for batch in batches:  # those a failure kept from starting (the others released theirs)
                batch.release()

    def _write_markers(self, sink: Sink, work: _CutWork, batches: list) -> None:
        """Each applied table's marker (sinks/marker.py), after the rows: a marker never claims more
        than the engine holds."""
        ckpt, by_name = work.ckpt, work.by_name
        # older followers: markers for the tables applied before the sink kept them
        redo = [] if ckpt.markers else [n for n in ckpt.tables if n in by_name and n in work.wanted]
        ends = {
            b.table: (b.epoch, b.last_offset)
            if isinstance(b, ViewBatch)
            else (work.cut_tables[str(b.table)].base, b.last_offset)
            for b in batches
        }
        ends |= {by_name[n]: tuple(ckpt.tables[n]) for n in redo if by_name[n] not in ends}
        name = work.sink_cfg.name
        markers = [
            (table, Marker(self.pipeline.name, name, sink.log_id, base, end, work.cut_id).to_json())
            for table, (base, end) in ends.items()
        ]
        with stage(f"sink {name}: cut {work.cut_id}: writing {len(markers)} marker(s)"):
            run_tasks(
                markers,
                lambda slot: sink.in_session(slot.spark).write_marker(*slot.item),
                self._parallelism(sink),
                self.spark,
                name,
            )
        ckpt.markers = True

    @staticmethod
    def _record_cut(sink: Sink, work: _CutWork) -> None:
        """The sink's own record of the cut (e.g. Delta's _cdc_cuts), once rows and markers are in."""
        applied = [work.by_name[n] for n in work.wanted if n in work.by_name]
        applied += [view_table(v) for v in work.targets]
        with stage(f"sink {work.sink_cfg.name}: cut {work.cut_id}: recording the cut"):
            sink.cut_applied(work.cut_id, work.cut_lsn, applied, work.again)

    def _save_applied(self, work: _CutWork) -> None:
        """The checkpoint moved to the cut, its pending record dropped."""
        ckpt, cut_tables = work.ckpt, work.cut_tables
        ckpt.cut_id, ckpt.lsn, ckpt.ts_ms = work.cut_id, work.cut_lsn, int(time.time() * 1000)
        for name in work.wanted:
            if name in cut_tables:
                ckpt.tables[name] = [cut_tables[name].base, cut_tables[name].end]
        for view, target in work.targets.items():
            ckpt.tables[str(view_table(view))] = [target.epoch, target.version]
        ckpt.pending = None
        save_checkpoint(self.pipeline.state_path, ckpt)

    def _make_sink(self, log, sink_cfg: SinkConfig) -> Sink:
        sink = make_sink(sink_cfg, self.pipeline, self.spark)
        sink.log_id = getattr(log, "log_id", "")
        sink.set_output(self.say)
        return sink

    def _lost_while_idle(
        self, log, latest: Cut, sink_cfg: SinkConfig, ckpt: Checkpoint, views: dict, by_name: dict
    ) -> bool:
        """The self-check of a follower with no new cut to apply: an engine wiped while the source is
        idle (Redis flushed, a Delta table's directory deleted) is found now, not at the next change;
        True sends the follower through a cut's path, which rebuilds what it lost (_check_markers).
        The continuous loop checks every `spark.follower_check_interval_s` (a few reads per table,
        not for every round); `--once` every time."""
        last = self.checked.get(sink_cfg.name)
        if last is not None and time.monotonic() - last < self.check_every:
            return False
        held, followed = _held(self._wanted(sink_cfg, latest), views, ckpt, by_name)
        lost = self._lost_tables(self._make_sink(log, sink_cfg), sink_cfg, ckpt, held, followed)
        return bool(lost)

    def _parallelism(self, sink: Sink) -> int:
        """How many tables of a cut the sink applies at once (`spark.apply_parallelism`)."""
        if not sink.parallel_tables:
            return 1
        wanted = self.pipeline.spark.apply_parallelism
        return wanted if wanted is not None else auto_parallelism(self.spark.sparkContext.defaultParallelism)

    def _apply_table(self, sink: Sink, slot: Slot[TableBatch], cut_id: int) -> ApplyStats:
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
                    return sink.in_session(slot.spark).apply(batch, changes, cut_id)
                finally:
                    changes.release()
        finally:
            batch.release()  # its cached events, as soon as the table is done

    def _rebuild_reshaped(
        self, log, sink, sink_cfg: SinkConfig, ckpt: Checkpoint, wanted: list[str], by_name: dict
    ) -> None:
        """A table whose table_options (columns, masks, rename, mask_key) changed since it was applied
        holds values shaped the old way: it is cleared and rebuilt from the log's base in this cut.
        The new shapes are recorded with the cut (saved with its pending checkpoint)."""
        shapes = {name: shape_record(sink_cfg, by_name[name]) for name in wanted if name in by_name}
        if ckpt.shapes is not None:
            for name, shape in shapes.items():
                before = ckpt.shapes.get(name, "")
                if name not in ckpt.tables or before == shape:
                    continue
                # new options with a typo stop here (exit 2), before the follower is cleared
                shape_of(sink_cfg, by_name[name], log.schema(by_name[name]))
                self.say(
                    f"sink {sink_cfg.name}: {name}: its table_options changed since it was applied"
                    f" ({before or 'none'} -> {shape or 'none'}): rebuilding it from the log's base"
                )
                if _renamed(before, shape):
                    self.say(
                        f"sink {sink_cfg.name}: {name}: the follower under its old name is left as it was;"
                        " remove it if it holds values the new options leave out or mask"
                    )
                sink.clear_table(by_name[name])
                del ckpt.tables[name]  # planned from the base (bootstrap): the sink starts the table over
        ckpt.shapes = shapes

    def _check_markers(
        self,
        sink: Sink,
        sink_cfg: SinkConfig,
        ckpt: Checkpoint,
        applied: list[str],
        by_name: dict[str, TableName],
    ) -> None:
        """Does the engine still hold what the checkpoint says this follower applied? (sinks/marker.py)
        Tables it lost are rebuilt from the log's base, or the run stops (on_lost: stop)."""
        lost = self._lost_tables(sink, sink_cfg, ckpt, applied, by_name)
        if not lost:
            return
        what = "; ".join(f"{t}: {why}" for t, why in sorted(lost.items()))
        note = {"ts_ms": int(time.time() * 1000), "tables": lost}
        if sink_cfg.on_lost == "stop":
            fix = (
                f"rebuild it from the log's base: `{self.pipeline.command('reset', '--sink', sink_cfg.name, '--rebuild', '--yes')}`, "
                f"then `{self.pipeline.command('apply', '--once', '--sink', sink_cfg.name)}`"
            )
            ckpt.lost = note | {"action": "stopped", "fix": fix}
            save_checkpoint(self.pipeline.state_path, ckpt)
            raise SinkError(
                f"sink {sink_cfg.name}: the follower lost data it had applied ({what}); on_lost: stop", fix
            )
        self.say(
            f"sink {sink_cfg.name}: the follower lost data it had applied ({what}): rebuilding from the log's base"
        )
        for name in lost:
            sink.clear_table(by_name[name])  # what is left (an older backup, another pipeline's data) goes
            del ckpt.tables[name]  # planned from the base (bootstrap): the sink starts the table over
        ckpt.lost = note | {"action": "rebuilt"}

    def _lost_tables(
        self,
        sink: Sink,
        sink_cfg: SinkConfig,
        ckpt: Checkpoint,
        applied: list[str],
        by_name: dict[str, TableName],
    ) -> dict[str, str]:
        """{table: why} for each applied table the engine no longer holds as the checkpoint says."""

        def why(slot: Slot[str]) -> str | None:
            expected = None
            if sink.markers and ckpt.markers:
                base, end = ckpt.tables[slot.item]
                expected = Marker(self.pipeline.name, sink_cfg.name, sink.log_id, base, end, ckpt.cut_id)
            return why_lost(sink.in_session(slot.spark), by_name[slot.item], expected)

        # table by table a few small reads each: side by side like the tables' MERGEs
        reasons = run_tasks(applied, why, self._parallelism(sink), self.spark, sink_cfg.name)
        self.checked[sink_cfg.name] = time.monotonic()
        return {name: reason for name, reason in zip(applied, reasons, strict=True) if reason is not None}

    def report(self, runs: list[SinkRun]) -> None:
        for run in runs:
            if run.error is not None:
                self.say(
                    f"sink {run.sink}: FAILED: {run.error.problem}"
                    + (f"\n  fix: {run.error.fix}" if run.error.fix else "")
                )
            elif run.up_to_date:
                self.say(f"sink {run.sink}: up to date at {format_lsn(run.lsn or 0)}")
            else:
                detail = "; ".join(s.line() for s in run.tables) or "no changes"
                self.say(
                    f"sink {run.sink}: applied cut {run.cut_id} ({format_lsn(run.lsn or 0)}) in {run.seconds:.1f}s: {detail}"
                )

    def run_forever(
        self,
        only: str | list[str] | None = None,
        interval: float | None = None,
        keep_going: Callable[[], bool] = lambda: True,
    ) -> None:
        """Apply every `interval` seconds until SIGINT/SIGTERM (or keep_going() turns False)."""
        interval = interval or self.pipeline.spark.trigger_interval_s
        self.check_every = self.pipeline.spark.follower_check_interval_s  # idle followers' self-check
        old = {s: signal.signal(s, self.request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
        # /healthz and /readyz on the metrics port (pipelines/apply/health.py)
        watch = ApplyHealth([s.name for s in self._sinks(only)], interval, self.guard)
        health.register("apply", watch.check)
        try:
            while not self._stop and keep_going():
                started = time.monotonic()
                watch.round_started()
                runs = self.run_once(only)
                watch.round_ended(runs)
                self.report([r for r in runs if not r.up_to_date])
                while not self._stop and keep_going() and time.monotonic() - started < interval:
                    watch.idle()
                    time.sleep(min(0.2, interval))
        finally:
            health.unregister("apply")
            for s, h in old.items():
                signal.signal(s, h)


def _held(
    wanted: list[str], views: dict, ckpt: Checkpoint, by_name: dict[str, TableName]
) -> tuple[list[str], dict[str, TableName]]:
    """The tables (and view tables) the sink follows and has applied, and every name's TableName."""
    followed = by_name | {str(view_table(v)): view_table(v) for v in views}
    held = [n for n in wanted if n in by_name] + [str(view_table(v)) for v in views]
    return [n for n in held if n in ckpt.tables], followed


def _renamed(before: str, after: str) -> bool:
    """Whether two shape records (sinks/shaping.py shape_record) name the follower differently."""
    import json

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


def table_name(text: str) -> TableName:
    return TableName.parse(text)
