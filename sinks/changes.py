"""One table's slice of a batch, read from the log, and the net change per key it amounts to.

Net change (DESIGN.md §7): per key the last event by position (commit LSN, index in the
transaction) wins; a delete beats earlier writes; a truncate drops everything before it
(the sink empties the table at that position); an unchanged-TOAST value takes the last value
the batch knows for that column, and when the batch knows none the sink keeps the value it
already has (flag column `__cdc_u_<i>`). A large range stays in Spark: the driver only sees
tiny aggregates (the truncate position, cast-failure counts). A small one of the embedded log is
held in the driver already (pipelines/apply/readers/local.py): its summary is summed up there and,
where pyarrow types every column as Spark would (sinks/arrowtyping.py), its rows typed and netted
there (sinks/arrownet.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.errors import SinkError
from cdc.ground.tables import TableName
from cdc.log.base import TableSchema
from cdc.schema import schema_types
from sinks.sparktypes import cast_failures, from_envelope, from_text, spark_type, toastable

META_COLUMNS = ("_cdc_lsn", "_cdc_seq", "_cdc_op", "_cdc_commit_ts")
POSITION_KEY = ("_cdc_lsn", "_cdc_seq")  # the identity of a keyless table's row
META_TYPES = {
    "_cdc_lsn": T.LongType(),
    "_cdc_seq": T.LongType(),
    "_cdc_op": T.StringType(),
    "_cdc_commit_ts": T.TimestampType(),
}


class cached_property:  # functools.cached_property, without its lock
    """Computed on first use, then kept on the instance. Python 3.11's functools version holds one
    lock per property for every instance: the tables of a cut, checked and applied side by side
    (pipelines/apply/parallel.py), would wait for each other's Spark jobs. A batch is used by one
    thread at a time, so it needs no lock."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


def is_local(df: DataFrame) -> bool:
    """Spark's optimized plan of `df` is data already in the driver (a local relation): collecting
    it runs no job."""
    execution = df._jdf.queryExecution()
    leaves = (
        execution.analyzed().collectLeaves()
    )  # asked first: optimizing a data source's plan plans its scan
    if any(leaves.apply(i).getClass().getSimpleName() != "LocalRelation" for i in range(leaves.size())):
        return False
    return bool(execution.optimizedPlan().getClass().getSimpleName() == "LocalRelation")


def unchanged_flag(index: int) -> str:
    return f"__cdc_u_{index}"


def typed_columns(
    schema: TableSchema, texts: list[Column], kind: str = "pgtext"
) -> list[tuple[str, Column, Column]]:
    """(name, typed value, cast-failed?) per column, from text expressions `texts` that hold
    PostgreSQL text output (kind "pgtext") or envelope JSON values (kind "envelope")."""
    types = schema_types(schema)
    convert = from_envelope if kind == "envelope" else from_text
    out = []
    for col, text in zip(schema.columns, texts, strict=True):
        t = types[col.type_oid]
        typed = convert(text, t, col)
        out.append((col.name, typed, cast_failures(text, typed, t, col, kind)))
    return out


def made(frame: DataFrame | Callable[[], DataFrame]) -> DataFrame:
    """A frame, or the frame a deferred one makes (rows held in the driver: a writer in this
    process may take them as pyarrow and never need the Spark plan, whose py4j calls cost
    0.05-0.1 s per table)."""
    return frame if isinstance(frame, DataFrame) else frame()


def then(
    frame: DataFrame | Callable[[], DataFrame], step: Callable[[DataFrame], DataFrame]
) -> DataFrame | Callable[[], DataFrame]:
    """`step` applied to a frame, or deferred with it."""
    if isinstance(frame, DataFrame):
        return step(frame)
    return lambda: step(made(frame))


@dataclass
class NetChanges:
    # typed source columns + META_COLUMNS + unchanged flags; one row per key (`df`), or a function
    # making it when first needed
    frame: DataFrame | Callable[[], DataFrame]
    unchanged: dict[str, str] = field(
        default_factory=dict
    )  # column -> flag column (True = keep target value)
    cached: DataFrame | None = None
    # The same rows as a pyarrow Table, typed and netted in the driver (sinks/arrowtyping.py,
    # sinks/arrownet.py) when the batch could: a writer in this process takes them with no Spark
    # job. None: only `df` has them.
    arrow: Any = None

    @cached_property
    def df(self) -> DataFrame:
        return made(self.frame)

    def release(self) -> None:
        if self.cached is not None:
            self.cached.unpersist()


