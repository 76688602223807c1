"""The embedded (local) log read by Spark: `LocalReader` (the ChangeReader of a `LocalLog`) and the
Python data source `cdclog` it reads through, in executors; a small range of events (a freshness
cut) is read by the same reader in the driver (DRIVER_READ_EVENTS).

Partitions are offset ranges of a table's event rows plus one per snapshot segment file, so
the read spreads over executors. Each row comes out as PostgreSQL text values aligned with
the *target* columns (the table's newest schema): a row written under an older schema
version gets None for columns it did not have. Typing happens in the JVM afterwards
(sinks.sparktypes), or, for a range held in the driver, there by pyarrow where that gives the
same values (sinks.arrowtyping; `read_changes_held` hands the range over as a pyarrow Table).

Output columns: readers.base.SCHEMA (off, lsn, seq, op, key, vals (array<string>), unch
(indexes of unchanged-TOAST values), ts (commit time, µs since the epoch)).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pipelines.apply.readers.base import EVENTS_PER_PARTITION, SCHEMA, ChangeReader, python_source

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

    from cdc.ground.tables import TableName
    from cdc.log.base import TableSchema
    from cdc.log.local import LocalLog

# A range of at most this many events (no snapshot segment) is read in the driver, by the same
# reader code, and handed to Spark as a local relation: no Python worker and no planning round trip
# for the data source. A 2-table cut of a few rows took 4.4 s instead of 5.5 s (2026-12-03).
DRIVER_READ_EVENTS = 20000
DRIVER_READ_BYTES = 8 << 20  # and their values at most this many bytes (the driver holds them)
WHOLE_SEGMENTS = 1 << 62  # segment_bytes for read_parts: one partition per segment file
BATCH_ROWS = 8192
COLUMN_NAMES = ["off", "lsn", "seq", "op", "key", "vals", "unch", "ts"]


def _arrow_types() -> list:
    import pyarrow as pa

    return [
        pa.int64(),
        pa.int64(),
        pa.int64(),
        pa.string(),
        pa.binary(),
        pa.list_(pa.string()),
        pa.list_(pa.int32()),
        pa.int64(),
    ]


class LocalReader(ChangeReader):
    """Events through the `cdclog` data source; counts and positions from the log itself (SQLite)."""

    def __init__(self, view: LocalLog):
        self.view = view

    def read_changes(
        self,
        spark: SparkSession,
        table: TableName,
        after: int,
        upto: int,
        schema: TableSchema | None = None,
        retired: frozenset[str] = frozenset(),
    ) -> DataFrame:
        from sinks.changes import made  # here: executors import this module too

        return made(self.read_changes_held(spark, table, after, upto, schema, retired)[0])

    def read_changes_held(
        self,
        spark: SparkSession,
        table: TableName,
        after: int,
        upto: int,
        schema: TableSchema | None = None,
        retired: frozenset[str] = frozenset(),
    ) -> tuple[DataFrame | Callable[[], DataFrame], Any]:
        # Columns match across schema versions by attnum (cdc.log.history).
        schema = schema or self.view.schema(table)
        options = {
            "path": str(self.view.path),
            "table_id": str(self.view.require_table(table)),
            "after": str(after),
            "upto": str(upto),
            "columns": orjson.dumps(schema.column_names).decode(),
            "attnums": orjson.dumps([c.attnum for c in schema.columns]).decode(),
            "retired": orjson.dumps(sorted(retired)).decode(),
            "missing": orjson.dumps([c.missing for c in schema.columns]).decode(),
        }
        if upto - after <= DRIVER_READ_EVENTS:
            held = _read_in_driver(options)
            if held is not None:  # Spark's copy made only if a step needs it (0.04-0.1 s)
                return lambda: spark.createDataFrame(held, schema=SCHEMA), held
        return python_source(spark, LocalLogSource).options(**options).load(), None

    def count_events(
        self, spark: SparkSession, table: TableName, after: int, upto: int, below_lsn: int
    ) -> int:
        return self.view.count_events(table, after, upto, below_lsn)

    def first_offset_from(self, spark: SparkSession, table: TableName, lsn: int, upto: int) -> int | None:
        return self.view.first_offset_from(table, lsn, upto)


def _read_in_driver(options: dict[str, str]) -> Any:
    """The range read here (a pyarrow Table), through LocalLogReader as an executor reads it; None when the range
    has snapshot segments (files of any size) or its events hold more than DRIVER_READ_BYTES:
    read in executors."""
    import pyarrow as pa

    reader = LocalLogReader(options)
    parts = reader.partitions()
    if not all(isinstance(p, EventRange) for p in parts) or _event_bytes(reader) > DRIVER_READ_BYTES:
        return None
    types = _arrow_types()
    # an empty range still needs one (empty) batch: Spark cannot type a column of no chunks
    empty = pa.RecordBatch.from_arrays([pa.array([], type=t) for t in types], names=COLUMN_NAMES)
    batches = [batch for part in parts for batch in reader.read(part)] or [empty]
    arrow_schema = pa.schema(list(zip(COLUMN_NAMES, types, strict=True)))
    return pa.Table.from_batches(batches, schema=arrow_schema)


def _event_bytes(reader: LocalLogReader) -> int:
    """The encoded size of the range's events (their values as the WAL sent them): bounds what the
    driver would hold."""
    conn = _connect(reader.path)
    try:
        (size,) = conn.execute(
            f"SELECT coalesce(sum(length(payload)) + sum(coalesce(length(before), 0)), 0)"
            f" FROM ev_{reader.table_id} WHERE off > ? AND off <= ?",
            (reader.after, reader.upto),
        ).fetchone()
    finally:
        conn.close()
    return int(size)


class EventRange(InputPartition):
    def __init__(self, first: int, last: int):
        self.first, self.last = first, last


class Segment(InputPartition):
    """Lines of a snapshot segment file starting at a byte in [start, end)."""

    def __init__(
        self, off: int, lsn: int, version: int, path: str, start: int, end: int, ts: int | None = None
    ):
        self.off, self.lsn, self.version, self.path = off, lsn, version, path
        self.start, self.end, self.ts = start, end, ts  # ts: the snapshot's time (µs), its rows' commit time


class LocalLogSource(DataSource):
    """spark.read.format("cdclog").option("path", ...).option("table_id", ...).option("after", ...)
    .option("upto", ...).option("columns", json list).load()"""

    @classmethod
    def name(cls) -> str:
        return "cdclog"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> LocalLogReader:
        return LocalLogReader(dict(self.options))


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{Path(path) / 'log.db'}?mode=ro", uri=True, timeout=60)
    conn.execute("PRAGMA busy_timeout=60000")
    return conn


class LocalLogReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        self.path = options["path"]
        self.table_id = int(options["table_id"])
        self.after = int(options["after"])
        self.upto = int(options["upto"])
        self.columns: list[str] = json.loads(options["columns"])
        self.attnums: list[int] = json.loads(options.get("attnums") or "null") or [0] * len(self.columns)
        self.retired: list[str] = json.loads(options.get("retired") or "[]")
        # Value for rows written before a column existed (its fast default, else NULL).
        self.missing: list[str | None] = json.loads(options.get("missing") or "null") or [None] * len(
            self.columns
        )

    def partitions(self) -> list[InputPartition]:
        from cdc.log.local import EventRun, LocalLog

        log = LocalLog(Path(self.path), readonly=True)
        try:  # whole segment files, as their snapshot chunks made them
            parts = log.read_parts_by_id(
                self.table_id, self.after, self.upto, EVENTS_PER_PARTITION, WHOLE_SEGMENTS
            )
        finally:
            log.close()
        out: list[InputPartition] = [
            EventRange(p.after, p.upto)
            if isinstance(p, EventRun)
            else Segment(
                p.off, p.lsn, p.version, str(Path(self.path) / p.path), p.start, p.end, p.ts_ms * 1000 or None
            )
            for p in parts
        ]
        return out or [EventRange(self.after, self.after)]

    def read(self, partition: InputPartition) -> Iterator:
        """Arrow record batches of BATCH_ROWS rows: values are built as Python lists per column and
        handed to Arrow in one call per batch, instead of one conversion per row."""
        import pyarrow as pa

        types = _arrow_types()
        rows = self._rows(partition)
        while True:
            cols: list[list] = [[], [], [], [], [], [], [], []]
            appends = [c.append for c in cols]
            n = 0
            for row in rows:
                for append, value in zip(appends, row, strict=True):
                    append(value)
                n += 1
                if n == BATCH_ROWS:
                    break
            if not n:
                return
            yield pa.RecordBatch.from_arrays(
                [pa.array(c, type=t) for c, t in zip(cols, types, strict=True)], names=COLUMN_NAMES
            )
            if n < BATCH_ROWS:
                return

    def _rows(self, partition: InputPartition) -> Iterator[tuple]:
        # Imports here: this runs in executor Python workers.
        from cdc.keys import key_from_copy_fields, position_key, snapshot_seq, unescape
        from cdc.log.base import Column, TableSchema
        from cdc.log.history import FollowedSchema
        from cdc.log.local import iter_segment, iter_segment_positions
        from cdc.pgoutput import UNCHANGED, decode_tuple

        conn = _connect(self.path)
        layouts: dict[int, tuple[list[int], tuple[int, ...]]] = {}
        missing = self.missing
        # Target columns by identity (attnum), so a row written before a rename lands in the renamed column.
        target = TableSchema(
            tuple(Column(n, 0, 0, attnum=a) for n, a in zip(self.columns, self.attnums, strict=True)), ()
        )
        followed = FollowedSchema(target, frozenset(self.retired))

        def layout(version: int) -> tuple[list[int], tuple[int, ...]]:
            """For a schema version: source index of each target column (-1 = absent, -2 = retired
            column the version lacks: keep the follower's value), key indexes."""
            if version not in layouts:
                (body,) = conn.execute(
                    "SELECT body FROM schemas WHERE table_id = ? AND version = ?", (self.table_id, version)
                ).fetchone()
                schema = TableSchema.from_json(json.loads(body))
                layouts[version] = (followed.layout(schema), schema.key_indexes)
            return layouts[version]

        try:
            if isinstance(partition, Segment):
                index, key_idx = layout(partition.version)
                rows: Iterator[list[Any]] = iter_segment(Path(partition.path), partition.start, partition.end)
                if (
                    not key_idx
                ):  # keyless: each row keyed by its place in the snapshot (cdc.keys.snapshot_seq)
                    rows = iter_segment_positions(Path(partition.path), partition.start, partition.end)
                for fields in rows:
                    pos = fields.pop() if not key_idx else None
                    vals: list[str | None] = [
                        (missing[j] if i == -1 else None)
                        if i < 0
                        else None
                        if fields[i] == b"\\N"
                        else unescape(fields[i]).decode()
                        for j, i in enumerate(index)
                    ]
                    if pos is not None:
                        seq = snapshot_seq(partition.off, pos)
                        yield (
                            partition.off,
                            partition.lsn,
                            seq,
                            "r",
                            position_key(partition.lsn, seq),
                            vals,
                            [],
                            partition.ts,
                        )
                        continue
                    yield (
                        partition.off,
                        partition.lsn,
                        0,
                        "r",
                        key_from_copy_fields(fields, key_idx),
                        vals,
                        [],
                        partition.ts,
                    )
                return
            assert isinstance(partition, EventRange)
            for off, lsn, seq, op, key, payload, before, sv, ts in conn.execute(
                f"SELECT off, lsn, seq, op, key, payload, before, sv, ts FROM ev_{self.table_id}"
                " WHERE off > ? AND off <= ? AND op != 'S' ORDER BY off",
                (partition.first, partition.last),
            ):
                if op == "t":
                    yield (off, lsn, seq, op, None, None, [], ts)
                    continue
                index, _ = layout(sv)
                raw = decode_tuple(payload if op != "d" else before, 0)[0]
                vals = []
                unch: list[int] = []
                for j, i in enumerate(index):
                    if i < 0:
                        if i == -2 and op == "u":
                            unch.append(j)  # dropped from the source since: the follower keeps its value
                        vals.append(missing[j] if op != "d" and i == -1 else None)
                        continue
                    v = raw[i]
                    if v is None:
                        vals.append(None)
                    elif v is UNCHANGED:
                        unch.append(j)
                        vals.append(None)
                    elif isinstance(v, bytes):
                        vals.append(v.decode())
                    else:  # the stream asks pgoutput for text format only
                        raise ValueError(
                            f"log offset {off}: a binary-format value in {self.table_id}'s event, which the log never holds"
                        )
                yield (off, lsn, seq, op, key, vals, unch, ts)
        finally:
            conn.close()
