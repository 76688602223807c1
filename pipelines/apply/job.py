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

import logging
import os
import signal
import time
from collections.abc import Callable

from pyspark.sql import SparkSession

from cdc import health, metrics
from cdc.ground.config import Pipeline, SinkConfig, pipeline_tables, sink_tables, sink_views
from cdc.ground.errors import CdcError, SinkError, UsageError
from cdc.ground.lsn import format_lsn
from cdc.ground.tables import TableName
from cdc.log import empty_log_error, open_log_view
from cdc.log.base import Cut
from pipelines.apply.cut import SinkCut, SinkRun, held_tables
from pipelines.apply.health import ApplyHealth
from pipelines.apply.parallel import POOL_PROPERTY, Slot, auto_parallelism, clone_session, run_tasks
from pipelines.apply.readers import ChangeReader, change_reader
from pipelines.apply.stall import StallGuard
from pipelines.checkpoints import Checkpoint
from pipelines.faults import out_of_memory_point, pause_point
from pipelines.locks import sink_lock
from pipelines.spark import driver_exit_error, driver_jvm_exit
from pipelines.sparkerrors import spark_error_line
from sinks.base import Sink
from sinks.marker import Marker, why_lost
from sinks.registry import make_sink

logger = logging.getLogger(__name__)


class ApplyJob:
    def __init__(
        self,
        pipeline: Pipeline,
        spark: SparkSession,
        lock_wait_s: float = 0.0,
    ):
        self.pipeline = pipeline
        self.spark = spark
        self.lock_wait_s = lock_wait_s  # how long to wait for another apply of a sink (pipelines/locks.py)
        self._stop = False
        self.view_runs: list = []  # the view stage's runs of the last run_once (pipelines/views/maintain.py)
        self.guard: StallGuard | None = None
        # the self-check of an idle follower (_lost_while_idle): seconds between two (0: every
        # run, as `--once`), and when each sink's last ran (monotonic; shared with sink threads)
        self.check_every = 0.0
        self.checked: dict[str, float] = {}

    def guard_stalls(
        self, report: Callable[[str, str, int], None], before_exit: Callable[[], object] = lambda: None
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
            memory = self.pipeline.spark.conf.get("spark.driver.memory")  # YAML may give a number
            kept = "every follower keeps its checkpoint, and its pending cut is applied again exactly"
            raise driver_exit_error(code, None if memory is None else str(memory), kept)

    def _run_once(self, sinks: list[SinkConfig]) -> list[SinkRun]:
        log = open_log_view(self.pipeline)
        try:
            cut = log.latest_cut()
            if cut is None:
                raise empty_log_error(self.pipeline)
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
        job = ApplyJob(self.pipeline, spark, self.lock_wait_s)
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
            with sink_lock(self.pipeline.state_path, sink_cfg.name, self.lock_wait_s):
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
        """Metrics of one follower's round (docs/monitoring.md)."""
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
        """The cut (a pending one first) applied to one follower, step by step (pipelines/apply/cut.py)."""
        SinkCut(self, log, reader, sink_cfg, run).apply(latest)

    def wanted_tables(self, sink_cfg: SinkConfig, latest: Cut) -> list[str]:
        """The tables the sink follows: those the file names now, not every table the log still holds."""
        return [str(t) for t in sink_tables(sink_cfg, pipeline_tables(self.pipeline, list(latest.tables)))]

    def sink_for(self, log, sink_cfg: SinkConfig) -> Sink:
        sink = make_sink(sink_cfg, self.pipeline, self.spark)
        sink.log_id = getattr(log, "log_id", "")
        return sink

    def lost_while_idle(
        self, log, latest: Cut, sink_cfg: SinkConfig, ckpt: Checkpoint, views: dict, by_name: dict
    ) -> bool:
        """The self-check of a follower with no new cut to apply: an engine wiped while the source is
        idle (Redis flushed, a Delta table's directory deleted) is found now, not at the next change;
        True sends the follower through a cut's path, which rebuilds what it lost (cut.py).
        The continuous loop checks every `spark.follower_check_interval_s` (a few reads per table,
        not for every round); `--once` every time."""
        last = self.checked.get(sink_cfg.name)
        if last is not None and time.monotonic() - last < self.check_every:
            return False
        held, followed = held_tables(self.wanted_tables(sink_cfg, latest), views, ckpt, by_name)
        lost = self.lost_tables(self.sink_for(log, sink_cfg), sink_cfg, ckpt, held, followed)
        return bool(lost)

    def parallelism(self, sink: Sink) -> int:
        """How many tables of a cut the sink applies at once (`spark.apply_parallelism`)."""
        if not sink.parallel_tables:
            return 1
        wanted = self.pipeline.spark.apply_parallelism
        return wanted if wanted is not None else auto_parallelism(self.spark.sparkContext.defaultParallelism)

    def lost_tables(
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
                written = ckpt.written.get(slot.item)
                expected = Marker(self.pipeline.name, sink_cfg.name, sink.log_id, base, end, written)
            return why_lost(sink.in_session(slot.session), by_name[slot.item], expected)

        # table by table a few small reads each: side by side like the tables' MERGEs
        reasons = run_tasks(applied, why, self.parallelism(sink), self.spark, sink_cfg.name)
        self.checked[sink_cfg.name] = time.monotonic()
        return {name: reason for name, reason in zip(applied, reasons, strict=True) if reason is not None}

    def report(self, runs: list[SinkRun]) -> None:
        for run in runs:
            if run.error is not None:
                logger.info(
                    f"sink {run.sink}: FAILED: {run.error.problem}"
                    + (f"\n  fix: {run.error.fix}" if run.error.fix else "")
                )
            elif run.up_to_date:
                logger.info(f"sink {run.sink}: up to date at {format_lsn(run.lsn or 0)}")
            else:
                detail = "; ".join(s.line() for s in run.tables) or "no changes"
                logger.info(
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


def table_name(text: str) -> TableName:
    return TableName.parse(text)