class Batch(Protocol):
    """What a sink reads of a table's batch: a TableBatch, or a derived view's (sinks/viewbatch.py)."""

    @property
    def table(self) -> TableName: ...
    @property
    def schema(self) -> TableSchema: ...
    @property
    def bootstrap(self) -> bool: ...  # the follower starts the table over
    @property
    def snapshot_lsn(self) -> int | None: ...
    @property
    def first_offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...
    @property
    def value_kind(self) -> str: ...
    @property
    def defaults(self) -> dict[str, tuple[int, str]]: ...
    @property
    def retired(self) -> frozenset[str]: ...
    @property
    def renames(self) -> dict[str, tuple[str, ...]]: ...
    @property
    def key_columns(self) -> tuple[str, ...]: ...
    @property
    def spark_schema(self) -> T.StructType: ...
    @property
    def empty(self) -> bool: ...
    @property
    def truncate_position(self) -> tuple[int, int] | None: ...
    @property
    def truncates(self) -> list[tuple[int, int, int | None]]: ...
    def default_value(self, column: str) -> Column: ...
    def check(self) -> None: ...
    def net(self) -> NetChanges: ...
    def versions(self) -> NetChanges: ...
    def release(self) -> None: ...


@dataclass
class TableBatch:
    table: TableName
    schema: TableSchema  # newest schema: the follower's columns
    # off, lsn, seq, op, key, vals, unch, ts (`raw`), or a function making it when first needed
    frame: DataFrame | Callable[[], DataFrame]
    bootstrap: bool  # the follower starts this table over from the log's base
    snapshot_lsn: int | None  # consistent point of the base snapshot
    first_offset: int
    last_offset: int
    value_kind: str = (
        "pgtext"  # how `vals` are written: PostgreSQL text ("pgtext") or envelope JSON ("envelope")
    )
    # Columns added with a constant default: name -> (LSN they appeared at, default as text).
    defaults: dict[str, tuple[int, str]] = field(default_factory=dict)
    # Columns the source dropped during the batch's span: rows written after the drop keep the follower's value.
    retired: frozenset[str] = frozenset()
    # Column -> the older names it had (newest first): a follower still holding one renames it.
    renames: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The table's base offset in the log (its snapshot), as the follower's marker names it.
    base: int | None = None
    # The cut whose data commit last wrote the table, as the checkpoint says (Checkpoint.written;
    # None: not recorded): a Delta follower whose commits carry exactly that cut holds the log up
    # to `first_offset` (DeltaSink._appends).
    written_at: int | None = None
    # The log promises that an insert is of a key the table did not hold just before it: it holds
    # every change of the table in position order and a key names one row (the embedded log and
    # cdc's Kafka topics; not Debezium's). With `inserts_only` it lets a follower append the rows.
    inserts_new: bool = False
    # The events of `raw` as the pyarrow Table it was made from, when the range was read in the
    # driver (ChangeReader.read_changes_held); None otherwise.
    held: Any = None

    def default_value(self, column: str):
        """The typed Spark literal of a column's fast default."""
        col = next(c for c in self.schema.columns if c.name == column)
        return from_text(F.lit(self.defaults[column][1]), self.types[col.type_oid], col)

    @cached_property
    def types(self):
        return schema_types(self.schema)

    @property
    def key_columns(self) -> tuple[str, ...]:
        # a keyless (insert-only) table's rows are identified by their position (docs/keyless-tables.md)
        return self.schema.key or POSITION_KEY

    @cached_property
    def spark_schema(self) -> T.StructType:
        return T.StructType(
            [T.StructField(c.name, spark_type(self.types[c.type_oid], c), True) for c in self.schema.columns]
        )

    @property
    def empty(self) -> bool:
        return self.last_offset <= self.first_offset

    @cached_property
    def raw(self) -> DataFrame:
        return made(self.frame)

    @cached_property
    def in_driver(self) -> bool:
        """The batch's rows are already in the driver (a small range read there,
        pipelines/apply/readers/local.py) and every step over them so far folds into that data:
        Spark evaluates projections and filters of a local relation while planning, with no job."""
        return self.held is not None or is_local(self.raw)

    @cached_property
    def events(self) -> DataFrame:
        """The batch's rows, read from the log once and kept for the passes below (rows already in
        the driver are not cached: caching them would cost a job and stop the folding)."""
        return self.raw if self.in_driver else self.raw.persist()

    @cached_property
    def _summary(self) -> dict:
        """One pass over the batch for everything the plan needs: the last truncate's position,
        whether unchanged-TOAST markers occur, the row and delete counts, and per column the first key whose
        value cannot be stored in the follower's type (checked on every event, so no value is
        ever turned into a silent NULL)."""
        if self.typed_in_driver is not None:
            return self._summary_held()  # every value parsed into its type: none to report
        names = [c.name for c in self.schema.columns]
        texts = [F.col("vals")[i] for i in range(len(names))]
        failures = [
            failed & (F.col("op") != "t")
            for _, _, failed in typed_columns(self.schema, texts, self.value_kind)
        ]
        found = self._summary_in_driver(failures) if self.in_driver else None
        if found is not None:
            summary, first_bad = found
            if first_bad:
                self._cast_error([(names[i], key) for i, key in sorted(first_bad.items())])
            return summary
        checks = [
            F.first(F.when(failed, F.col("key")), ignorenulls=True).alias(f"f{i}")
            for i, failed in enumerate(failures)
        ]
        row = self.events.agg(
            F.max(F.when(F.col("op") == "t", F.struct("lsn", "seq"))).alias("truncate"),
            F.max(F.size("unch")).alias("unchanged"),
            F.count(F.lit(1)).alias("rows"),
            F.count(F.when(F.col("op") == "d", 1)).alias("deletes"),
            F.count(F.when(F.col("op") != "c", 1)).alias("not_inserts"),
            *checks,
        ).first()
        bad = [(name, row[f"f{i}"]) for i, name in enumerate(names) if row[f"f{i}"] is not None]
        if bad:
            self._cast_error(bad)
        return {
            "truncate": None if row["truncate"] is None else (row["truncate"]["lsn"], row["truncate"]["seq"]),
            "unchanged": (row["unchanged"] or 0) > 0,
            "rows": row["rows"],
            "deletes": row["deletes"],
            "not_inserts": row["not_inserts"],
        }

    @cached_property
    def typed_in_driver(self) -> Any:
        """The events (truncates aside) typed by pyarrow in the driver (sinks/arrowtyping.py), as
        the follower's columns and META_COLUMNS; None when the batch holds no events here or a
        column or value is not typed there (Spark types it then)."""
        if self.held is None or self.value_kind != "pgtext":
            return None
        from sinks.arrowtyping import typed_events

        return typed_events(self.held, self.schema)

    def _net_in_driver(self) -> Any:
        """`net()`'s rows computed by pyarrow from the events typed in the driver
        (sinks/arrownet.py), the same rows as Spark's netting; None when the events are not typed here."""
        typed = self.typed_in_driver
        if typed is None:
            return None
        from sinks.arrownet import net_events

        return net_events(self.held, typed, self.truncate_position, self._unchangeable())

    def _unchangeable(self) -> dict[int, tuple[str, str]]:
        """Column index -> (name, flag column) of the columns an update may leave unchanged, when
        the batch holds such an update (a toastable type, or a column retired at the source)."""
        if not self._summary["unchanged"]:
            return {}
        return {
            i: (col.name, unchanged_flag(i))
            for i, col in enumerate(self.schema.columns)
            if toastable(self.types[col.type_oid]) or col.name in self.retired
        }

    def _summary_held(self) -> dict:
        """The summary of events held in the driver, summed up by pyarrow."""
        import pyarrow.compute as pc

        events = self.held
        ops = events["op"]
        truncates = events.filter(pc.equal(ops, "t"))
        truncate = None
        if truncates.num_rows:
            last = truncates.sort_by([("lsn", "descending"), ("seq", "descending")]).slice(0, 1)
            truncate = (last["lsn"][0].as_py(), last["seq"][0].as_py())
        return {
            "truncate": truncate,
            "unchanged": bool(pc.max(pc.list_value_length(events["unch"])).as_py() or 0),
            "rows": events.num_rows,
            "deletes": pc.sum(pc.equal(ops, "d")).as_py() or 0,
            "not_inserts": pc.sum(pc.not_equal(ops, "c")).as_py() or 0,
        }

    def _summary_in_driver(self, failures: list[Column]) -> tuple[dict, dict[int, bytes]] | None:
        """The summary of rows already in the driver, without a Spark job: a projection of each event
        (Spark folds it into the local data while planning) summed up here. Returns the summary and
        the first key per column index whose value cannot be stored; None when the projection does
        not fold (a check that needs a Python UDF): the aggregate pass then runs instead."""
        failing = F.array_compact(F.array(*[F.when(f, F.lit(i)) for i, f in enumerate(failures)]))
        projected = self.events.select(
            "op",
            "lsn",
            "seq",
            (F.size("unch") > 0).alias("unchanged"),
            failing.alias("failing"),
            F.when(F.size(failing) > 0, F.col("key")).alias("key"),
        )
        if not is_local(projected):
            return None
        truncate: tuple[int, int] | None = None
        unchanged = False
        deletes = not_inserts = 0
        bad: dict[int, bytes] = {}
        rows = projected.collect()
        for op, lsn, seq, toast, failing_at, key in rows:
            if op == "t" and (truncate is None or (lsn, seq) > truncate):
                truncate = (lsn, seq)
            unchanged = unchanged or bool(toast)
            deletes += op == "d"
            not_inserts += op != "c"
            for i in failing_at or ():
                bad.setdefault(i, key)
        summary = {
            "truncate": truncate,
            "unchanged": unchanged,
            "rows": len(rows),
            "deletes": deletes,
            "not_inserts": not_inserts,
        }
        return summary, bad

    def check(self) -> None:
        """Raise now if a value cannot be stored: the job checks every table before writing any."""
        self._summary  # noqa: B018  (the summary pass raises the cast error)

    @property
    def truncate_position(self) -> tuple[int, int] | None:
        return self._summary["truncate"]

    @property
    def rows(self) -> int:
        return self._summary["rows"]

    @property
    def inserts_only(self) -> bool:
        """Every event of the range is an insert, and none is missing from it: as many events as
        offsets. A gap means the log compacted the range (it keeps a key's newest event, so an
        insert may have lost the delete before it) or a copy of an older event was dropped: then a
        key's first event here is not its first since the follower's position."""
        s = self._summary
        return s["rows"] > 0 and s["not_inserts"] == 0 and s["rows"] == self.last_offset - self.first_offset

    @property
    def deletes(self) -> int:
        """Delete events in the batch (a keyless table's deletes remove a row by content: sinks/multiset.py)."""
        return self._summary["deletes"]

    def release(self) -> None:
        if "events" in self.__dict__:
            self.events.unpersist()

    def _after_truncate(self) -> DataFrame:
        df = self.events.filter(F.col("op") != "t")
        if self.truncate_position is not None:
            lsn, seq = self.truncate_position
            df = df.filter((F.col("lsn") > lsn) | ((F.col("lsn") == lsn) & (F.col("seq") > seq)))
        return df

    def _resolved_texts(self, df: DataFrame) -> tuple[DataFrame, dict[int, str]]:
        """Add, per toastable column, the last value known before each row (for unchanged markers)."""
        resolved: dict[int, str] = {}
        unchangeable = self._unchangeable()
        if not unchangeable:
            return df, resolved
        running = (
            Window.partitionBy("key")
            .orderBy("lsn", "seq")
            .rowsBetween(Window.unboundedPreceding, Window.currentRow)
        )
        for i in unchangeable:
            name = f"__cdc_r_{i}"
            known = F.when(~F.array_contains("unch", i), F.struct(F.col("vals")[i].alias("v")))
            df = df.withColumn(name, F.last(known, ignorenulls=True).over(running))
            resolved[i] = name
        return df, resolved

    def _typed(
        self, df: DataFrame, resolved: dict[int, str], extra: list[str]
    ) -> tuple[DataFrame, dict[str, str]]:
        """Cast texts to the follower's types (the summary pass ruled out values that cannot be)."""
        selects = []
        unchanged: dict[str, str] = {}
        texts = [
            F.col(resolved[i])["v"] if i in resolved else F.col("vals")[i]
            for i in range(len(self.schema.columns))
        ]
        for i, (name, typed, _failed) in enumerate(typed_columns(self.schema, texts, self.value_kind)):
            selects.append(typed.alias(name))
            if i in resolved:
                flag = unchanged_flag(i)
                selects.append(F.col(resolved[i]).isNull().alias(flag))
                unchanged[name] = flag
        meta: list[Column | str] = [
            F.col("lsn").alias("_cdc_lsn"),
            F.col("seq").alias("_cdc_seq"),
            F.col("op").alias("_cdc_op"),
            F.timestamp_micros("ts").alias("_cdc_commit_ts"),
            *extra,
        ]
        return df.select(*selects, *meta), unchanged

    def net(self) -> NetChanges:
        """One row per key: its state after the batch (deletes included, as op 'd')."""
        if self.inserts_new and self.inserts_only:
            # Each key occurs once: the log promises an insert is of a key absent just before it,
            # and no delete in between could free it again. The events are the net change as they
            # are, with no grouping (a shuffle; a range read in the driver stays there).
            arrow = self.typed_in_driver
            if arrow is not None:
                return NetChanges(lambda: self._typed(self.events, {}, [])[0], {}, arrow=arrow)
            typed, unchanged = self._typed(self.events, {}, [])
            return NetChanges(typed, unchanged)
        return self._latest(self._after_truncate, ["key"])

    def versions(self) -> NetChanges:
        """One row per key and transaction (SCD2 history), with the next version's commit LSN and
        time (`_cdc_next_lsn`, `_cdc_next_ts`; NULL for the newest)."""
        return self._latest(lambda: self.events.filter(F.col("op") != "t"), ["key", "lsn"])

    @cached_property
    def truncates(self) -> list[tuple[int, int, int | None]]:
        """(lsn, seq, commit ts) of every truncate in the batch, oldest first (a handful at most)."""
        if self.truncate_position is None:
            return []
        rows = (
            self.events.filter(F.col("op") == "t").select("lsn", "seq", "ts").orderBy("lsn", "seq").collect()
        )
        return [(r["lsn"], r["seq"], r["ts"]) for r in rows]

    def _latest(self, events: Callable[[], DataFrame], partition: list[str]) -> NetChanges:
        netted = self._net_in_driver() if partition == ["key"] else None  # the same rows, as pyarrow
        if netted is not None:
            unchanged = dict(self._unchangeable().values())
            return NetChanges(lambda: self._latest_plan(events(), partition)[0], unchanged, arrow=netted)
        typed, unchanged = self._latest_plan(events(), partition)
        return NetChanges(typed, unchanged)

    def _latest_plan(self, df: DataFrame, partition: list[str]) -> tuple[DataFrame, dict[str, str]]:
        df, resolved = self._resolved_texts(df)
        if not resolved and partition == ["key"]:
            # The newest event per key as an aggregate (no sort of every event inside its partition).
            newest = F.max_by(F.struct(*df.columns), F.struct("lsn", "seq"))
            df = df.groupBy("key").agg(newest.alias("__cdc_e")).select("__cdc_e.*")
        else:
            latest = Window.partitionBy(*partition).orderBy(F.col("lsn").desc(), F.col("seq").desc())
            df = df.withColumn("__cdc_rn", F.row_number().over(latest)).filter(F.col("__cdc_rn") == 1)
        extra: list[str] = []
        if partition != ["key"]:
            by_key = Window.partitionBy("key").orderBy("lsn")
            df = df.select(
                "*",
                F.lead("lsn").over(by_key).alias("_cdc_next_lsn"),
                F.timestamp_micros(F.lead("ts").over(by_key)).alias("_cdc_next_ts"),
            )
            extra = ["_cdc_next_lsn", "_cdc_next_ts"]
        self._summary  # noqa: B018 - every value is checked to fit before anything is written
        return self._typed(df, resolved, extra)

    def _cast_error(self, bad: list[tuple[str, bytes | bytearray]]) -> None:
        column, key = bad[0]
        shown = bytes(key).decode(errors="replace").replace("\t", ", ")
        col = next(c for c in self.schema.columns if c.name == column)
        raise SinkError(
            f"{self.table}: a value of column {column!r} ({self.types[col.type_oid].name}) cannot be stored as "
            f"{self.spark_schema[column].dataType.simpleString()} (first at key {shown}); "
            f"{len(bad)} column(s) affected: {', '.join(n for n, _ in bad)}",
            "values Spark has no type for (BC or infinite dates, NaN in numeric(p,s), arrays with more "
            "dimensions than declared) cannot be followed into this sink; change the column or exclude the table",
        )
