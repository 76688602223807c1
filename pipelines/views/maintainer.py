"""One derived view maintained to a cut (pipelines/views/maintain.py runs the stage and says how):
its pending cut first after a crash, then incrementally (the changed keys, the affected view keys, one
MERGE of the new rows and deletes) or in full (the out table replaced), each cut one Delta commit with the
view's txn, and the outcome as a ViewRun; a view that fails records its error in its state.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc.ground.clock import now_ms
from cdc.ground.config import ViewConfig
from cdc.ground.errors import CdcError, SinkError
from cdc.ground.tables import TableName
from cdc.ground.tables import spark_ident as q
from pipelines.faults import crash_point
from pipelines.sparkerrors import spark_error_line
from pipelines.views.base import CDF_PROPERTY
from pipelines.views.explain import _explain, renamed_column
from pipelines.views.reads import BaseTables, NoChangeData
from pipelines.views.state import ViewState, load_view_state, out_path, save_view_state
from sinks.delta.cuts import table_version
from sinks.delta.features import COLUMN_MAPPING
from sinks.delta.idempotent import follower_write
from sinks.delta.names import UNSAFE_CHARS

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pipelines.views.plan import ViewPlan

OP = "_cdc_view_op"  # the MERGE source's own column: 'u' a view row, 'd' a key to delete


@dataclass
class ViewRun:
    """One view's maintenance in this apply run (one line of the apply output)."""

    view: str
    cut_id: int | None = None
    mode: str = ""  # incremental | full
    reason: str = ""
    epoch: int = 0
    new_epoch: bool = False
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    skipped: bool = False  # Delta had committed this cut already (a replay after a crash)
    up_to_date: bool = False
    error: CdcError | None = None

    def line(self) -> str:
        if self.error is not None:
            fix = f"\n  fix: {self.error.fix}" if self.error.fix else ""
            return f"view {self.view}: FAILED: {self.error.problem}{fix}"
        counts = (
            "already applied" if self.skipped else f"+{self.inserted:,} ~{self.updated:,} -{self.deleted:,}"
        )
        if self.mode == "incremental":
            how = "incremental"
        else:
            how = f"full recomputation: {self.reason}"
            if self.new_epoch:
                how += f"; new epoch {self.epoch}: its followers start it over"
        return f"view {self.view}: cut {self.cut_id}: {counts} ({how})"


@dataclass(frozen=True)
class BaseAt:
    """The base tables at the base follower's cut: per table [base offset, Delta version, table id]."""

    cut_id: int
    lsn: int
    tables: dict[str, list[Any]]
    cut_tables: dict[str, list[int]] | None = None  # the whole cut (ViewState.cut_tables)


def _failed(state: Path, name: str, cut_id: int | None, exc: CdcError) -> ViewRun:
    """Record the view's error in its state (the rest of the state stays: the view resumes there)."""
    current = load_view_state(state, name) or ViewState(name)
    current.error = {"problem": exc.problem, "fix": exc.fix, "cut_id": cut_id}
    save_view_state(state, current)
    return ViewRun(name, cut_id, error=exc)


