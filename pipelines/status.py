"""`cdc status`: how far the slot, the log and every follower are."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cdc.log import open_log_view
from cdc.lsn import format_lsn
from cdc.source import connect, current_wal_lsn, slot_state
from pipelines.checkpoints import load_checkpoint
from pipelines.config import Pipeline
from pipelines.errors import CdcError


def collect_status(pipeline: Pipeline) -> dict[str, Any]:
    data: dict[str, Any] = {"pipeline": pipeline.name, "slot": pipeline.slot, "publication": pipeline.publication}
    source_lsn = None
    try:
        conn = connect(pipeline.source.postgres.dsn, application_name="cdc status")
        try:
            source_lsn = current_wal_lsn(conn)
            state = slot_state(conn, pipeline.slot)
        finally:
            conn.close()
        data["source"] = {"current_wal_lsn": format_lsn(source_lsn)}
        if state is None:
            data["source"]["slot"] = None
        else:
            data["source"]["slot"] = {
                "confirmed_flush_lsn": format_lsn(state["confirmed_flush_lsn"]) if state["confirmed_flush_lsn"] else None,
                "lag_bytes": state["lag_bytes"],
                "retained_wal_bytes": state["retained_wal_bytes"],
                "active_pid": state["active_pid"],
                "wal_status": state["wal_status"],
            }
    except CdcError as exc:
        data["source"] = {"error": exc.problem}

    log_info: dict[str, Any] = {"kind": "kafka" if pipeline.log_config.kafka else "local"}
    cut = None
    try:
        log = open_log_view(pipeline)
        try:
            cut = log.latest_cut()
            position = log.stream_position()
            log_info["stream_position"] = format_lsn(position[1]) if position else None
            log_info["cut"] = (
                {"id": cut.id, "lsn": format_lsn(cut.lsn), "age_s": round(time.time() - cut.ts_ms / 1000, 1)} if cut else None
            )
            tables = []
            for t in log.tables():
                rng = cut.tables.get(t.table) if cut else None
                tables.append(
                    {
                        "table": str(t.table),
                        "state": t.state,
                        "base": t.base,
                        "end": rng.end if rng else None,
                        "snapshot_lsn": format_lsn(t.snapshot_lsn) if t.snapshot_lsn else None,
                    }
                )
            log_info["tables"] = tables
        finally:
            log.close()
    except CdcError as exc:
        log_info["error"] = exc.problem
    data["log"] = log_info

    followers = []
    for sink in pipeline.sinks:
        ckpt = load_checkpoint(pipeline.state_path, sink.name)
        entry: dict[str, Any] = {"sink": sink.name, "kind": sink.kind}
        if ckpt.cut_id == 0:
            entry["position"] = None
        else:
            entry["position"] = format_lsn(ckpt.lsn)
            entry["cut_id"] = ckpt.cut_id
            entry["applied_age_s"] = round(time.time() - ckpt.ts_ms / 1000, 1) if ckpt.ts_ms else None
            if cut is not None:
                entry["lag_bytes_behind_log"] = max(0, cut.lsn - ckpt.lsn)
                entry["events_behind_log"] = sum(
                    max(0, rng.end - (ckpt.tables.get(str(t), [0, 0])[1] if ckpt.tables.get(str(t), [None])[0] == rng.base else rng.base - 1))
                    for t, rng in cut.tables.items()
                )
        if ckpt.pending:
            entry["pending_cut"] = ckpt.pending.get("cut_id")
        followers.append(entry)
    data["followers"] = followers
    return data


def print_status(data: dict[str, Any], say: Callable[[str], None]) -> None:
    say(f"pipeline {data['pipeline']} (slot {data['slot']}, publication {data['publication']})")
    src = data.get("source", {})
    if "error" in src:
        say(f"  source: unreachable: {src['error']}")
    else:
        slot = src.get("slot")
        if slot is None:
            say(f"  source: at {src['current_wal_lsn']}, slot does not exist (run `cdc snapshot`)")
        else:
            active = f"streaming (pid {slot['active_pid']})" if slot["active_pid"] else "not streaming"
            say(
                f"  source: at {src['current_wal_lsn']}; slot confirmed {slot['confirmed_flush_lsn']}, "
                f"lag {slot['lag_bytes']:,} bytes, retains {slot['retained_wal_bytes']:,} bytes of WAL, {active}"
            )
    log = data["log"]
    if "error" in log:
        say(f"  log ({log['kind']}): {log['error']}")
    else:
        cut = log.get("cut")
        say(f"  log ({log['kind']}): " + (f"cut {cut['id']} at {cut['lsn']} ({cut['age_s']}s ago)" if cut else "empty"))
        for t in log.get("tables", []):
            say(f"    {t['table']}: {t['state']}, offsets {t['base']}..{t['end']}")
    for f in data["followers"]:
        if f["position"] is None:
            say(f"  follower {f['sink']} ({f['kind']}): never applied")
        else:
            behind = f.get("events_behind_log")
            say(
                f"  follower {f['sink']} ({f['kind']}): at {f['position']} (cut {f['cut_id']}), "
                f"{behind if behind is not None else '?'} events behind the log"
            )
