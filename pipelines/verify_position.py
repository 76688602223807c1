"""Where a follower stands against the verification point for `cdc verify`: the captured changes
committed before it that the follower has not applied (in the log, and peeked from the slot for what is
not streamed yet), the keys or keyless rows the log changed at or after it (excused), and the columns the
follower has under another name or not yet (the log's schema history by attnum).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc.ground.lsn import format_lsn
from cdc.ground.tables import TableName
from cdc.log.base import Column, TableSchema
from cdc.log.history import History, position_in
from cdc.pgoutput import Begin, Relation, Truncate, decode
from cdc.source import publication_names
from cdc.source.slots import _slot
from pipelines.apply.readers import ChangeReader
from sinks.changes import typed_columns
from sinks.shaping import Shape, shape_rows


def follower_columns(
    history: History, follower_lsn: int, columns: tuple[Column, ...]
) -> dict[str, tuple[str | None, int | None]]:
    """Source columns (at the verification point, with their attnums) that a follower having applied
    the log up to `follower_lsn` has under another name or not at all, matched by attnum against
    the schema version it applied last (the newest one from at or before its position): name ->
    (the follower's name for it, None when it has not got it; the LSN of the log's first later
    version that brings the change, None when the log has not got the change yet)."""
    if not history:
        return {}
    applied = [i for i, (_v, since, _s) in enumerate(history) if since <= follower_lsn]
    at = applied[-1] if applied else 0
    have = history[at][2]
    out: dict[str, tuple[str | None, int | None]] = {}
    for c in columns:
        i = position_in(have, c)
        old = have.columns[i].name if i >= 0 else None
        if old == c.name:
            continue
        brings = next(
            (
                since
                for _v, since, schema in history[at + 1 :]
                if (j := position_in(schema, c)) >= 0 and schema.columns[j].name != old
            ),
            None,
        )
        out[c.name] = (old, brings)
    return out


def unstreamed_changes(
    conn, slot: str, publication: str, upto: int, after_commit: int, tables: set[TableName]
) -> int:
    """Changes to `tables` the slot still holds below `upto` (peeked, not consumed)."""
    rels: dict[int, TableName] = {}
    count = 0
    in_log = False
    with conn.cursor() as cur:
        cur.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL,"
            " 'proto_version', '1', 'publication_names', %s)",
            (slot, format_lsn(upto), publication),
        )
        for (data,) in cur:
            payload = bytes(data)
            kind = payload[:1]
            if kind == b"B":
                begin = decode(payload)
                assert isinstance(begin, Begin)
                in_log = begin.final_lsn <= after_commit  # already in the log
            elif kind == b"R":
                rel = decode(payload)
                assert isinstance(rel, Relation)
                rels[rel.relation_id] = TableName(rel.namespace, rel.name)
            elif kind in (b"I", b"U", b"D") and not in_log:
                relid = int.from_bytes(payload[1:5], "big")
                count += rels.get(relid) in tables
            elif kind == b"T" and not in_log:
                trunc = decode(payload)
                assert isinstance(trunc, Truncate)
                count += sum(rels.get(r) in tables for r in trunc.relation_ids)
    return count


def _pending(
    conn, pipeline, spark, log, reader: ChangeReader, ckpt, tables: list[TableName], point: int
) -> int:
    """Captured changes committed before `point` that the follower has not applied."""
    count = 0
    cut = log.latest_cut()
    for table in tables:
        rng = cut.tables.get(table)
        applied = ckpt.tables.get(str(table))
        if rng is None:
            continue
        after = applied[1] if applied and applied[0] == rng.base else rng.base - 1
        count += reader.count_events(spark, table, after, rng.end, point)
    position = log.stream_position()
    log_lsn = max(cut.lsn, position[1] if position else 0)
    if log_lsn < point:
        slot = _slot(conn, pipeline.slot)
        if slot is not None and slot[2] is None:
            count += unstreamed_changes(
                conn,
                pipeline.slot,
                publication_names(conn, pipeline.publication),
                point,
                position[0] if position else cut.lsn - 1,
                set(tables),
            )
        elif slot is not None:
            count += 1  # a stream holds the slot and has not reached the point yet: cannot rule anything out
    return count


def _history(log, table: TableName) -> History:
    """The log's schema versions of `table`, oldest first (none from a log that keeps no history)."""
    history = getattr(log, "schema_history", None)
    return history(table) if history is not None else []


def _keyless_after(
    spark,
    reader: ChangeReader,
    table: TableName,
    schema: TableSchema,
    point: int,
    upto: int,
    shape: Shape | None = None,
    kind: str = "pgtext",
) -> DataFrame | None:
    """A keyless table's logged rows at or after `point` (up to offset `upto`), typed (`kind`: the
    log's value_kind), with `__op` ('c'/'r' inserted, 'd' deleted: the whole deleted row); None if
    there are none. Each position once: a Kafka topic may hold a record twice (republished after a
    publisher crash), which followers apply once."""
    first = reader.first_offset_from(spark, table, point, upto)
    if first is None:
        return None
    raw = shape_rows(reader.read_changes(spark, table, first - 1, upto, schema), shape)
    schema = shape.schema if shape is not None else schema
    typed = typed_columns(schema, [F.col("vals")[i] for i in range(len(schema.columns))], kind)
    rows = raw.filter((F.col("op") != "t") & (F.col("lsn") >= point)).dropDuplicates(["lsn", "seq"])
    return rows.select(*(t.alias(n) for n, t, _ in typed), F.col("op").alias("__op"))


def _changed_after(
    spark,
    reader: ChangeReader,
    table: TableName,
    schema: TableSchema,
    point: int,
    upto: int,
    shape: Shape | None = None,
    kind: str = "pgtext",
) -> DataFrame | None:
    """Typed keys (`kind`: the log's value_kind) the log changed at or after `point` (up to offset
    `upto`); None if there are none. With the sink's shape, keys are as the follower has them (a
    hashed key column)."""
    first = reader.first_offset_from(spark, table, point, upto)
    if first is None:
        return None
    raw = shape_rows(reader.read_changes(spark, table, first - 1, upto, schema), shape)
    schema = shape.schema if shape is not None else schema
    key_schema = TableSchema(
        tuple(c for c in schema.columns if c.name in schema.key), schema.key, schema.types
    )
    idx = [schema.column_names.index(c.name) for c in key_schema.columns]
    typed = typed_columns(key_schema, [F.col("vals")[i] for i in idx], kind)
    return raw.filter(F.col("op") != "t").select(*(t.alias(n) for n, t, _ in typed)).distinct()