# ---- one view ------------------------------------------------------------------------------------
class ViewMaintainer:
    def __init__(self, spark: SparkSession, pipeline: str, state: Path, log):
        self.spark = spark
        self.state = state
        self.log = log
        self.app_prefix = f"cdc-view:{pipeline}"
        self.base = BaseTables(spark, state, log)
        self._temp: list[str] = []

    def run(self, view: ViewConfig, plan: ViewPlan, base: BaseAt) -> ViewRun:
        current = load_view_state(self.state, view.name) or ViewState(view.name)
        try:
            if current.pending and current.pending.get("fingerprint") == plan.fingerprint:
                pending = current.pending  # the cut a crashed run started: exactly that cut again
                again = BaseAt(pending["cut_id"], pending["lsn"], pending["base"], pending.get("cut_tables"))
                run = self._cut(current, plan, again)
                if run.cut_id == base.cut_id:
                    return run
                logger.info(run.line())  # then on to the latest cut, like a sink's pending cut
                current = load_view_state(self.state, view.name) or current
            missing = [str(t) for t in plan.tables if str(t) not in base.tables]
            if missing:
                raise SinkError(
                    f"view {view.name}: table(s) {', '.join(missing)} it reads are not in the log at cut {base.cut_id}",
                    "snapshot them (`cdc snapshot PIPELINE --tables ...`) or change the view's SQL",
                )
            if (
                current.cut_id == base.cut_id
                and current.fingerprint == plan.fingerprint
                and not current.error
            ):
                return ViewRun(view.name, base.cut_id, up_to_date=True, epoch=current.epoch)
            return self._cut(current, plan, base)
        except CdcError as exc:
            return _failed(self.state, view.name, base.cut_id, exc)
        except Exception as exc:  # Spark's analysis of the SQL (a dropped column), a duplicate key...
            renamed = lambda column: renamed_column(self.log, plan.tables, column)  # noqa: E731
            return _failed(
                self.state, view.name, base.cut_id, _explain(view, exc, spark_error_line(exc), renamed)
            )
        finally:
            for name in self._temp:
                self.spark.catalog.dropTempView(name)
            self._temp.clear()

    # -- one cut -----------------------------------------------------------------------------------
    def _cut(self, current: ViewState, plan: ViewPlan, base: BaseAt) -> ViewRun:
        name = plan.name
        pending = current.pending
        if (
            not pending
            or pending.get("cut_id") != base.cut_id
            or pending.get("fingerprint") != plan.fingerprint
        ):
            pending = None
        base_tables = {str(t): base.tables[str(t)] for t in plan.tables}
        mode, reason, new_epoch = self._decide(current, plan, base_tables)
        if pending is not None:  # the crashed run's decision, so the redo writes what it wrote
            mode, reason, new_epoch = pending["mode"], pending["reason"], pending["epoch"] != current.epoch
        old_v = {t: v[1] for t, v in current.base.items()}
        new_v = {t: v[1] for t, v in base_tables.items()}
        touched: list[TableName] = []
        if mode == "incremental":
            touched = [t for t in plan.tables if self.base.touched(t, old_v[str(t)], new_v[str(t)])]
            if not touched and pending is None and not current.error:
                return self._unchanged(current, plan, base, base_tables)
        source: DataFrame | None = None
        if mode == "incremental":
            try:
                source = self._incremental(plan, old_v, new_v, touched)
            except NoChangeData as exc:
                mode, reason = "full", str(exc)
        full_rows = None if source is not None else self._render(plan, new_v, "n")
        shown = source.drop(OP) if source is not None else full_rows
        assert shown is not None
        columns = [[f.name, f.dataType.json()] for f in shown.schema.fields]
        if not new_epoch and current.columns and columns != current.columns:
            mode, reason, new_epoch = "full", "its output columns changed", True
            source, full_rows = None, self._render(plan, new_v, "n")
        epoch = current.epoch + 1 if new_epoch else current.epoch
        current.pending = {
            "cut_id": base.cut_id,
            "lsn": base.lsn,
            "epoch": epoch,
            "mode": mode,
            "reason": reason,
            "fingerprint": plan.fingerprint,
            "base": base_tables,
            "cut_tables": base.cut_tables,
        }
        save_view_state(self.state, current)
        run = ViewRun(name, base.cut_id, mode, reason, epoch, new_epoch)
        out = str(out_path(self.state, name))
        app_id = f"{self.app_prefix}:{name}"
        metrics: dict[str, Any] | None
        if new_epoch:
            assert full_rows is not None
            metrics = self._replace(out, full_rows, app_id, base.cut_id)
            self._check_unique(out, plan)
        elif source is None:
            assert full_rows is not None
            metrics = self._merge(out, full_rows, None, plan, app_id, base.cut_id)
        else:
            metrics = self._merge(out, source, "incremental", plan, app_id, base.cut_id)
        if metrics is None:
            run.skipped = True
        else:
            run.inserted = int(metrics.get("num_inserted_rows", 0))
            run.updated = int(metrics.get("num_updated_rows", 0))
            run.deleted = int(metrics.get("num_deleted_rows", 0))
        crash_point("views:after-merge")
        version = table_version(self.spark, out)  # from the Delta log: no Spark job
        done = ViewState(
            view=name,
            cut_id=base.cut_id,
            lsn=base.lsn,
            epoch=epoch,
            version=-1 if version is None else version,
            fingerprint=plan.fingerprint,
            columns=columns,
            key=list(plan.key),
            base=base_tables,
            mode=run.mode,
            reason=run.reason,
            ts_ms=now_ms(),
            cut_tables=base.cut_tables or {},
        )
        save_view_state(self.state, done)
        return run

    def _decide(
        self, current: ViewState, plan: ViewPlan, tables: dict[str, list[Any]]
    ) -> tuple[str, str, bool]:
        """(mode, reason, new epoch) for this cut."""
        if current.epoch == 0 or not current.fingerprint:
            return "full", "first build", True
        if current.fingerprint != plan.fingerprint:
            return "full", "its SQL or key changed in the pipeline file: rebuilt from scratch", True
        if plan.mode != "incremental":
            return "full", plan.reason, False
        for table, (offset, version, table_id) in tables.items():
            before = current.base.get(table)
            if before is None:
                return "full", f"it reads {table} for the first time", False
            if before[0] != offset:
                return "full", f"base table {table} has a new base in the log (re-snapshotted)", False
            if before[2] != table_id or version < before[1]:
                return "full", f"base table {table} was rebuilt", False
        return "incremental", "", False

    def _unchanged(
        self, current: ViewState, plan: ViewPlan, base: BaseAt, base_tables: dict[str, list[Any]]
    ) -> ViewRun:
        """No row of the view's base tables changed since its last cut (only other tables did, or
        only the base follower's markers): the view stands at the new cut with the same out table
        version, at no Spark job. Nothing is written, so there is nothing to redo after a crash."""
        current.cut_id, current.lsn, current.base = base.cut_id, base.lsn, base_tables
        current.mode, current.reason, current.ts_ms = "incremental", "", now_ms()
        current.cut_tables = base.cut_tables or {}
        save_view_state(self.state, current)
        return ViewRun(plan.name, base.cut_id, "incremental", "", current.epoch)

    # -- reading the base tables ---------------------------------------------------------------
    def _register(self, df: DataFrame, plan: ViewPlan, tag: str) -> str:
        name = f"_cdcv_{plan.name}_{len(self._temp)}_{tag}"
        df.createOrReplaceTempView(name)
        self._temp.append(name)
        return name

    def _sources(self, plan: ViewPlan, versions: dict[str, int], tag: str) -> dict[TableName, str]:
        """Temp views of the plan's tables at `versions`, each loaded when first named (a table off
        the join path of the cut's changes is never read at the old version)."""
        return _LazySources(lambda t: self._register(self.base.frame(t, versions[str(t)]), plan, tag))

    def _render(self, plan: ViewPlan, versions: dict[str, int], tag: str) -> DataFrame:
        return self.spark.sql(plan.render(self._sources(plan, versions, tag)))

    # -- incremental -----------------------------------------------------------------------------
    def _incremental(
        self, plan: ViewPlan, old_v: dict[str, int], new_v: dict[str, int], touched: list[TableName]
    ) -> DataFrame:
        """The MERGE source of an incremental cut: view rows 'u' and keys to delete 'd'. Each touched
        table's changed rows come from its change data feed (BaseTables.changes, shared by the views);
        the affected view keys from them along the join path to the anchor; the new rows from the
        anchor restricted to those keys."""
        old_src = self._sources(plan, old_v, "o")
        new_src = self._sources(plan, new_v, "n")
        parts = []
        for table in touched:
            changes = self.base.changes(table, old_v[str(table)], new_v[str(table)])
            for src, rows, tag in ((old_src, changes[0], "co"), (new_src, changes[1], "cn")):
                # only the join path from the table to the anchor, as inner joins (plan.py keys_sql)
                keys_sql = plan.keys_sql(src, changed=table, changed_rows=self._register(rows, plan, tag))
                parts.append(self.spark.sql(keys_sql))
        assert plan.anchor is not None  # an incremental plan always has one
        if not parts:  # a replayed cut whose tables show no change: an empty source
            parts.append(self.spark.sql(plan.keys_sql(new_src)).limit(0))
        affected = parts[0]
        for part in parts[1:]:
            affected = affected.unionByName(part)
        affected = affected.distinct()
        renamed = affected.select(*[F.col(q(k)).alias(f"_a_{i}") for i, k in enumerate(plan.key)])
        anchor = self.base.frame(plan.anchor, new_v[str(plan.anchor)])
        on = [anchor[q(c)].eqNullSafe(renamed[f"_a_{i}"]) for i, c in enumerate(plan.anchor_columns)]
        restricted = anchor.join(renamed, on, "left_semi")
        sources = {t: new_src[t] for t in plan.tables} | {plan.anchor: self._register(restricted, plan, "a")}
        rows = self.spark.sql(plan.render(sources))
        gone = affected.join(
            rows.select(*[F.col(q(k)).alias(f"_r_{i}") for i, k in enumerate(plan.key)]),
            [affected[q(k)].eqNullSafe(F.col(f"_r_{i}")) for i, k in enumerate(plan.key)],
            "left_anti",
        )
        return rows.withColumn(OP, F.lit("u")).unionByName(
            gone.withColumn(OP, F.lit("d")), allowMissingColumns=True
        )

    # -- writing the out table -------------------------------------------------------------------
    def _merge(
        self, out: str, source: DataFrame, kind: str | None, plan: ViewPlan, app_id: str, cut_id: int
    ) -> dict[str, Any] | None:
        """MERGE by view key; a full source ('u' rows only) also deletes the rows it lacks. None:
        Delta had committed this cut already."""
        if kind is None:
            source = source.withColumn(OP, F.lit("u"))
        columns = [c for c in source.columns if c != OP]
        on = " AND ".join(f"t.{q(k)} <=> s.{q(k)}" for k in plan.key)
        differs = " OR ".join(f"NOT (t.{q(c)} <=> s.{q(c)})" for c in columns if c not in plan.key) or "false"
        values: dict[str, str | Column] = {q(c): F.col(f"s.{q(c)}") for c in columns}
        merge = (
            DeltaTable.forPath(self.spark, out)
            .alias("t")
            .merge(source.alias("s"), on)
            .whenMatchedDelete(f"s.{OP} = 'd'")
            .whenMatchedUpdate(f"s.{OP} = 'u' AND ({differs})", set=values)
            .whenNotMatchedInsert(f"s.{OP} = 'u'", values=values)
        )
        if kind is None:
            merge = merge.whenNotMatchedBySourceDelete()
        # the source computed once (Delta would evaluate it twice: to find the files, then to write)
        source.persist()
        try:
            with follower_write(self.spark, app_id, cut_id):
                row = merge.execute().first()
        finally:
            source.unpersist()
        return None if row is None else row.asDict()

    def _replace(self, out: str, rows: DataFrame, app_id: str, cut_id: int) -> dict[str, Any]:
        """A new epoch: the out table made anew (no txn of an older epoch's cut survives) with every row."""
        shutil.rmtree(out, ignore_errors=True)
        builder = DeltaTable.create(self.spark).location(out).property(CDF_PROPERTY, "true")
        if any(UNSAFE_CHARS.intersection(c) for c in rows.columns):  # a name plain Delta cannot hold
            for key, value in COLUMN_MAPPING.items():
                builder = builder.property(key, value)
        for f in rows.schema.fields:
            builder = builder.addColumn(f.name, f.dataType, nullable=True)
        builder.execute()
        with follower_write(self.spark, app_id, cut_id):
            rows.write.format("delta").mode("append").save(out)
        [history] = DeltaTable.forPath(self.spark, out).history(1).collect()  # the append just made
        return {"num_inserted_rows": int((history["operationMetrics"] or {}).get("numOutputRows", 0))}

    def _check_unique(self, out: str, plan: ViewPlan) -> None:
        """A rebuilt view's key must be unique (incremental MERGEs fail on a duplicate by themselves)."""
        dup = (
            self.spark.read.format("delta")
            .load(out)
            .groupBy(*[q(k) for k in plan.key])
            .count()
            .where("count > 1")
            .limit(1)
            .collect()
        )
        if dup:
            shown = ", ".join(f"{k}={dup[0][k]!r}" for k in plan.key)
            raise SinkError(
                f"view {plan.name}: its key ({', '.join(plan.key)}) is not unique: {dup[0]['count']} rows have {shown}",
                "choose key columns that identify one row of the view (key: in the pipeline file)",
            )


class _LazySources(dict):
    """{table: temp view name}, the temp view made the first time a table is asked for."""

    def __init__(self, make: Callable[[TableName], str]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, table: TableName) -> str:
        self[table] = name = self._make(table)
        return name
