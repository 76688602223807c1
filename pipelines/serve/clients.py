"""What `cdc serve` allows its clients (its options) and the SSE clients it follows: an id each (never the
token), a position, and the limit on how many at a time (the client label of the lag gauge stays bounded).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
from starlette.responses import Response

from cdc.ground.logsetup import STDERR
from pipelines.serve import metrics

logger = logging.getLogger(__name__)


@dataclass
class Options:
    heartbeat_s: float = 15.0
    queue: int = 256  # transactions per SSE client before it is cut off as slow
    page_max: int = 10_000
    example: Path | None = None
    states_cached: int = 4
    max_clients: int = (
        1000  # SSE streams at a time (tables and views): bounds the client label of the lag gauge
    )


@dataclass(eq=False)
class Client:
    """A connected SSE client: its id (header X-Cdc-Client, never the token) and its position."""

    id: str
    table: str
    newest: Callable[[], int]
    position: int = 0

    def lag(self) -> int:
        return max(0, self.newest() - self.position)


class Clients:
    def __init__(self, limit: int):
        self.limit = limit
        self.active: dict[str, Client] = {}
        self._ids = itertools.count(1)

    def open(self, table: str, newest: Callable[[], int], position: int) -> Client | None:
        if len(self.active) >= self.limit:
            return None
        client = Client(f"c{next(self._ids)}", table, newest, position)
        self.active[client.id] = client
        metrics.CLIENT_LAG.clients[client.id] = client
        logger.info(f"cdc serve: client {client.id} follows {table}", extra=STDERR)
        return client

    def close(self, client: Client) -> None:
        self.active.pop(client.id, None)
        metrics.CLIENT_LAG.clients.pop(client.id, None)

    def refused(self) -> Response:
        return Response(
            orjson.dumps(
                {
                    "error": f"this server follows {self.limit} clients already (--max-clients)",
                    "fix": "retry later, use another server, or start it with a larger --max-clients",
                }
            ),
            503,
            {"Retry-After": "5"},
            media_type="application/json",
        )
