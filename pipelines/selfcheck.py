"""`cdc status`'s self-check of each follower: does the engine still hold what its checkpoint says
it applied? The same check `cdc apply` runs (sinks/marker.py why_lost), here without Spark: each
sink kind reads its tables and markers with the engine's own client (Redis, tantivy's files,
OpenSearch), for Delta the table's `_delta_log` files (sinks/delta/logfiles.py), for Iceberg the
catalog and the tables' metadata with pyiceberg (sinks/iceberg/catalogread.py).

A follower found to have lost data is reported with the fix, and `cdc status` exits 1; the next
`cdc apply` rebuilds it (`on_lost: rebuild`) or stops with the remedy (`on_lost: stop`).
"""

from __future__ import annotations

from typing import Any

from cdc.ground.config import VIEW_SCHEMA, Pipeline, SinkConfig, pipeline_tables, sink_tables, sink_views
from cdc.ground.errors import CdcError
from cdc.ground.secrets import redact
from cdc.ground.tables import TableName
from pipelines.checkpoints import Checkpoint
from sinks.marker import Marker, why_lost
from sinks.registry import make_sink


def held_tables(
    pipeline: Pipeline, sink_cfg: SinkConfig, ckpt: Checkpoint, log_tables: list[TableName]
) -> list[TableName]:
    """The tables (and view tables) the sink follows that its checkpoint says it applied."""
    tables = sink_tables(sink_cfg, pipeline_tables(pipeline, log_tables))
    views = [TableName(VIEW_SCHEMA, v) for v in sink_views(sink_cfg)]
    return [t for t in [*tables, *views] if str(t) in ckpt.tables]


def check_follower(
    pipeline: Pipeline, sink_cfg: SinkConfig, ckpt: Checkpoint, log_id: str, log_tables: list[TableName]
) -> dict[str, Any]:
    """{"lost": {table: why}, "fix": ...} when the engine lost applied data; {"not_checked": why} when
    the engine could not be read; {} when every applied table is there with its marker."""
    held = held_tables(pipeline, sink_cfg, ckpt, log_tables)
    if not held:
        return {}
    sink = None
    try:
        sink = make_sink(sink_cfg, pipeline, None)  # type: ignore[arg-type]  # no session: engine clients only
        if not sink.reads_without_spark:
            return {"not_checked": f"a {sink_cfg.kind} follower is checked by `cdc apply` only"}
        sink.log_id = log_id
        lost = {}
        for table in held:
            expected = None
            if sink.markers and ckpt.markers:
                base, end = ckpt.tables[str(table)]
                written = ckpt.written.get(str(table))
                expected = Marker(pipeline.name, sink_cfg.name, log_id, base, end, written)
            why = why_lost(sink, table, expected)
            if why is not None:
                lost[str(table)] = why
    except CdcError as exc:  # the engine is down or refuses: said, not taken for a loss
        return {"not_checked": exc.problem}
    except Exception as exc:  # an engine file this reader cannot parse: the apply's own check still runs
        return {"not_checked": redact(f"{type(exc).__name__}: {exc}")}
    finally:
        close = getattr(sink, "close", None)  # the Redis sink's connection
        if callable(close):
            close()
    if not lost:
        return {}
    apply = pipeline.command("apply", "--once", "--sink", sink_cfg.name)
    if sink_cfg.on_lost == "stop":
        reset = pipeline.command("reset", "--sink", sink_cfg.name, "--rebuild", "--yes")
        fix = f"rebuild it from the log's base: `{reset}`, then `{apply}` (on_lost: stop)"
    else:
        fix = (
            f"run `{apply}`: it rebuilds the lost tables from the log's base (a running cdc run, or cdc apply without --once, "
            "does so by itself within spark.follower_check_interval_s)"
        )
    return {"lost": lost, "fix": fix}


def without_lost(ckpt: Checkpoint, lost: dict[str, str]) -> Checkpoint:
    """The checkpoint as the rebuild will start from: the lost tables from their base (so the
    backlog `cdc status` shows is what the rebuild applies)."""
    from dataclasses import replace

    return replace(ckpt, cut_id=-1, tables={k: v for k, v in ckpt.tables.items() if k not in lost})


def self_check_line(f: dict[str, Any]) -> str | None:
    """The follower's self-check (pipelines/selfcheck.py) in words; None when it found all there."""
    check = f.get("self_check") or {}
    if check.get("lost"):
        what = ", ".join(f"{t} ({why})" for t, why in sorted(check["lost"].items()))
        return f"follower {f['sink']} LOST DATA it had applied (found now): {what}; fix: {check['fix']}"
    if check.get("not_checked"):
        return f"follower {f['sink']}: its engine was not checked: {check['not_checked']}"
    return None
