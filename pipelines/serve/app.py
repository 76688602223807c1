"""The HTTP routes of `cdc serve` (README "Change feed"), on Starlette; uvicorn serves them.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName
from cdc.metrics import REGISTRY
from pipelines.serve import metrics
from pipelines.serve.feed import Control, Hub, Subscriber, TableFeed
from pipelines.serve.filters import Filter, parse_filter
from pipelines.serve.logview import Change, Txn
from pipelines.serve.tokens import Grant, authorize
from pipelines.serve.viewfeed import SCHEMA, ViewAt, ViewFeed, ViewHub, parse_position

READ_TXNS = 500  # transactions per catch-up read from the log
SEND_BATCH = 256  # queued transactions sent in one write


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
        print(f"cdc serve: client {client.id} follows {table}", file=sys.stderr, flush=True)
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


def _json(status: int, body: dict[str, Any]) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _control_body(feed: TableFeed, control: Control, position: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "control": "must-refetch" if control.refetch else control.reason,
        "reason": control.reason,
    }
    body |= {"message": control.message, "table": feed.name}
    if position is not None:
        body["position"] = position
    return body


def _sse(ident: int, data: bytes) -> bytes:
    return b"id: %d\nevent: change\ndata: %s\n\n" % (ident, data)


def _txn_body(feed: TableFeed, txn: Txn, changes: list[Change]) -> bytes:
    return orjson.dumps(
        {
            "table": feed.name,
            "lsn": txn.lsn,
            "position": txn.last,
            "changes": [orjson.Fragment(c.envelope) for c in changes],
        }
    )


class Feeds:
    def __init__(self, hub: Hub, grants: list[Grant], options: Options, views: ViewHub | None = None):
        self.hub = hub
        self.views = views
        self.clients = Clients(options.max_clients)
        self.grants = grants
        self.options = options
        self.states: OrderedDict[tuple[str, int], tuple[int, int, list[Change]]] = OrderedDict()
        self.keys: dict[str, tuple[str, ...]] = {}
        self.computing: dict[tuple[str, int], asyncio.Future[list[Change]]] = {}

    # ---- auth ---------------------------------------------------------------------------------------
    def grant(self, request: Request) -> Grant | Response:
        header = request.headers.get("authorization", "")
        token = (
            header[7:].strip()
            if header[:7].lower() == "bearer "
            else request.query_params.get("access_token")
        )
        grant = authorize(self.grants, token)
        if grant is None:
            metrics.REFUSED.labels(metrics.PIPELINE.name, "401").inc()
            why = "no bearer token" if not token else "the token is not known"
            return Response(
                orjson.dumps(
                    {
                        "error": why,
                        "fix": "send Authorization: Bearer <token> (or ?access_token= for EventSource)",
                    }
                ),
                401,
                {"WWW-Authenticate": 'Bearer realm="cdc serve"'},
                media_type="application/json",
            )
        return grant

    def feed(self, request: Request) -> tuple[TableFeed, Grant] | Response:
        grant = self.grant(request)
        if isinstance(grant, Response):
            return grant
        name = request.path_params["name"]
        feed = self.hub.feeds.get(name)
        if feed is None:
            return _json(
                404,
                {
                    "error": f"no table {name!r} in this feed",
                    "fix": "GET /v1/tables lists the tables you may read",
                },
            )
        if not grant.allows(feed.table):
            metrics.REFUSED.labels(metrics.PIPELINE.name, "403").inc()
            return _json(
                403,
                {"error": f"this token may not read {name}", "fix": "ask for a token that lists the table"},
            )
        return feed, grant

    async def filter(self, request: Request, feed: TableFeed) -> Filter:
        if feed.name not in self.keys:
            self.keys[feed.name] = await asyncio.to_thread(self.hub.access.key, feed.table)
        return parse_filter(list(request.query_params.multi_items()), self.keys[feed.name])

    # ---- routes -------------------------------------------------------------------------------------
    async def tables(self, request: Request) -> Response:
        grant = self.grant(request)
        if isinstance(grant, Response):
            return grant
        rows = [
            {"name": f.name, "table": str(f.table), "position": f.position}
            for f in self.hub.feeds.values()
            if grant.allows(f.table)
        ]
        return _json(200, {"tables": rows})

    async def initial(self, request: Request) -> Response:
        found = self.feed(request)
        if isinstance(found, Response):
            return found
        feed, _ = found
        try:
            flt = await self.filter(request, feed)
            limit = min(int(request.query_params.get("limit", "1000")), self.options.page_max)
            page = int(request.query_params.get("page", "0"))
            asked = request.query_params.get("cut")
        except (ValueError, UsageError) as exc:
            return _bad(exc)
        if asked is None:
            cut_id, lsn, position, rows = await self._state(feed)
        else:
            cut_id = int(asked)
            cached = self.states.get((feed.name, cut_id))
            if cached is None:
                return _json(
                    409,
                    _control_body(
                        feed,
                        Control("compacted", "this cut's rows are no longer kept; start again without ?cut="),
                        None,
                    ),
                )
            lsn, position, rows = cached
        if not flt.empty:
            rows = [r for r in rows if flt.matches(r.doc)]
        chunk = rows[page * limit : (page + 1) * limit]
        nxt = None
        if (page + 1) * limit < len(rows):
            params = dict(request.query_params) | {
                "cut": str(cut_id),
                "page": str(page + 1),
                "limit": str(limit),
            }
            params.pop("access_token", None)
            nxt = f"{request.url.path}?" + "&".join(f"{k}={v}" for k, v in params.items())
        body = {
            "table": feed.name,
            "key": list(self.keys[feed.name]),
            "cut": {"id": int(cut_id), "lsn": lsn},
            "position": position,
            "rows": [orjson.Fragment(r.envelope) for r in chunk],
            "next": nxt,
        }
        return _json(200, body)

    async def _state(self, feed: TableFeed) -> tuple[int, int, int, list[Change]]:
        access = self.hub.access
        cut, _ = await asyncio.to_thread(access.latest)
        rng = cut.tables.get(feed.table) if cut else None
        if cut is None or rng is None:
            return 0, 0, 0, []
        key = (feed.name, cut.id)
        if key not in self.states:
            # clients arriving together at one cut share one computation of its rows
            task = self.computing.get(key)
            if task is None:
                task = self.computing[key] = asyncio.ensure_future(
                    asyncio.to_thread(access.state_at, self.hub.renderer, feed.shape, rng.base, rng.end)
                )
                task.add_done_callback(lambda _t: self.computing.pop(key, None))
            rows = await asyncio.shield(task)
            self.states[key] = (cut.lsn, rng.end, rows)
        self.states.move_to_end(key)
        while len(self.states) > self.options.states_cached:
            self.states.popitem(last=False)
        lsn, position, rows = self.states[key]
        return cut.id, lsn, position, rows

    def _position(self, request: Request) -> int:
        # Last-Event-ID first: an EventSource reconnects to its first URL (an old ?from=) with the newer id
        text = request.headers.get("last-event-id") or request.query_params.get("from")
        if text is None:
            raise UsageError(
                "no position", "pass ?from=<position> (the `position` of the initial rows) or Last-Event-ID"
            )
        return int(text)

    async def check(self, feed: TableFeed, position: int) -> tuple[Control | None, int | None]:
        """Whether a client may continue from `position`; the schema version in force there."""

        cut, states = await asyncio.to_thread(self.hub.access.latest)
        state, rng = states.get(feed.table), (cut.tables.get(feed.table) if cut else None)
        if state is None or rng is None or state.base is None:
            return Control("unknown-position", f"{feed.name} is not in the log now"), None
        if position < state.base:
            return Control(
                "rebuilt",
                f"position {position} is before {feed.name}'s current snapshot; fetch its rows anew",
            ), None
        if position < self.hub.access.purged_below(state):
            return Control(
                "compacted",
                f"the log no longer holds every change after position {position}; fetch the rows anew",
            ), None
        if position > rng.end:
            return Control(
                "unknown-position",
                f"position {position} is past the log's end ({rng.end}); fetch the rows anew",
            ), None
        return None, await asyncio.to_thread(self.hub.access.version_at, feed.table, position)

    async def catch_up(
        self, feed: TableFeed, position: int, version: int | None
    ) -> tuple[list[Txn], int, Control | None]:
        """Transactions after `position` up to the feed's position: from memory, or from the log."""
        txns = feed.since(position)
        upto = feed.position
        if txns is None:
            batch = await asyncio.to_thread(
                self.hub.access.read_txns, self.hub.renderer, feed.shape, position, upto, READ_TXNS * 10
            )
            if batch.rebuilt:
                return (
                    batch.txns,
                    batch.position,
                    Control("rebuilt", f"{feed.name} was snapshotted again; fetch its rows anew"),
                )
            txns, upto = batch.txns, batch.position
        for i, txn in enumerate(txns):
            if version is not None and txn.version != version:
                end = txns[i - 1].last if i else position
                return (
                    txns[:i],
                    end,
                    Control("schema-changed", f"the columns of {feed.name} changed; fetch its rows anew"),
                )
        return txns, upto, None

    async def _feed_request(self, request: Request) -> tuple[TableFeed, int, Filter] | Response:
        """The feed, start position and filter a changes or poll request names, or the response refusing it."""
        found = self.feed(request)
        if isinstance(found, Response):
            return found
        feed, _ = found
        try:
            return feed, self._position(request), await self.filter(request, feed)
        except (ValueError, UsageError) as exc:
            return _bad(exc)

    async def changes(self, request: Request) -> Response:
        read = await self._feed_request(request)
        if isinstance(read, Response):
            return read
        feed, position, flt = read
        client = self.clients.open(feed.name, lambda: feed.position, position)
        if client is None:
            return self.clients.refused()
        return EventSourceResponse(
            self._stream(feed, position, flt, client),
            send_timeout=30,
            headers={"Cache-Control": "no-store", "X-Cdc-Client": client.id},
            background=BackgroundTask(self.clients.close, client),
        )

    async def _stream(
        self, feed: TableFeed, position: int, flt: Filter, client: Client
    ) -> AsyncIterator[ServerSentEvent | bytes]:
        sub: Subscriber | None = None
        try:
            control, version = await self.check(feed, position)
            while control is None and sub is None:
                if position > feed.position:  # the feed has not read as far as this client's cut yet
                    await feed.changed(self.options.heartbeat_s)
                    continue
                sub = feed.subscribe(position, self.options.queue)
                if sub is not None:
                    client.position = position
                    break
                txns, upto, control = await self.catch_up(feed, position, version)
                chunk = self._wire(feed, txns, flt)
                if chunk:
                    yield chunk
                if txns:
                    position = txns[-1].last
                if control is None:
                    position = max(position, upto)
                client.position = position
            while sub is not None and control is None:
                if sub.queue.empty() and sub.control is not None:
                    control = sub.control
                    break
                try:
                    first = await asyncio.wait_for(sub.queue.get(), self.options.heartbeat_s)
                except TimeoutError:
                    yield ServerSentEvent(
                        orjson.dumps({"position": position}).decode(), event="heartbeat", id=str(position)
                    )
                    continue
                # what else is queued goes out in the same write: one send per wake-up, not per transaction
                txns = [first] if first is not None else []
                while len(txns) < SEND_BATCH and not sub.queue.empty():
                    txn = sub.queue.get_nowait()
                    if txn is not None:
                        txns.append(txn)
                chunk = self._wire(feed, txns, flt)
                if chunk:
                    yield chunk
                if txns:
                    position = client.position = txns[-1].last
            if control is not None:
                body = _control_body(feed, control, position if not control.refetch else None)
                yield ServerSentEvent(
                    orjson.dumps(body).decode(),
                    event="control",
                    id=str(position) if not control.refetch else None,
                )
        finally:
            self.clients.close(client)
            if sub is not None:
                feed.unsubscribe(sub)

    def _wire(self, feed: TableFeed, txns: list[Txn], flt: Filter) -> bytes:
        """The `change` events of these transactions as SSE bytes; unfiltered ones are encoded once
        per transaction and shared by every subscriber."""
        parts = []
        sent = 0
        for txn in txns:
            if flt.empty:
                if txn.wire is None:
                    txn.wire = _sse(txn.last, _txn_body(feed, txn, txn.changes))
                parts.append(txn.wire)
                sent += len(txn.changes)
                continue
            changes = [c for c in txn.changes if flt.matches(c.doc)]
            if changes:
                parts.append(_sse(txn.last, _txn_body(feed, txn, changes)))
                sent += len(changes)
        if sent:
            feed.sent_counter().inc(sent)
        return b"".join(parts)

    async def poll(self, request: Request) -> Response:
        read = await self._feed_request(request)
        if isinstance(read, Response):
            return read
        feed, position, flt = read
        try:
            timeout = min(float(request.query_params.get("timeout", "20")), 60.0)
            limit = int(request.query_params.get("limit", "100"))
        except (ValueError, UsageError) as exc:
            return _bad(exc)
        control, version = await self.check(feed, position)
        events: list[Any] = []
        if control is None:
            if position >= feed.position:
                await feed.changed(timeout)
            if position <= feed.position:
                txns, upto, control = await self.catch_up(feed, position, version)
                if len(txns) > limit:
                    txns, upto = txns[:limit], txns[limit - 1].last
                for txn in txns:
                    changes = txn.changes if flt.empty else [c for c in txn.changes if flt.matches(c.doc)]
                    if changes:
                        feed.sent_counter().inc(len(changes))
                        events.append(
                            {
                                "id": txn.last,
                                "event": "change",
                                "data": orjson.Fragment(_txn_body(feed, txn, changes)),
                            }
                        )
                    position = txn.last
                if control is None:
                    position = max(position, upto)
        body = {"position": position, "events": events, "control": None}
        if control is not None:
            body["control"] = _control_body(feed, control, None)
        return _json(200, body)

    # ---- derived views (pipelines/serve/viewfeed.py) ------------------------------------------------
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
        chunk = rows[page * limit : (page + 1) * limit]
        nxt = None
        if (page + 1) * limit < len(rows):
            params = dict(request.query_params) | {
                "at": at.position,
                "page": str(page + 1),
                "limit": str(limit),
            }
            params.pop("access_token", None)
            nxt = f"{request.url.path}?" + "&".join(f"{k}={v}" for k, v in params.items())
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


def _health(hub: Hub, views: ViewHub | None) -> Response:
    error = hub.error or (views.error if views is not None else None)
    return _json(200 if error is None else 503, {"ok": error is None, "error": error})


def _bad(exc: Exception) -> Response:
    if isinstance(exc, UsageError):
        return _json(400, {"error": exc.problem, "fix": exc.fix})
    return _json(400, {"error": f"bad parameter: {exc}", "fix": "from, page, limit and timeout are numbers"})


def build_app(hub: Hub, grants: list[Grant], options: Options, views: ViewHub | None = None) -> Starlette:
    feeds = Feeds(hub, grants, options, views)

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
