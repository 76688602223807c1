"""The Prometheus endpoint of `cdc stream|apply|run|snapshot` (docs/monitoring.md).

Off unless `--metrics-port` or `metrics: {port: ...}` asks for it; binds 127.0.0.1 unless the
pipeline file names another `metrics.host`. One scrape returns:
* what this process recorded (cdc/metrics.py: stream counters, snapshot progress, apply stages);
* gauges read at scrape time from the source, the log and the checkpoints, as `cdc status` reads
  them (slot, latest cut, each follower's position and lag), so any of the verbs can report them;
* in `cdc run`, the stream child's own series, fetched from its private endpoint and merged in, so
  one port shows the whole pipeline (`pgcdc_up{component="stream"}` is 0 when the child does not answer).
"""

from __future__ import annotations

import logging
import socket
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from cdc import metrics
from cdc.ground.config import Pipeline
from cdc.ground.errors import UsageError
from cdc.ground.lsn import parse_lsn
from pipelines import endpoint

logger = logging.getLogger(__name__)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class StateCollector:
    """Source, slot, log and follower gauges, read when Prometheus scrapes (pipelines/status.py)."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline

    def describe(self) -> list[Metric]:
        return []  # do not read the source when registered

    def collect(self) -> Iterator[Metric]:
        from pipelines.status import collect_status

        p, slot = self.pipeline.name, self.pipeline.slot
        up = _gauge("pgcdc_source_up", "1 if the source answered this scrape's query", ["pipeline"])
        wal = _gauge("pgcdc_source_wal_lsn", "The source's current WAL position", ["pipeline"])
        confirmed = _gauge(
            "pgcdc_slot_confirmed_flush_lsn",
            "The slot's confirmed position (what the log holds durably)",
            ["pipeline", "slot"],
        )
        lag = _gauge(
            "pgcdc_slot_lag_bytes",
            "WAL bytes between the source's position and the slot's confirmed position",
            ["pipeline", "slot"],
        )
        retained = _gauge(
            "pgcdc_slot_retained_wal_bytes",
            "WAL bytes the slot keeps on the source's disk",
            ["pipeline", "slot"],
        )
        active = _gauge(
            "pgcdc_slot_active",
            "1 while a stream reads from the slot (0: no stream, or no slot)",
            ["pipeline", "slot"],
        )
        cut_id = _gauge("pgcdc_log_cut_id", "Id of the log's latest consistent cut", ["pipeline"])
        cut_lsn = _gauge(
            "pgcdc_log_cut_lsn", "Source position of the log's latest consistent cut", ["pipeline"]
        )
        f_lsn = _gauge(
            "pgcdc_follower_applied_lsn",
            "Source position of the cut the follower applied last",
            ["pipeline", "sink"],
        )
        f_cut = _gauge(
            "pgcdc_follower_applied_cut_id", "Id of the cut the follower applied last", ["pipeline", "sink"]
        )
        f_bytes = _gauge(
            "pgcdc_follower_lag_bytes",
            "WAL bytes the source wrote after the follower's applied position",
            ["pipeline", "sink"],
        )
        f_events = _gauge(
            "pgcdc_follower_lag_events",
            "Events of the follower's tables up to the latest cut not applied yet",
            ["pipeline", "sink"],
        )
        f_secs = _gauge(
            "pgcdc_follower_lag_seconds",
            "Seconds since the source committed the oldest event the follower has not applied (0: none)",
            ["pipeline", "sink"],
        )
        f_ok = _gauge(
            "pgcdc_follower_ok",
            "0 if the follower's checkpoint is unreadable or it stopped on lost data",
            ["pipeline", "sink"],
        )
        f_failing = _gauge(
            "pgcdc_follower_failing_since_timestamp_seconds",
            "Unix time the follower's current run of failed apply rounds began (0: its last round ended well)",
            ["pipeline", "sink"],
        )
        f_error = _gauge(
            "pgcdc_follower_last_error_timestamp_seconds",
            "Unix time of the follower's last failed apply round while it is failing (cdc status shows the error)",
            ["pipeline", "sink"],
        )
        held = _gauge(
            "pgcdc_log_cut_retention_alarm",
            "1 while the local log has dropped cuts a follower still needed (its retention bound was reached)",
            ["pipeline"],
        )
        oldest = _gauge(
            "pgcdc_log_oldest_cut_timestamp_seconds",
            "Unix time of the oldest cut the local log keeps (how far back `cdc reset --to-cut` reaches)",
            ["pipeline"],
        )
        try:
            data = collect_status(self.pipeline)
        except Exception as exc:  # a failed read must not fail the scrape (the process' own series stay)
            metrics.error(p, "metrics", exc)
            return
        src = data.get("source", {})
        source_lsn = None
        if "error" in src:
            up.add_metric([p], 0)
        else:
            up.add_metric([p], 1)
            source_lsn = parse_lsn(src["current_wal_lsn"])
            wal.add_metric([p], source_lsn)
            state = src.get("slot")
            active.add_metric([p, slot], 1 if state and state["active_pid"] else 0)
            if state:
                if state["confirmed_flush_lsn"]:
                    confirmed.add_metric([p, slot], parse_lsn(state["confirmed_flush_lsn"]))
                for family, key in ((lag, "lag_bytes"), (retained, "retained_wal_bytes")):
                    if state[key] is not None:
                        family.add_metric([p, slot], state[key])
        cut = data["log"].get("cut")
        if cut:
            cut_id.add_metric([p], cut["id"])
            cut_lsn.add_metric([p], parse_lsn(cut["lsn"]))
        kept = data["log"].get("cut_retention")
        if kept is not None:
            held.add_metric([p], 1 if kept.get("alarm") else 0)
            if kept.get("oldest_cut"):
                oldest.add_metric([p], kept["oldest_cut"]["ts_ms"] / 1000)
        for f in data["followers"]:
            sink = f["sink"]
            err = f.get("last_error")
            f_failing.add_metric([p, sink], err["since_ms"] / 1000 if err else 0)
            if err:
                f_error.add_metric([p, sink], err["last_ms"] / 1000)
            stopped = "error" in f or (f.get("lost") or {}).get("action") == "stopped"
            f_ok.add_metric([p, sink], 0 if stopped else 1)
            if "error" in f:
                continue
            if f.get("position") is not None:
                applied = parse_lsn(f["position"])
                f_lsn.add_metric([p, sink], applied)
                f_cut.add_metric([p, sink], f["cut_id"])
                if source_lsn is not None:
                    f_bytes.add_metric([p, sink], max(0, source_lsn - applied))
            if f.get("events_behind_log") is not None:
                f_events.add_metric([p, sink], f["events_behind_log"])
            if f.get("lag_s") is not None:
                f_secs.add_metric([p, sink], f["lag_s"])
        yield from (up, wal, confirmed, lag, retained, active, cut_id, cut_lsn)
        yield from (f_lsn, f_cut, f_bytes, f_events, f_secs, f_ok, f_failing, f_error, held, oldest)


class ChildCollector:
    """`cdc run`: the stream child's series, from its endpoint on 127.0.0.1."""

    def __init__(self, pipeline: Pipeline, port: int):
        self.pipeline = pipeline
        self.url = f"http://127.0.0.1:{port}/metrics"

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            with urllib.request.urlopen(self.url, timeout=5) as response:
                text = response.read().decode()
        except OSError:  # not started yet, or gone: the stream is down
            down = _gauge("pgcdc_up", "", ["pipeline", "component"])
            down.add_metric([self.pipeline.name, "stream"], 0)
            yield down
            return
        yield from text_string_to_metric_families(text)


