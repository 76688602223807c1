"""`cdc status`: how far the slot, the log and every follower are."""

from __future__ import annotations

import logging
import shlex
import time
from typing import Any

from cdc.ground.config import Pipeline, SinkConfig, pipeline_tables, sink_tables
from cdc.ground.errors import CdcError, ExitCode
from cdc.ground.lsn import format_lsn
from cdc.ground.tables import TableName
from cdc.log import open_log_view
from cdc.log.base import Cut
from cdc.rebase import load_states
from cdc.source import connect, current_wal_lsn, slot_state
from pipelines.checkpoints import Checkpoint, load_checkpoint
from pipelines.ddl import describe as describe_ddl
from pipelines.follower_errors import last_error
from pipelines.selfcheck import check_follower, self_check_line, without_lost
from pipelines.status_iceberg import iceberg_cut, iceberg_cut_line

logger = logging.getLogger(__name__)


def collect_status(pipeline: Pipeline) -> dict[str, Any]:
    data: dict[str, Any] = {
        "pipeline": pipeline.name,
        "slot": pipeline.slot,
        "publication": pipeline.publication,
    }
    source_lsn = None
    try:
        conn = connect(pipeline.source.postgres.dsn, application_name="cdc status")
        try:
            source_lsn = current_wal_lsn(conn)
            state = slot_state(conn, pipeline.slot)
            ddl_line, ddl_fix = describe_ddl(conn, pipeline)  # with or without the DDL trigger
        finally:
            conn.close()
        data["source"] = {
            "current_wal_lsn": format_lsn(source_lsn),
            "ddl_capture": {"line": ddl_line, "fix": ddl_fix},
        }
        if state is None:
            data["source"]["slot"] = None
        else:
            data["source"]["slot"] = {
                "confirmed_flush_lsn": format_lsn(state["confirmed_flush_lsn"])
                if state["confirmed_flush_lsn"]
                else None,
                "lag_bytes": state["lag_bytes"],
                "retained_wal_bytes": state["retained_wal_bytes"],
                "active_pid": state["active_pid"],
                "wal_status": state["wal_status"],
            }
    except CdcError as exc:
        data["source"] = {"error": exc.problem}

    log_info: dict[str, Any] = {"kind": "kafka" if pipeline.log_config.kafka else "local"}
    cut = None
    log_id, log_tables = "", None  # for the followers' self-check
    try:
        log = open_log_view(pipeline)
        try:
            log_id, log_tables = getattr(log, "log_id", ""), [t.table for t in log.tables()]
            cut = log.latest_cut()
            position = log.stream_position()
            log_info["stream_position"] = format_lsn(position[1]) if position else None
            log_info["cut"] = (
                {"id": cut.id, "lsn": format_lsn(cut.lsn), "age_s": round(time.time() - cut.ts_ms / 1000, 1)}
                if cut
                else None
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
            if hasattr(log, "retention"):  # local: the oldest cut kept, and the bound's alarm
                log_info["cut_retention"] = log.retention()
        finally:
            log.close()
    except CdcError as exc:
        log_info["error"] = exc.problem
    data["log"] = log_info

    followers = []
    for sink in pipeline.sinks:
        entry: dict[str, Any] = {"sink": sink.name, "kind": sink.kind}
        failing = last_error(pipeline.state_path, sink.name)
        if failing is not None:  # its last apply round failed: what, and since when
            entry["last_error"] = {
                k: failing.get(k) for k in ("problem", "fix", "since_ms", "last_ms", "count")
            }
        try:
            ckpt = load_checkpoint(pipeline.state_path, sink.name, pipeline.file)
        except CdcError as exc:  # one unreadable checkpoint: that follower says so, the others are shown
            followers.append(entry | {"error": exc.problem, "fix": exc.fix})
            continue
        if ckpt.cut_id == 0:
            entry["position"] = None
        else:
            entry["position"] = format_lsn(ckpt.lsn)
            entry["cut_id"] = ckpt.cut_id
            entry["applied_age_s"] = round(time.time() - ckpt.ts_ms / 1000, 1) if ckpt.ts_ms else None
            if cut is not None:
                entry["lag_bytes_behind_log"] = max(0, cut.lsn - ckpt.lsn)
        check: dict[str, Any] = {}
        if ckpt.cut_id and log_tables is not None:  # does the engine still hold what it applied?
            check = check_follower(pipeline, sink, ckpt, log_id, log_tables)
            if check:
                entry["self_check"] = check
        if cut is not None and "error" not in log_info:
            # a follower that lost tables is behind by their whole backlog (what the rebuild applies)
            entry.update(
                follower_lag(
                    pipeline, sink, without_lost(ckpt, check["lost"]) if "lost" in check else ckpt, cut
                )
            )
        if ckpt.cut_id and sink.kind == "iceberg":  # each table's snapshot at the recorded cut
            entry["iceberg_cut"] = iceberg_cut(pipeline, sink)
        if ckpt.pending:
            entry["pending_cut"] = ckpt.pending.get("cut_id")
        if ckpt.lost:
            entry["lost"] = ckpt.lost
        followers.append(entry)
    data["followers"] = followers
    # tables re-based (or to be re-based) because their rows changed without change events
    data["rebases"] = load_states(pipeline.state_path)
    from pipelines.serve.registry import running_servers  # `cdc serve` processes of this pipeline

    data["servers"] = running_servers(pipeline.state_path)
    return data


def pending_ranges(
    sink: SinkConfig, ckpt: Checkpoint, cut: Cut, pipeline: Pipeline | None = None
) -> dict[TableName, tuple[int, int]]:
    """Per table the sink follows: the offsets (after, upto] of the latest cut it has not applied.
    Only the sink's own `tables:` count (a cache of one table is not behind on the others), and
    only tables the pipeline file still names (the log may hold more; `cdc apply` leaves them
    alone); a table it never applied, or whose base changed, is pending from its base (as
    `cdc apply` reads it)."""
    out = {}
    tables = list(cut.tables) if pipeline is None else pipeline_tables(pipeline, list(cut.tables))
    for table in sink_tables(sink, tables):
        rng = cut.tables[table]
        prev = ckpt.tables.get(str(table))
        after = prev[1] if prev and prev[0] == rng.base else rng.base - 1
        if rng.end > after:
            out[table] = (after, rng.end)
    return out


def _first_commit_ms(log: Any, table: TableName, after: int, upto: int) -> int | None:
    if hasattr(log, "first_commit_ms"):  # kafka
        return log.first_commit_ms(table, after, upto)
    if hasattr(log, "read"):  # local: records in offset order, read lazily
        rec = next(iter(log.read(table, after, upto)), None)
        return rec.commit_ts // 1000 if rec is not None and rec.commit_ts else None
    return None


def follower_lag(pipeline: Pipeline, sink: SinkConfig, ckpt: Checkpoint, cut: Cut) -> dict[str, Any]:
    """events_behind_log: events of the sink's tables up to the latest cut not applied yet (for a
    follower that never applied: its whole backlog). lag_s: seconds since the source committed the
    oldest of them (0 when none is pending; snapshot rows: since their snapshot started; None when
    the log cannot say)."""
    if ckpt.cut_id == cut.id and not ckpt.pending:  # at the latest cut: it applied all of it
        return {"events_behind_log": 0, "lag_s": 0.0}
    pending = pending_ranges(sink, ckpt, cut, pipeline)
    if not pending:
        return {"events_behind_log": 0, "lag_s": 0.0}
    # kafka: offsets (compaction gaps make it an upper bound); local: events, snapshot rows one by one
    behind = sum(upto - after for after, upto in pending.values())
    oldest: int | None = None
    unknown = False
    try:
        log = open_log_view(pipeline)
        try:
            if hasattr(log, "events_between"):
                behind = sum(log.events_between(t, after, upto) for t, (after, upto) in pending.items())
            for table, (after, upto) in pending.items():
                ms = _first_commit_ms(log, table, after, upto)
                unknown = unknown or ms is None  # a pending record without a time: the oldest is unknown
                if ms is not None:
                    oldest = ms if oldest is None else min(oldest, ms)
        finally:
            log.close()
    except CdcError:
        unknown = True
    lag = None if unknown or oldest is None else round(max(0.0, time.time() - oldest / 1000), 1)
    return {"events_behind_log": behind, "lag_s": lag}


def _rebase_line(table: str, r: dict[str, Any], snapshot_cmd: str) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r.get("updated_ms", 0) / 1000))
    state = r.get("state")
    if state == "done":
        return f"re-base of {table}: done at {r.get('lsn')} ({r.get('rows', 0):,} rows, {when}); reason: {r.get('reason')}"
    if state == "running":
        return f"re-base of {table}: running since {when} (followers rebuild the table when it is done); reason: {r.get('reason')}"
    fix = (
        r.get("fix")
        or f"run `{snapshot_cmd} --tables {shlex.quote(table)}` (or `cdc stream`, which re-bases by itself)"
    )
    what = f"FAILED: {r.get('error')}" if state == "failed" else "NEEDED: followers may be stale"
    return f"re-base of {table}: {what} ({when}); reason: {r.get('reason')}; fix: {fix}"


