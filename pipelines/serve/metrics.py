"""`cdc serve`'s series on the project's Prometheus registry (cdc/metrics.py), served at /metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge
from prometheus_client.core import GaugeMetricFamily

from cdc.metrics import REGISTRY


@dataclass
class _Pipeline:
    name: str = ""


PIPELINE = _Pipeline()  # set once by the server: every series carries the pipeline label

SUBSCRIBERS = Gauge(
    "pgcdc_serve_subscribers",
    "Clients following a table live (SSE)",
    ["pipeline", "table"],
    registry=REGISTRY,
)
EVENTS_SENT = Counter(
    "pgcdc_serve_events_sent_total",
    "Change events sent to clients (SSE and long-poll)",
    ["pipeline", "table"],
    registry=REGISTRY,
)
EVENTS_READ = Counter(
    "pgcdc_serve_events_read_total",
    "Change events the shared reader read from the log",
    ["pipeline", "table"],
    registry=REGISTRY,
)
DROPPED = Counter(
    "pgcdc_serve_slow_clients_dropped_total",
    "Clients cut off because their queue was full (they resume from their position)",
    ["pipeline", "table"],
    registry=REGISTRY,
)
REFUSED = Counter(
    "pgcdc_serve_requests_refused_total",
    "Requests refused by auth (401 no/wrong token, 403 table not allowed)",
    ["pipeline", "code"],
    registry=REGISTRY,
)
SUBSCRIBER_LAG = Gauge(
    "pgcdc_serve_subscriber_lag_max_transactions",
    "Transactions waiting in the fullest subscriber queue of a table",
    ["pipeline", "table"],
    registry=REGISTRY,
)


class ClientLag:
    """`pgcdc_serve_client_lag{pipeline,table,client}`: per connected SSE client, how far it is behind
    the newest the server has read: log positions (offsets: one per change event) for a table, Delta
    versions (one per maintained cut) for a derived view. Computed when /metrics is scraped (nothing on
    the hot path); a client's series goes away when it disconnects. `client` is the id the server
    assigns (header X-Cdc-Client, and printed when the client connects), never the token; at most
    --max-clients of them exist at a time (the server refuses more connections)."""

    NAME = "pgcdc_serve_client_lag"

    def __init__(self) -> None:
        self.clients: dict[str, Any] = {}  # id -> an object with .table (str) and .lag() -> int

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            self.NAME,
            "How far each connected SSE client is behind the newest read (table: log positions; view: Delta versions)",
            labels=["pipeline", "table", "client"],
        )

    def describe(self) -> list[GaugeMetricFamily]:
        return [self._family()]

    def collect(self) -> list[GaugeMetricFamily]:
        family = self._family()
        for cid, client in list(self.clients.items()):
            family.add_metric([PIPELINE.name, client.table, cid], float(client.lag()))
        return [family]


CLIENT_LAG = ClientLag()
REGISTRY.register(CLIENT_LAG)
