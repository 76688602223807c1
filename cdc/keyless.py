"""What a keyless (insert-only) table can be followed by (README "Tables without a primary key").

Its rows are keyed in the log by their position (commit LSN, sequence), which only a follower that
appends can use: a Delta table, a search index (the position is the document id). The cache keeps
one entry per key of the row's own, looked up by it; the Kafka log's keys are the key columns as JSON (Debezium's form), which a keyless table does
not have, so a compacted topic would keep one row of it. Those are refused before anything starts.
"""

from __future__ import annotations

from typing import Any

from cdc.ground.config import sink_tables
from cdc.source import CheckReport, Problem


def keyless_problems(pipeline: Any, report: CheckReport) -> list[Problem]:
    keyless = [t.table for t in report.tables if t.insert_only]
    if not keyless:
        return []
    problems = []
    if pipeline.log_config.kafka is not None:
        names = ", ".join(map(str, keyless))
        problems.append(
            Problem(
                f"{names} {'have' if len(keyless) > 1 else 'has'} no primary key, which the Kafka log cannot hold yet "
                "(its record keys are the key columns, so a compacted topic would keep one row of the table)",
                f"use the local log (log: {{local: {{}}}}), or give each a primary key: ALTER TABLE {keyless[0]} ADD PRIMARY KEY (...);",
            )
        )
    for sink in pipeline.sinks:
        if sink.kind == "delta" and sink.settings.mode == "scd2":
            for table in sink_tables(sink, keyless):
                problems.append(
                    Problem(
                        f"sink {sink.name} (delta, mode scd2) cannot follow {table}: it has no primary key, so it is "
                        "followed insert-only, and SCD2 keeps versions of keyed rows",
                        f"follow {table} with a delta sink in mode scd1 (each inserted row is kept as it came: "
                        "its history already), or give it a primary key",
                    )
                )
            continue
        if sink.kind in ("delta", "search"):  # search: the position is the document id
            continue
        if sink.kind == "iceberg":
            for table in sink_tables(sink, keyless):
                problems.append(
                    Problem(
                        f"sink {sink.name} (iceberg) cannot follow {table} yet: it has no primary key, and the "
                        "Iceberg follower of keyless (insert-only) tables is not built and tested yet",
                        f"follow {table} with a delta sink, or leave it out of the sink's tables",
                    )
                )
            continue
        for table in sink_tables(sink, keyless):
            problems.append(
                Problem(
                    f"sink {sink.name} ({sink.kind}) cannot follow {table}: it has no primary key, so it is followed "
                    f"insert-only and its rows have no key a {sink.kind} entry could be kept under",
                    f"leave {table} out of the sink's tables (a delta sink follows it), or give it a primary key: "
                    f"ALTER TABLE {table} ADD PRIMARY KEY (...);",
                )
            )
    return problems
