"""`cdc status` of an Iceberg follower, beyond what every follower shows: the latest cut recorded in
`<warehouse>/_cdc_cuts` and each table's Iceberg snapshot id at it (sinks/iceberg/cuts.py), read
with delta-rs (no JVM). The snapshot ids are what a reader pins to read every table at that cut."""

from __future__ import annotations

from typing import Any

from cdc.ground.config import Pipeline, SinkConfig
from cdc.ground.lsn import format_lsn
from cdc.ground.secrets import redact


def iceberg_cut(pipeline: Pipeline, sink: SinkConfig) -> dict[str, Any]:
    """{"cut_id", "position", "snapshots": {table: snapshot id}} of the latest recorded cut, or
    {"error": why} when none is recorded or the record cannot be read."""
    from sinks.iceberg.catalog import warehouse
    from sinks.iceberg.cuts import cut_record
    from sinks.iceberg.settings import iceberg_settings

    try:
        record = cut_record(warehouse(iceberg_settings(sink), pipeline))
    except Exception as exc:  # no cut recorded (a UsageError) or an unreadable record: said, not fatal
        problem = getattr(exc, "problem", None) or f"{type(exc).__name__}: {exc}"
        return {"error": redact(str(problem))}
    return {
        "cut_id": record.cut_id,
        "position": format_lsn(record.lsn),
        "snapshots": dict(sorted(record.versions.items())),
    }


def iceberg_cut_line(f: dict[str, Any]) -> str | None:
    """The recorded cut in words (None for another kind of follower)."""
    rec = f.get("iceberg_cut")
    if rec is None:
        return None
    if "error" in rec:
        return f"follower {f['sink']} (iceberg): no recorded cut read: {rec['error']}"
    tables = ", ".join(f"{t} {s}" for t, s in rec["snapshots"].items()) or "none"
    return (
        f"follower {f['sink']} (iceberg): tables at cut {rec['cut_id']} ({rec['position']}), "
        f"snapshot ids (-1: empty): {tables}"
    )
