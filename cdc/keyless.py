"""What a keyless table can be followed by (docs/keyless-tables.md).

Two kinds: insert-only (default replica identity) and multiset (REPLICA IDENTITY FULL: updates and
deletes carry the whole old row, so a row is identified by its content). Both are keyed in the log by
each change's position (commit LSN, sequence), which only some followers can use: a Delta or an
Iceberg table in mode scd1 holds either (for a multiset table a delete removes one row of the deleted
content: sinks/multiset.py), a search index appends inserted rows (identified by the position) but
cannot remove one of two identical rows, SCD2 keeps versions of keyed rows, and the cache keeps one
entry per key of the row's own, looked up by it. Our Kafka log keys a keyless table's records by position
too (cdc/envelope.py), so its compacted topics keep every one; a Debezium connector's topics
(`format: debezium`) key them by nothing (null keys), which the Debezium reader cannot tell apart.
Those are refused before anything starts.
"""

from __future__ import annotations

from typing import Any

from cdc.ground.config import sink_tables
from cdc.source import CheckReport, Problem


def keyless_problems(pipeline: Any, report: CheckReport) -> list[Problem]:
    insert_only = [t.table for t in report.tables if t.insert_only]
    multiset = [t.table for t in report.tables if t.multiset]
    keyless = insert_only + multiset
    if not keyless:
        return []
    problems = []
    kafka = pipeline.log_config.kafka
    if kafka is not None and kafka.format == "debezium":
        names = ", ".join(map(str, keyless))
        problems.append(
            Problem(
                f"{names} {'have' if len(keyless) > 1 else 'has'} no primary key, which the Debezium topics cannot "
                "follow (Debezium writes such a table's records with a null key, so the reader has nothing to tell "
                "its rows apart by)",
                "capture it with `cdc stream` (log: kafka with format: cdc, or the local log), leave it out of "
                f"source.postgres.tables, or give it a primary key: ALTER TABLE {keyless[0]} ADD PRIMARY KEY (...);",
            )
        )
    for sink in pipeline.sinks:
        if sink.kind in ("delta", "iceberg") and sink.settings.mode == "scd2":
            for table in sink_tables(sink, keyless):
                how = "insert-only" if table in insert_only else "as a multiset of rows identified by content"
                problems.append(
                    Problem(
                        f"sink {sink.name} ({sink.kind}, mode scd2) cannot follow {table}: it has no primary key, so "
                        f"it is followed {how}, and SCD2 keeps versions of keyed rows",
                        f"follow {table} with {'an' if sink.kind == 'iceberg' else 'a'} {sink.kind} sink in mode scd1, or give it a primary key",
                    )
                )
            continue
        if sink.kind in ("delta", "iceberg"):  # both kinds, in mode scd1
            continue
        if sink.kind == "search":  # the position is the document id: inserts only
            for table in sink_tables(sink, multiset):
                problems.append(
                    Problem(
                        f"sink {sink.name} (search) cannot follow {table}: it has no primary key and REPLICA IDENTITY "
                        "FULL, so its updates and deletes name a row by content, and an index of documents keyed by "
                        "position cannot remove one of two identical rows",
                        f"follow {table} with a delta or iceberg sink, leave it out of the sink's tables, or give it a primary key: "
                        f"ALTER TABLE {table} ADD PRIMARY KEY (...);",
                    )
                )
            continue
        for table in sink_tables(sink, keyless):
            how = "insert-only" if table in insert_only else "as a multiset of rows identified by content"
            problems.append(
                Problem(
                    f"sink {sink.name} ({sink.kind}) cannot follow {table}: it has no primary key, so it is followed "
                    f"{how} and its rows have no key a {sink.kind} entry could be kept under",
                    f"leave {table} out of the sink's tables (a delta or iceberg sink follows it), or give it a primary key: "
                    f"ALTER TABLE {table} ADD PRIMARY KEY (...);",
                )
            )
    return problems
