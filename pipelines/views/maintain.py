"""The view stage: each derived view kept up to date cut by cut in its own Delta table
(`<state_dir>/views/out/<view>`, Change Data Feed on), which the sinks following the view then apply
like a table (docs/derived-views.md).

Per cut, before the sinks:
  1. the internal base follower `_views` (pipelines/views/base.py) is applied to the latest cut, so
     every table the views read is a Delta table whose version at each cut `_cdc_cuts` records;
  2. per view, from the cut it was maintained to (c0) to the base's cut (c1):
     * changed keys per base table Ti: its change data feed between its versions at c0 and c1;
       old rows = Ti@c0 and new rows = Ti@c1 restricted to those keys;
     * affected view keys A: the view's `keys_sql` (its FROM/JOIN/WHERE, no grouping) with Ti := its
       old rows and the other tables @c0, and with Ti := its new rows and the others @c1;
     * new rows: the view's SQL with its anchor table (where the key columns come from) restricted
       to A, the other tables @c1; deletes: A minus the new keys;
     * one MERGE into the out table (only rows whose values changed are rewritten), committed as
       Delta txn (`cdc-view:<pipeline>:<view>`, cut id): a cut maintained again after a crash is
       skipped by Delta itself;
  3. the view's state file (pipelines/views/state.py) records the cut and the out table's version.
Nothing but Delta commit metrics comes back to the driver.

Full recomputation instead: SQL the analysis cannot maintain incrementally (its reason), a base
table with a new base offset (re-snapshotted) or rebuilt (a new Delta table), a range without
change data. The first build, a changed SQL fingerprint or changed output columns start a new
epoch: the out table is replaced and the view's followers start it over.

Here the stage (the base follower, then each view); one view's cut (step 2) is maintainer.py's, and
the wording of a view's Spark failure explain.py's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pyspark.sql import SparkSession

from cdc.ground.config import Pipeline, SinkConfig, pipeline_tables
from cdc.ground.errors import CdcError, SinkError
from cdc.ground.tables import TableName
from cdc.ground.tables import spark_ident as q
from pipelines.checkpoints import load_checkpoint
from pipelines.locks import sink_lock
from pipelines.views.base import CDF_PROPERTY, base_sink_config, change_data_feed
from pipelines.views.maintainer import BaseAt, ViewMaintainer, ViewRun, _failed
from pipelines.views.state import BASE_SINK, base_path
from sinks.delta.cuts import cut_record, cut_record_arrow
from sinks.delta.paths import table_path
from sinks.delta.snapshot import table_id as delta_table_id
from sinks.delta.snapshot import table_property

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from cdc.log.base import Cut
    from pipelines.apply.readers import ChangeReader
    from pipelines.views.plan import ViewPlan


class StageHost(Protocol):
    """What the view stage needs of the apply job running it (pipelines/apply/job.py ApplyJob):
    named here, not imported, so the job and the stage do not import each other."""

    pipeline: Pipeline
    spark: SparkSession
    lock_wait_s: float

    def _run_sink(self, log: Any, reader: ChangeReader, cut: Cut, sink_cfg: SinkConfig) -> Any: ...


OUT_LOCK = "_views_out"  # one maintainer of the out tables at a time (pipelines/locks.py)


# ---- the stage -----------------------------------------------------------------------------------
def run_view_stage(job: StageHost, log, reader: ChangeReader, cut: Cut, names: list[str]) -> list[ViewRun]:
    """Maintain the named views to the latest cut, a line per view that moved. A view that fails is
    recorded in its state (its followers fail naming it); the other views go on."""
    from pipelines.views.sql import analyse

    pipeline, spark = job.pipeline, job.spark
    captured = pipeline_tables(pipeline, list(cut.tables))
    runs: dict[str, ViewRun] = {}
    plans: dict[str, ViewPlan] = {}
    columns = {t: log.schema(t).column_names for t in captured}  # resolves unqualified columns and `*`
    for name in names:
        try:
            plans[name] = analyse(pipeline.view(name), captured, columns)
        except CdcError as exc:
            runs[name] = _failed(pipeline.state_path, name, None, exc)
    tables = sorted({t for plan in plans.values() for t in plan.tables}, key=str)
    if plans:
        with change_data_feed(spark):
            base_run = job._run_sink(log, reader, cut, base_sink_config(pipeline, tables))
        if base_run.error is not None:
            for name in plans:
                problem = f"view {name}: its base tables could not be applied: {base_run.error.problem}"
                runs[name] = _failed(pipeline.state_path, name, None, SinkError(problem, base_run.error.fix))
        else:
            with sink_lock(pipeline.state_path, OUT_LOCK, job.lock_wait_s):
                base = _base_at(spark, pipeline.state_path, base_run.cut_id or 0, base_run.lsn or 0, tables)
                base = BaseAt(base.cut_id, base.lsn, base.tables, _whole_cut(log, cut, base.cut_id))
                # one reader of the base tables for every view: each version loaded, each table's
                # changed rows read from its feed, once per run
                maintainer = ViewMaintainer(spark, pipeline.name, pipeline.state_path, log)
                for name, plan in plans.items():
                    runs[name] = maintainer.run(pipeline.view(name), plan, base)
    ordered = [runs[n] for n in names]
    for run in ordered:
        if not run.up_to_date:
            logger.info(run.line())
    return ordered


def _base_at(spark: SparkSession, state: Path, cut_id: int, lsn: int, tables: list[TableName]) -> BaseAt:
    """Each base table's offset base, Delta version and table id at the base follower's cut; a
    table without Change Data Feed (made before the feed was on) gets it from now on."""
    try:  # read without a Spark job (delta-rs): the stage's fixed cost per cut
        record = cut_record_arrow(base_path(state), cut_id)
    except Exception:
        record = cut_record(spark, base_path(state), cut_id)
    offsets = load_checkpoint(state, BASE_SINK).tables
    out: dict[str, list[Any]] = {}
    for table in tables:
        name = str(table)
        if name not in record.versions or name not in offsets:
            continue  # not in the log at this cut: the views reading it fail naming it
        path = str(table_path(base_path(state), table))
        # from the table's Delta log (sinks/delta/snapshot.py): no Spark job, unlike detail()
        if table_property(spark, path, CDF_PROPERTY) != "true":
            spark.sql(f"ALTER TABLE delta.{q(path)} SET TBLPROPERTIES ('{CDF_PROPERTY}' = 'true')")
        out[name] = [offsets[name][0], record.versions[name], delta_table_id(spark, path)]
    return BaseAt(cut_id, lsn, out)


def _whole_cut(log, cut: Cut, cut_id: int) -> dict[str, list[int]] | None:
    """Every table's [base, end offset] at the cut the views are maintained to (the base follower
    may have applied a newer cut than `cut`, or a pending one): the view states carry it, so their
    followers never ask the log for an old cut,
    which its cut retention may have dropped."""
    found = cut if cut.id == cut_id else (log.cut(cut_id) if hasattr(log, "cut") else None)
    return None if found is None else {str(t): [r.base, r.end] for t, r in found.tables.items()}
