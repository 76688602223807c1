"""`cdc log read`: the log as JSON lines, in source commit order across tables."""

from __future__ import annotations

import heapq
import shlex
from collections.abc import Iterator

import orjson

from cdc.envelope import EnvelopeRenderer
from cdc.ground.config import Pipeline
from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName, TableSelector
from cdc.log import open_log


def _not_in_log(pipeline: Pipeline, table: str) -> UsageError:
    snapshot = pipeline.command("snapshot", "--tables", shlex.quote(table))
    return UsageError(
        f"--table: {table} is not in the log",
        f"`cdc status` lists the tables the log holds; to add it, name it in the pipeline file's tables and run `{snapshot}`",
    )


def read_log(pipeline: Pipeline, table: str | None, limit: int | None, with_keys: bool) -> Iterator[str]:
    kafka = pipeline.log_config.kafka
    if kafka is not None and kafka.format == "debezium":
        raise UsageError(
            "`cdc log read` prints logs written by cdc; this pipeline's log is a Debezium connector's topics",
            "read them with any Kafka consumer (their records are the same envelope)",
        )
    if kafka is not None:
        yield from read_kafka_log(pipeline, table, limit, with_keys)
        return
    log = open_log(pipeline, readonly=True)
    try:
        cut = log.latest_cut()
        if cut is None:
            return
        ranges = dict(cut.tables)
        if table:
            try:
                sel = TableSelector.parse(table)
            except ValueError as exc:
                raise UsageError(f"--table: {exc}") from None
            ranges = {t: r for t, r in ranges.items() if sel.matches(t)}
            if not ranges:
                raise _not_in_log(pipeline, table)
        renderer = EnvelopeRenderer(log.meta("source_database") or "", pipeline.name)
        # Each table's events are in position order; merge them into one commit-ordered stream.
        merged = heapq.merge(
            *(
                (((rec.lsn, rec.seq, i, rec.offset), rec) for rec in log.read(t, rng.base - 1, rng.end))
                for i, (t, rng) in enumerate(sorted(ranges.items()))
            ),
            key=lambda item: item[0],
        )
        snapshot_rows: dict[TableName, int] = {}
        for count, (_, rec) in enumerate(merged):
            if limit is not None and count >= limit:
                return
            if with_keys:
                for record, key, value in renderer.records([rec]):
                    out = {"table": str(record.table), "offset": record.offset}
                    if record.op == "r":
                        # the local log stores a table's snapshot at one offset: say which row of it
                        out["row"] = snapshot_rows[record.table] = snapshot_rows.get(record.table, 0) + 1
                    yield orjson.dumps(out | {"key": _json(key), "value": _json(value)}).decode()
            else:
                yield renderer.value_json(rec).decode()
    finally:
        log.close()


def read_kafka_log(
    pipeline: Pipeline, table: str | None, limit: int | None, with_keys: bool
) -> Iterator[str]:
    """The topics up to the latest cut; records are already envelopes. Merged by position."""
    from kafka import TopicPartition

    from cdc.log.kafka.view import KafkaLogView

    view = KafkaLogView(pipeline)
    try:
        cut = view.latest_cut()
        if cut is None:
            return
        meta = view.cut_tables()
        names = sorted(meta)
        if table:
            try:
                sel = TableSelector.parse(table)
            except ValueError as exc:
                raise UsageError(f"--table: {exc}") from None
            names = [n for n in names if sel.matches(TableName.parse(n))]
            if not names:
                raise _not_in_log(pipeline, table)

        def records(name: str, i: int):
            m = meta[name]
            if m["end"] < m["base"]:
                return
            consumer = view.consumer
            tp = TopicPartition(m["topic"], 0)
            consumer.assign([tp])
            consumer.seek(tp, m["base"])
            while consumer.position(tp) <= m["end"]:
                for batch in consumer.poll(timeout_ms=10_000).values():
                    for rec in batch:
                        if rec.offset > m["end"]:
                            return
                        headers = dict(rec.headers or [])
                        pos = (int(headers.get("cdc.lsn", b"0")), int(headers.get("cdc.seq", b"0")))
                        yield (pos[0], pos[1], i, rec.offset), name, rec

        # Topics are small enough to merge one at a time in memory only for reading by people;
        # each topic is in position order already.
        streams = [list(records(n, i)) for i, n in enumerate(names)]
        for count, (_pos, name, rec) in enumerate(heapq.merge(*streams, key=lambda item: item[0])):
            if limit is not None and count >= limit:
                return
            value = orjson.loads(rec.value) if rec.value is not None else None
            if with_keys:
                yield orjson.dumps(
                    {"table": name, "offset": rec.offset, "key": orjson.loads(rec.key), "value": value}
                ).decode()
            elif value is not None:
                yield orjson.dumps(value).decode()
    finally:
        view.close()


def _json(encoded: bytes | None) -> orjson.Fragment | None:
    return None if encoded is None else orjson.Fragment(encoded)
