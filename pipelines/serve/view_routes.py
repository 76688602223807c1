"""The derived views' routes of `cdc serve` (the views are read by pipelines/serve/viewfeed.py): the views a
token may read, a view's rows at its latest cut, paged, and its changes as Server-Sent Events and as long-poll
JSON, on top of the tables' routes and their token check.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName
from pipelines.serve import metrics
from pipelines.serve.clients import Client
from pipelines.serve.feed import Control
from pipelines.serve.filters import Filter, parse_filter
from pipelines.serve.paging import one_page
from pipelines.serve.table_routes import TableRoutes, _bad, _json
from pipelines.serve.viewfeed import SCHEMA, ViewAt, ViewFeed, parse_position


class ViewRoutes(TableRoutes):
    def view(self, request: Request) -> tuple[ViewFeed, ViewAt] | Response:
        grant = self.grant(request)
        if isinstance(grant, Response):
            return grant
        name = request.path_params["name"]
        feed = self.views.feeds.get(name) if self.views is not None else None
        if feed is None:
            return _json(
                404,
                {
                    "error": f"no derived view {name!r} in this pipeline",
                    "fix": "GET /v1/views lists the views you may read",
                },
            )
        if not grant.allows(TableName(SCHEMA, name)):
            metrics.REFUSED.labels(metrics.PIPELINE.name, "403").inc()
            return _json(
                403,
                {
                    "error": f"this token may not read views.{name}",
                    "fix": f"ask for a token that lists views.{name} (or views.*)",
                },
            )
        if feed.at is None:
            return _json(
                409,
                {
                    "error": f"view {name} has not been maintained yet (no cut in {self.views.access.path(name)})",  # type: ignore[union-attr]
                    "fix": "run `cdc apply` with a sink that follows the view",
                },
            )
        return feed, feed.at

    async def view_list(self, request: Request) -> Response:
        grant = self.grant(request)
        if isinstance(grant, Response):
            return grant
        feeds = self.views.feeds.values() if self.views is not None else []
        rows = [
            {
                "name": f.name,
                "position": f.at.position if f.at else None,
                "cut": f.at.cut_id if f.at else None,
            }
            for f in feeds
            if grant.allows(TableName(SCHEMA, f.name))
        ]
        return _json(200, {"views": rows})

    def _view_position(self, request: Request) -> tuple[str, int]:
        text = request.headers.get("last-event-id") or request.query_params.get("from")
        if text is None:
            raise UsageError(
                "no position", "pass ?from=<position> (the `position` of the view's rows) or Last-Event-ID"
            )
        return parse_position(text)

    async def view_initial(self, request: Request) -> Response:
        found = self.view(request)
        if isinstance(found, Response):
            return found
        feed, at = found
        assert self.views is not None
        try:
            flt = parse_filter(list(request.query_params.multi_items()), at.key)
            limit = min(int(request.query_params.get("limit", "1000")), self.options.page_max)
            page = int(request.query_params.get("page", "0"))
            wanted = parse_position(request.query_params["at"]) if "at" in request.query_params else None
        except (ValueError, UsageError) as exc:
            return _bad(exc)
        if wanted is not None and wanted != (at.table_id[:8], at.version):
            if wanted[0] != at.table_id[:8] or wanted[1] > at.version:
                return _json(
                    409,
                    _view_control(
                        feed, Control("rebuilt", f"view {feed.name} was rebuilt; start again without ?at=")
                    ),
                )
            at = ViewAt(at.view, at.table_id, wanted[1], -1, 0, at.key)  # a later page of an older cut
        try:
            rows = await asyncio.to_thread(self.views.access.rows, at)
        except Exception as exc:  # that version vacuumed meanwhile
            msg = f"view {feed.name} at version {at.version} is no longer readable ({type(exc).__name__}); start again without ?at="
            return _json(409, _view_control(feed, Control("compacted", msg)))
        if not flt.empty:
            rows = [r for r in rows if flt.matches(r.doc)]
        chunk, nxt = one_page(rows, page, limit, request, {"at": at.position})
        body = {
            "view": feed.name,
            "key": list(at.key),
            "cut": {"id": at.cut_id, "lsn": at.lsn} if at.cut_id >= 0 else None,
            "position": at.position,
            "rows": [orjson.Fragment(r.envelope) for r in chunk],
            "next": nxt,
        }
        return _json(200, body)

    def _view_events(
        self, feed: ViewFeed, tid: str, events: list, flt: Filter
    ) -> list[tuple[str, bytes, int]]:
        """(event id, data, changes sent) per cut that has a change passing the filter."""
        out = []
        for version, cut, changes in events:
            if not flt.empty:
                changes = [c for c in changes if flt.matches(c.doc)]
            if changes:
                ident = f"{tid}-{version}"
                data = orjson.dumps(
                    {
                        "view": feed.name,
                        "cut": cut,
                        "position": ident,
                        "changes": [orjson.Fragment(c.envelope) for c in changes],
                    }
                )
                out.append((ident, data, len(changes)))
        return out

    async def view_changes(self, request: Request) -> Response:
        found = self.view(request)
        if isinstance(found, Response):
            return found
        feed, at = found
        try:
            tid, version = self._view_position(request)
            flt = parse_filter(list(request.query_params.multi_items()), at.key)
        except (ValueError, UsageError) as exc:
            return _bad(exc)
        client = self.clients.open(
            f"{SCHEMA}.{feed.name}", lambda: feed.at.version if feed.at else 0, version
        )
        if client is None:
            return self.clients.refused()
        return EventSourceResponse(
            self._view_stream(feed, tid, version, flt, client),
            send_timeout=30,
            headers={"Cache-Control": "no-store", "X-Cdc-Client": client.id},
            background=BackgroundTask(self.clients.close, client),
        )

    async def _view_stream(
        self, feed: ViewFeed, tid: str, version: int, flt: Filter, client: Client
    ) -> AsyncIterator[ServerSentEvent | bytes]:
        assert self.views is not None
        sent = metrics.EVENTS_SENT.labels(metrics.PIPELINE.name, f"{SCHEMA}.{feed.name}")
        metrics.SUBSCRIBERS.labels(metrics.PIPELINE.name, f"{SCHEMA}.{feed.name}").inc()
        try:
            while True:
                at = feed.at
                if at is None:
                    control: Control | None = Control(
                        "rebuilt", f"view {feed.name} has no maintained cut now; fetch its rows anew"
                    )
                else:
                    got, control = await asyncio.to_thread(self.views.access.changes, at, tid, version)
                    parts = self._view_events(feed, tid, got.events, flt)
                    if parts:
                        yield b"".join(
                            b"id: %s\nevent: change\ndata: %s\n\n" % (i.encode(), d) for i, d, _ in parts
                        )
                        sent.inc(sum(n for _, _, n in parts))
                    version = client.position = got.upto
                if control is not None:
                    yield ServerSentEvent(
                        orjson.dumps(_view_control(feed, control)).decode(), event="control"
                    )
                    return
                if at is not None and version < at.version:
                    continue  # more than one read's worth of cuts behind
                await feed.changed(self.options.heartbeat_s)
                if feed.at == at:
                    ident = f"{tid}-{version}"
                    yield ServerSentEvent(
                        orjson.dumps({"position": ident}).decode(), event="heartbeat", id=ident
                    )
        finally:
            self.clients.close(client)
            metrics.SUBSCRIBERS.labels(metrics.PIPELINE.name, f"{SCHEMA}.{feed.name}").dec()

    async def view_poll(self, request: Request) -> Response:
        found = self.view(request)
        if isinstance(found, Response):
            return found
        feed, at = found
        assert self.views is not None
        try:
            tid, version = self._view_position(request)
            flt = parse_filter(list(request.query_params.multi_items()), at.key)
            timeout = min(float(request.query_params.get("timeout", "20")), 60.0)
            limit = int(request.query_params.get("limit", "100"))
        except (ValueError, UsageError) as exc:
            return _bad(exc)
        if tid == at.table_id[:8] and version == at.version:
            await feed.changed(timeout)
            at = feed.at or at
        got, control = await asyncio.to_thread(self.views.access.changes, at, tid, version)
        events = got.events[:limit]
        upto = got.upto if len(events) == len(got.events) else events[-1][0]
        parts = self._view_events(feed, tid, events, flt)
        if parts:
            metrics.EVENTS_SENT.labels(metrics.PIPELINE.name, f"{SCHEMA}.{feed.name}").inc(
                sum(n for _, _, n in parts)
            )
        body = {
            "position": f"{tid}-{upto}",
            "events": [{"id": i, "event": "change", "data": orjson.Fragment(d)} for i, d, _ in parts],
            "control": _view_control(feed, control) if control is not None else None,
        }
        return _json(200, body)


def _view_control(feed: ViewFeed, control: Control) -> dict[str, Any]:
    return {
        "control": "must-refetch",
        "reason": control.reason,
        "message": control.message,
        "view": feed.name,
    }