def _lost_line(sink: str, lost: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(lost.get("ts_ms", 0) / 1000))
    what = ", ".join(f"{t} ({why})" for t, why in sorted(lost.get("tables", {}).items()))
    if lost.get("action") == "rebuilt":
        return f"follower {sink} lost data at {when}: {what}; rebuilt from the log's base"
    return (
        f"follower {sink} LOST DATA at {when}: {what}; apply stopped (on_lost: stop); fix: {lost.get('fix')}"
    )


def print_status(data: dict[str, Any], snapshot_cmd: str = "cdc snapshot PIPELINE") -> None:
    """`snapshot_cmd`: `cdc snapshot <pipeline file>`, so the fix hints run as printed."""
    logger.info(f"pipeline {data['pipeline']} (slot {data['slot']}, publication {data['publication']})")
    src = data.get("source", {})
    if "error" in src:
        logger.info(f"  source: unreachable: {src['error']}")
    else:
        slot = src.get("slot")
        if slot is None:
            logger.info(f"  source: at {src['current_wal_lsn']}, slot does not exist (run `{snapshot_cmd}`)")
        else:
            active = f"streaming (pid {slot['active_pid']})" if slot["active_pid"] else "not streaming"
            logger.info(
                f"  source: at {src['current_wal_lsn']}; slot confirmed {slot['confirmed_flush_lsn']}, "
                f"lag {slot['lag_bytes']:,} bytes, retains {slot['retained_wal_bytes']:,} bytes of WAL, {active}"
            )
        ddl = src.get("ddl_capture")
        if ddl:
            logger.info(f"  {ddl['line']}" + (f"\n    fix: {ddl['fix']}" if ddl["fix"] else ""))
    log = data["log"]
    if "error" in log:
        logger.info(f"  log ({log['kind']}): {log['error']}")
    else:
        cut = log.get("cut")
        logger.info(
            f"  log ({log['kind']}): "
            + (f"cut {cut['id']} at {cut['lsn']} ({cut['age_s']}s ago)" if cut else "empty")
        )
        for t in log.get("tables", []):
            logger.info(f"    {t['table']}: {t['state']}, offsets {t['base']}..{t['end']}")
        for line in retention_lines(log):
            logger.info(f"    {line}")
    for table, r in sorted(data.get("rebases", {}).items()):
        logger.info(f"  {_rebase_line(table, r, snapshot_cmd)}")
    for f in data["followers"]:
        if "error" in f:
            logger.info(
                f"  follower {f['sink']} ({f['kind']}): ERROR: {f['error']}"
                + (f"; fix: {f['fix']}" if f.get("fix") else "")
            )
            continue
        if f.get("lost"):
            logger.info(f"  {_lost_line(f['sink'], f['lost'])}")
        check_line = self_check_line(f)
        if check_line:
            logger.info(f"  {check_line}")
        if f.get("last_error"):
            logger.info(f"  {failing_line(f['sink'], f['last_error'])}")
        backlog = backlog_text(f)
        if f["position"] is None:
            logger.info(f"  follower {f['sink']} ({f['kind']}): never applied; {backlog}")
        else:
            logger.info(
                f"  follower {f['sink']} ({f['kind']}): at {f['position']} (cut {f['cut_id']}), {backlog}"
            )
        cut_line = iceberg_cut_line(f)
        if cut_line:
            logger.info(f"  {cut_line}")
    for srv in data.get("servers", []):
        logger.info(
            f"  serve: {srv['url']} (pid {srv['pid']}, {srv['tables']} table(s), since {_when(srv['started'] * 1000)})"
        )


