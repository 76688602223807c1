"""Prometheus metrics recorded by the stream, the snapshot and the apply job (docs/monitoring.md).

Recorded always, because it is cheap: once per durable log batch, per copied chunk, per applied
cut, never per event. Served over HTTP only when asked (`--metrics-port`, or `metrics:` in the
pipeline file): pipelines/metrics.py runs the endpoint and adds the gauges read from the source,
the log and the checkpoints when scraped (slot, cut, follower lag).

LSNs are exported as plain numbers (bytes of WAL), so the difference of two is a lag in bytes.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

disable_created_metrics()  # no `_created` series next to every counter: nobody graphs them
REGISTRY = CollectorRegistry(auto_describe=True)  # ours only: no process/GC series to collide in `cdc run`

UP = Gauge(
    "pgcdc_up",
    "1 while the process runs (0: cdc run's stream child does not answer)",
    ["pipeline", "component"],
    registry=REGISTRY,
)
START_TIME = Gauge(
    "pgcdc_start_time_seconds", "Unix time the process started", ["pipeline", "component"], registry=REGISTRY
)
ERRORS = Counter(
    "pgcdc_errors_total",
    "Failures by component and kind (error class)",
    ["pipeline", "component", "kind"],
    registry=REGISTRY,
)

STREAM_EVENTS = Counter(
    "pgcdc_stream_events_total", "Change events written durably to the log", ["pipeline"], registry=REGISTRY
)
STREAM_TXNS = Counter(
    "pgcdc_stream_transactions_total",
    "Source transactions with captured changes written durably to the log",
    ["pipeline"],
    registry=REGISTRY,
)
STREAM_BATCHES = Counter(
    "pgcdc_stream_batches_total",
    "Log commits (batches of whole transactions)",
    ["pipeline"],
    registry=REGISTRY,
)
STREAM_DURABLE = Gauge(
    "pgcdc_stream_durable_lsn", "WAL position durable in the log", ["pipeline"], registry=REGISTRY
)
STREAM_ACKED = Gauge(
    "pgcdc_stream_acked_lsn", "WAL position acknowledged to PostgreSQL", ["pipeline"], registry=REGISTRY
)
STREAM_SUCCESS = Gauge(
    "pgcdc_stream_last_success_timestamp_seconds",
    "Unix time the stream last made (or confirmed) progress",
    ["pipeline"],
    registry=REGISTRY,
)

SNAP_ESTIMATED = Gauge(
    "pgcdc_snapshot_table_rows_estimated",
    "Rows the planner expects in a table being snapshotted",
    ["pipeline", "table"],
    registry=REGISTRY,
)
SNAP_ROWS = Counter(
    "pgcdc_snapshot_rows_total",
    "Rows copied into the log by snapshots",
    ["pipeline", "table"],
    registry=REGISTRY,
)
SNAP_DONE = Gauge(
    "pgcdc_snapshot_table_done",
    "1 once the table's snapshot is complete in the log, 0 while it copies",
    ["pipeline", "table"],
    registry=REGISTRY,
)
SNAP_SUCCESS = Gauge(
    "pgcdc_snapshot_last_success_timestamp_seconds",
    "Unix time a snapshot last completed",
    ["pipeline"],
    registry=REGISTRY,
)

_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
APPLY_STAGE = Histogram(
    "pgcdc_apply_stage_duration_seconds",
    "Duration of one apply stage of a cut: read (read and check the cut's tables), prepare, cut (the whole cut)",
    ["pipeline", "sink", "stage"],
    buckets=_BUCKETS,
    registry=REGISTRY,
)
APPLY_TABLE = Histogram(
    "pgcdc_apply_table_duration_seconds",
    "Duration of netting and merging one table's changes of a cut into a follower",
    ["pipeline", "sink", "table"],
    buckets=_BUCKETS,
    registry=REGISTRY,
)
APPLY_CUTS = Counter(
    "pgcdc_apply_cuts_total", "Cuts applied to a follower", ["pipeline", "sink"], registry=REGISTRY
)
APPLY_SUCCESS = Gauge(
    "pgcdc_apply_last_success_timestamp_seconds",
    "Unix time an apply round of the follower last ended without error",
    ["pipeline", "sink"],
    registry=REGISTRY,
)

CUTS_DROPPED_HELD = Counter(
    "pgcdc_log_cuts_dropped_held_total",
    "Times the local log dropped cuts a follower still held (its retention bound was reached)",
    ["pipeline"],
    registry=REGISTRY,
)

APPLY_ERROR = Gauge(
    "pgcdc_apply_last_error_timestamp_seconds",
    "Unix time an apply round of the follower last ended with an error (cdc status shows the error)",
    ["pipeline", "sink"],
    registry=REGISTRY,
)


def started(pipeline: str, component: str) -> None:
    UP.labels(pipeline, component).set(1)
    START_TIME.labels(pipeline, component).set(time.time())


def error(pipeline: str, component: str, exc: BaseException | str) -> None:
    kind = exc if isinstance(exc, str) else type(exc).__name__
    ERRORS.labels(pipeline, component, kind).inc()


class StreamMetrics:
    """The stream's series, labels bound once (the reader calls these per batch)."""

    def __init__(self, pipeline: str):
        self.events = STREAM_EVENTS.labels(pipeline)
        self.transactions = STREAM_TXNS.labels(pipeline)
        self.batches = STREAM_BATCHES.labels(pipeline)
        self.durable = STREAM_DURABLE.labels(pipeline)
        self.acked = STREAM_ACKED.labels(pipeline)
        self.success = STREAM_SUCCESS.labels(pipeline)

    def committed(self, events: int, transactions: int, lsn: int) -> None:
        self.events.inc(events)
        self.transactions.inc(transactions)
        self.batches.inc()
        self.progress(lsn)

    def progress(self, lsn: int) -> None:
        self.durable.set(lsn)
        self.success.set(time.time())