class Merged:
    """Collectors whose families may share a name (pgcdc_up from here and from the child): one
    family per name and one sample per series, or Prometheus rejects the page. The same series
    from two processes (cdc run's snapshot here, a re-base's snapshot in the stream child) is
    added up for counters and histograms; for a gauge the later collector's (the child's) wins."""

    def __init__(self, collectors: list[Any]):
        self.collectors = collectors

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for collector in self.collectors:
            for family in collector.collect():
                if family.name not in families:
                    families[family.name] = family
                    continue
                merged = families[family.name]
                index = {(s.name, tuple(sorted(s.labels.items()))): i for i, s in enumerate(merged.samples)}
                for sample in family.samples:
                    i = index.get((sample.name, tuple(sorted(sample.labels.items()))))
                    if i is None:
                        merged.samples.append(sample)
                    elif merged.type in ("counter", "histogram", "summary"):
                        merged.samples[i] = merged.samples[i]._replace(
                            value=merged.samples[i].value + sample.value
                        )
                    else:
                        merged.samples[i] = sample
        yield from families.values()


def _in_use(host: str, port: int) -> bool:
    """Whether something already listens on host:port (a bind would fail)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the HTTP server binds: TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(
    pipeline: Pipeline,
    component: str,
    port: int | None,
    *,
    child_port: int | None = None,
    internal: bool = False,
    one_shot: bool = False,
) -> Iterator[int | None]:
    """Serve the metrics for the block when `port` (or the pipeline file's metrics.port) is set.
    `internal`: the private endpoint of `cdc run`'s stream child (no state gauges: the parent has them).
    `one_shot`: a verb that ends by itself (`snapshot`, `apply --once`, `stream --until`) beside a
    running `cdc run`, which holds the file's port: the file's port in use is skipped with a note
    (the running process serves the pipeline's gauges); only an explicit --metrics-port must bind."""
    metrics.started(pipeline.name, component)
    if (
        port is None
        and one_shot
        and pipeline.metrics.port is not None
        and _in_use(pipeline.metrics.host, pipeline.metrics.port)
    ):
        logger.info(
            f"metrics: port {pipeline.metrics.port} (metrics.port) is in use, by a running `cdc run` or `cdc stream`"
            " of this pipeline it seems: this command serves no metrics (pass --metrics-port to serve them)"
        )
        yield None
        return
    port = port or pipeline.metrics.port
    if port is None:
        yield None
        return
    host = "127.0.0.1" if internal else pipeline.metrics.host
    collectors: list[Any] = [metrics.REGISTRY]
    if not internal:
        collectors.append(StateCollector(pipeline))
    if child_port is not None:
        collectors.append(ChildCollector(pipeline, child_port))
    try:
        # /metrics, and /healthz and /readyz for supervisors (pipelines/endpoint.py)
        server, thread = endpoint.start(host, port, pipeline.name, Merged(collectors))
    except OSError as exc:
        raise UsageError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}",
            "choose a free port with --metrics-port or metrics.port in the pipeline file",
        ) from None
    if not internal:
        logger.info(f"metrics: http://{host}:{port}/metrics")
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
