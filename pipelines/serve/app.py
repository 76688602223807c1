"""The HTTP routes of `cdc serve` (docs/change-feed.md), on Starlette; uvicorn serves them.

  GET /v1/tables                          the tables this token may read, with their positions
  GET /v1/tables/{name}                   initial rows as of a cut, paged (?limit=, then `next`)
  GET /v1/tables/{name}/changes?from=N    live changes as Server-Sent Events (or Last-Event-ID: N)
  GET /v1/tables/{name}/poll?from=N       the same as long-poll JSON (?timeout=S, ?limit=)
  GET /v1/views                           the derived views this token may read (views.<name> in its list)
  GET /v1/views/{name}                    a view's rows at its latest cut, paged; /changes and /poll as for tables
  GET /metrics                            Prometheus (no data: no token needed)
  GET /                                   the example page, with --example
Every data route needs `Authorization: Bearer TOKEN` (or ?access_token= for EventSource, which
cannot send headers; the access log is off, so it is not written anywhere).
The handlers live in table_routes.py (the tables, and the token check) and view_routes.py (the derived views);
here the app routes to them and its lifespan runs the feeds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from cdc.metrics import REGISTRY
from pipelines.serve.clients import Options
from pipelines.serve.feed import Hub
from pipelines.serve.table_routes import _json
from pipelines.serve.tokens import Grant
from pipelines.serve.view_routes import ViewRoutes
from pipelines.serve.viewfeed import ViewHub


def _health(hub: Hub, views: ViewHub | None) -> Response:
    error = hub.error or (views.error if views is not None else None)
    return _json(200 if error is None else 503, {"ok": error is None, "error": error})


def build_app(hub: Hub, grants: list[Grant], options: Options, views: ViewHub | None = None) -> Starlette:
    feeds = ViewRoutes(hub, grants, options, views)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await hub.start()
        tasks = [asyncio.create_task(hub.run())]
        if views is not None:
            await views.start()
            tasks.append(asyncio.create_task(views.run()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    routes: list[Any] = [
        Route("/v1/tables", feeds.tables),
        Route("/v1/tables/{name}", feeds.initial),
        Route("/v1/tables/{name}/changes", feeds.changes),
        Route("/v1/tables/{name}/poll", feeds.poll),
        Route(
            "/metrics", lambda request: Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
        ),
        Route("/v1/views", feeds.view_list),
        Route("/v1/views/{name}", feeds.view_initial),
        Route("/v1/views/{name}/changes", feeds.view_changes),
        Route("/v1/views/{name}/poll", feeds.view_poll),
        Route("/healthz", lambda request: _health(hub, views)),
    ]
    if options.example is not None:
        page = options.example
        routes.append(Route("/", lambda request: FileResponse(page, media_type="text/html")))
    return Starlette(routes=routes, lifespan=lifespan)
