"""`cdc log read`: the log as JSON lines, in source commit order across tables."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

import orjson

from cdc.envelope import EnvelopeRenderer
from cdc.log import open_log
from cdc.tables import TableSelector
from pipelines.config import Pipeline
from pipelines.errors import UsageError


def read_log(pipeline: Pipeline, table: str | None, limit: int | None, with_keys: bool) -> Iterator[str]:
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
                raise UsageError(f"--table: {table} is not in the log", "see `cdc status` for the tables the log holds")
        renderer = EnvelopeRenderer(log.meta("source_database") or "", pipeline.name)
        # Each table's events are in position order; merge them into one commit-ordered stream.
        merged = heapq.merge(
            *(
                (((rec.lsn, rec.seq, i, rec.offset), rec) for rec in log.read(t, rng.base - 1, rng.end))
                for i, (t, rng) in enumerate(sorted(ranges.items()))
            ),
            key=lambda item: item[0],
        )
        for count, (_, rec) in enumerate(merged):
            if limit is not None and count >= limit:
                return
            if with_keys:
                for record, key, value in renderer.records(iter([rec])):
                    yield orjson.dumps(
                        {"table": str(record.table), "offset": record.offset, "key": key, "value": value}
                    ).decode()
            else:
                yield orjson.dumps(renderer.value(rec)).decode()
    finally:
        log.close()
