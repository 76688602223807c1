"""`cdc status` on a terminal: the same facts as the plain lines (pipelines/status.py), as rich
tables, and `--watch` refreshing them in place until Ctrl-C.

The plain lines stay the output everywhere else (a pipe, a file, cron mail), so scripts that
read them and `--json` are not affected.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from pipelines.selfcheck import self_check_line
from pipelines.status import _lost_line, _rebase_line, backlog_text, failing_line, retention_lines
from pipelines.status_iceberg import iceberg_cut_line


def status_view(data: dict[str, Any], snapshot_cmd: str) -> RenderableType:
    parts: list[RenderableType] = [
        Text.assemble(
            ("pipeline ", "bold"),
            (data["pipeline"], "bold cyan"),
            f"  slot {data['slot']}, publication {data['publication']}",
            f"  ({time.strftime('%H:%M:%S')})",
        )
    ]
    parts.append(_source(data.get("source", {}), snapshot_cmd))
    parts.append(_log(data["log"]))
    for table, r in sorted(data.get("rebases", {}).items()):
        line = _rebase_line(table, r, snapshot_cmd)
        parts.append(Text(line, style="yellow" if r.get("state") in ("running", "done") else "bold red"))
    parts.append(_followers(data["followers"]))
    return Group(*parts)


def _source(src: dict[str, Any], snapshot_cmd: str) -> RenderableType:
    if "error" in src:
        return Text(f"source: unreachable: {src['error']}", style="bold red")
    table = Table(title="source", title_justify="left", expand=False)
    for column in ("WAL position", "slot confirmed", "lag bytes", "retained WAL bytes", "stream"):
        table.add_column(column, justify="right" if "bytes" in column else "left")
    slot = src.get("slot")
    if slot is None:
        table.add_row(src["current_wal_lsn"], Text("no slot", style="red"), "", "", f"run `{snapshot_cmd}`")
    else:
        active = (
            Text(f"streaming (pid {slot['active_pid']})", style="green")
            if slot["active_pid"]
            else Text("not streaming", style="yellow")
        )
        table.add_row(
            src["current_wal_lsn"],
            slot["confirmed_flush_lsn"] or "-",
            f"{slot['lag_bytes']:,}",
            f"{slot['retained_wal_bytes']:,}",
            active,
        )
    return table


def _log(log: dict[str, Any]) -> RenderableType:
    if "error" in log:
        return Text(f"log ({log['kind']}): {log['error']}", style="bold red")
    cut = log.get("cut")
    header = Text(
        f"log ({log['kind']}): "
        + (f"cut {cut['id']} at {cut['lsn']} ({cut['age_s']}s ago)" if cut else "empty"),
        style="italic",
    )
    kept = [Text(line, style="bold red" if "BOUND" in line else "italic") for line in retention_lines(log)]
    if not log.get("tables"):
        return Group(header, *kept) if kept else header
    table = Table()
    table.add_column("table")
    table.add_column("state")
    table.add_column("offsets", justify="right")
    for t in log["tables"]:
        table.add_row(t["table"], t["state"], f"{t['base']}..{t['end']}")
    return Group(header, table, *kept)


def _followers(followers: list[dict[str, Any]]) -> RenderableType:
    table = Table(title="followers", title_justify="left")
    for column in ("follower", "kind", "position", "cut", "backlog"):
        table.add_column(column)
    notes: list[RenderableType] = []
    for f in followers:
        if "error" in f:
            table.add_row(
                f["sink"], f["kind"], Text("ERROR", style="bold red"), "", Text(f["error"], style="red")
            )
            if f.get("fix"):
                notes.append(Text(f"follower {f['sink']}: fix: {f['fix']}", style="red"))
            continue
        if f.get("lost"):
            lost = f["lost"]
            notes.append(
                Text(
                    _lost_line(f["sink"], lost),
                    style="yellow" if lost.get("action") == "rebuilt" else "bold red",
                )
            )
        check_line = self_check_line(f)  # the follower's self-check (pipelines/selfcheck.py)
        if check_line:
            notes.append(Text(check_line, style="bold red" if "lost" in f["self_check"] else "yellow"))
        if f.get("last_error"):
            notes.append(Text(failing_line(f["sink"], f["last_error"]), style="bold red"))
        cut_line = iceberg_cut_line(f)  # each Iceberg table's snapshot at the recorded cut
        if cut_line:
            notes.append(Text(cut_line))
        backlog = backlog_text(f)
        style = "green" if f.get("events_behind_log") == 0 else "yellow"
        if f["position"] is None:
            table.add_row(
                f["sink"], f["kind"], Text("never applied", style="yellow"), "", Text(backlog, style=style)
            )
        else:
            table.add_row(f["sink"], f["kind"], f["position"], str(f["cut_id"]), Text(backlog, style=style))
    return Group(table, *notes) if notes else table


def watch(collect: Callable[[], dict[str, Any]], snapshot_cmd: str, every_s: float, console: Any) -> None:
    """Redraw the view every `every_s` seconds in place until Ctrl-C (then return: exit 0)."""
    from rich.live import Live

    with Live(status_view(collect(), snapshot_cmd), console=console, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(every_s)
                live.update(status_view(collect(), snapshot_cmd), refresh=True)
        except KeyboardInterrupt:
            pass
