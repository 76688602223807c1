"""The capture benchmark's side-by-side table, chart rows and verdict lines."""

from __future__ import annotations

from typing import Any

from harness.report import Report, fmt_int, fmt_mb, fmt_pct

COLUMNS = ("wall s", "runs", "CPU s", "PG CPU s", "peak RSS")


def _cells(m: dict[str, Any]) -> dict[str, str]:
    runs = m.get("runs_s") or []
    spread = f"{min(runs):.2f}-{max(runs):.2f}s" if len(runs) > 1 else ""
    return {
        "wall_s": f"{m['wall_s']:.2f}",
        "runs": spread,
        "CPU_s": f"{m['cpu_s']:.1f}",
        "PG_CPU_s": f"{m['server_cpu_s']:.1f}",
        "peak_RSS": fmt_mb(m.get("peak_rss_bytes")),
    }


def summary(r: dict[str, Any]) -> Report:
    rep = Report("Capture: cdc next to PostgreSQL's own tools (bench/capture.py)", COLUMNS)
    cfg = r["config"]
    rep.subtitle = (
        f"{cfg['rows']:,} rows/changes, median of {cfg['repeat']} run(s),"
        f" PostgreSQL durable={cfg['durable']}, {cfg['postgres'].split(' on ')[0]}"
    )
    s, sn, b = r.get("stream"), r.get("snapshot"), r.get("big_txn")
    if s:
        recv, c, n = s["pg_recvlogical"], s["cdc_stream"], s["cdc_stream_sync_normal"]
        rep.add(
            "stream",
            "pg_recvlogical",
            recv["events_per_s"],
            "events/s",
            role="ceiling",
            ratio=1.0,
            notes=f"{fmt_int(recv['messages_per_s'])} msg/s",
            **_cells(recv),
        )
        rep.add(
            "stream",
            "cdc stream",
            c["events_per_s"],
            "events/s",
            ratio=s["ratio"],
            notes=f"log {fmt_mb(c['log_bytes'])} ({c['log_bytes_per_event']:.0f} B/event)",
            **_cells(c),
        )
        rep.add(
            "stream",
            "cdc stream, log sync=normal",
            n["events_per_s"],
            "events/s",
            role="diag",
            ratio=s["ratio_sync_normal"],
            notes="no fsync per log commit",
            **_cells(n),
        )
        ok = "meets the 50% target" if s["ratio"] >= 0.5 else "BELOW the 50% target"
        rep.summary.append(
            f"stream: pg_recvlogical {fmt_int(recv['events_per_s'])} ev/s | cdc stream {fmt_int(c['events_per_s'])}"
            f" ev/s | {fmt_pct(s['ratio'])} ({ok}); cdc peak RSS {fmt_mb(c['peak_rss_bytes'])}, log {fmt_mb(c['log_bytes'])}"
        )
    if sn:
        copy = sn["copy"]
        rep.add(
            "snapshot",
            "psql COPY",
            copy["rows_per_s"],
            "rows/s",
            role="ceiling",
            ratio=1.0,
            notes=f"heap {fmt_mb(sn['heap_bytes'])}",
            **_cells(copy),
        )
        for label, m in sn["cdc_snapshot"].items():
            rep.add(
                "snapshot",
                f"cdc snapshot {label}",
                m["rows_per_s"],
                "rows/s",
                ratio=m["ratio"],
                notes=f"{m['workers']} worker(s), {m['chunks']} chunk(s), log {fmt_mb(m['log_bytes'])}",
                **_cells(m),
            )
        d = sn["cdc_snapshot"]["default"]
        ok = "meets the 60% target" if d["ratio"] >= 0.6 else "BELOW the 60% target"
        rep.summary.append(
            f"snapshot: psql COPY {fmt_int(copy['rows_per_s'])} rows/s | cdc snapshot {fmt_int(d['rows_per_s'])} rows/s"
            f" | {fmt_pct(d['ratio'])} ({ok}; default = {d['workers']} worker(s))"
        )
        ch = sn["cdc_snapshot"].get("chunked")
        if ch:
            ok = "meets the 60% target" if ch["ratio"] >= 0.6 else "BELOW the 60% target"
            rep.summary.append(
                f"chunked snapshot: {fmt_int(ch['rows_per_s'])} rows/s in {ch['chunks']} chunk(s) | {fmt_pct(ch['ratio'])} of"
                f" psql COPY ({ok})"
            )
    if b:
        recv, c = b["pg_recvlogical"], b["cdc_stream"]
        rep.add(
            "one big transaction",
            "pg_recvlogical",
            recv["events_per_s"],
            "events/s",
            role="ceiling",
            ratio=1.0,
            **_cells(recv),
        )
        rep.add(
            "one big transaction",
            "cdc stream",
            c["events_per_s"],
            "events/s",
            ratio=b["ratio"],
            notes=f"log +{fmt_mb(c['log_growth_bytes'])}",
            **_cells(c),
        )
        small = f" (with 1000-change transactions: {fmt_mb(s['cdc_stream']['peak_rss_bytes'])})" if s else ""
        rep.summary.append(
            f"big txn: pg_recvlogical {fmt_int(recv['events_per_s'])} ev/s | cdc stream {fmt_int(c['events_per_s'])}"
            f" ev/s | {fmt_pct(b['ratio'])}; cdc peak RSS {fmt_mb(c['peak_rss_bytes'])}{small}"
        )
    return rep
