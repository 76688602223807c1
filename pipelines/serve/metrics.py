"""`cdc serve`'s series on the project's Prometheus registry (cdc/metrics.py), served at /metrics."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from cdc.metrics import REGISTRY


@dataclass
class _Pipeline:
    name: str = ""


PIPELINE = _Pipeline()  # set once by the server: every series carries the pipeline label

SUBSCRIBERS = Gauge("pgcdc_serve_subscribers", "Clients following a table live (SSE)", ["pipeline", "table"], registry=REGISTRY)
EVENTS_SENT = Counter(
    "pgcdc_serve_events_sent_total", "Change events sent to clients (SSE and long-poll)", ["pipeline", "table"], registry=REGISTRY
)
EVENTS_READ = Counter(
    "pgcdc_serve_events_read_total", "Change events the shared reader read from the log", ["pipeline", "table"], registry=REGISTRY
)
DROPPED = Counter(
    "pgcdc_serve_slow_clients_dropped_total",
    "Clients cut off because their queue was full (they resume from their position)",
    ["pipeline", "table"],
    registry=REGISTRY,
)
REFUSED = Counter(
    "pgcdc_serve_requests_refused_total", "Requests refused by auth (401 no/wrong token, 403 table not allowed)", ["pipeline", "code"], registry=REGISTRY
)
SUBSCRIBER_LAG = Gauge(
    "pgcdc_serve_subscriber_lag_max_transactions",
    "Transactions waiting in the fullest subscriber queue of a table",
    ["pipeline", "table"],
    registry=REGISTRY,
)