def _when(ms: int) -> str:
    """A time in status lines: UTC, and how long ago."""
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))
    return f"{at}, {max(0.0, time.time() - ms / 1000):.0f}s ago"


def retention_lines(log: dict[str, Any]) -> list[str]:
    """The local log's cut retention: how far back a rewind reaches, and the bound's alarm."""
    kept = log.get("cut_retention") or {}
    lines = []
    oldest = kept.get("oldest_cut")
    if oldest:
        lines.append(
            f"cuts kept from cut {oldest['id']} ({_when(oldest['ts_ms'])}): `cdc reset --to-cut` reaches back that far"
        )
    alarm = kept.get("alarm")
    if alarm:
        who = ", ".join(f"{f} at cut {c}" for f, c in alarm["followers"].items())
        lines.append(
            f"CUT RETENTION BOUND REACHED ({_when(alarm['ts_ms'])}): cuts below {alarm['below']} are gone"
            f" although {who} needed them; fix: raise log.local.held_cuts_max / held_cuts_max_age_s,"
            " or rebuild that follower (`cdc reset PIPELINE --sink NAME --rebuild --yes`)"
        )
    return lines


def failing_line(sink: str, err: dict[str, Any]) -> str:
    """A follower whose last apply round failed: the error and since when."""
    fix = f"; fix: {err['fix']}" if err.get("fix") else ""
    return (
        f"follower {sink} FAILING since {_when(err['since_ms'])} ({err['count']} failed round(s), the last"
        f" {_when(err['last_ms'])}): {err['problem']}{fix}"
    )


def status_exit(data: dict[str, Any]) -> int:
    """4 when a follower's checkpoint cannot be read, 1 when a follower lost data it had applied
    (found by the self-check; the next apply rebuilds it), else 0."""
    if any("error" in f for f in data["followers"]):
        return int(ExitCode.RUNTIME)
    if any((f.get("self_check") or {}).get("lost") for f in data["followers"]):
        return int(ExitCode.DIFFERENCE)
    return int(ExitCode.OK)


def backlog_text(f: dict[str, Any]) -> str:
    """A follower's backlog in words: up to date, or how many events and how old the oldest."""
    behind = f.get("events_behind_log")
    lag = f.get("lag_s")
    if behind is None:
        return "? events behind the log"
    if behind == 0:
        return "up to date with the log"
    when = f"oldest committed {lag:g}s ago" if lag is not None else "time of the oldest not known"
    what = "events to apply" if f.get("position") is None else "events behind the log"
    return f"{behind:,} {what} ({when})"
