"""The tables' routes of `cdc serve` and the bearer-token check every data route makes (the routes are listed
in pipelines/serve/app.py): the tables a token may read, a table's initial rows as of a cut, its live changes as
Server-Sent Events and as long-poll JSON, and the JSON and SSE bodies they send.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import orjson
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from cdc.ground.errors import UsageError
from pipelines.serve import metrics
from pipelines.serve.clients import Client, Clients, Options
from pipelines.serve.feed import Control, Hub, Subscriber, TableFeed
from pipelines.serve.filters import Filter, parse_filter
from pipelines.serve.logview import Change, Txn
from pipelines.serve.paging import one_page
from pipelines.serve.tokens import Grant, authorize
from pipelines.serve.viewfeed import ViewHub

READ_TXNS = 500  # transactions per catch-up read from the log
SEND_BATCH = 256  # queued transactions sent in one write


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


def _bad(exc: Exception) -> Response:
    if isinstance(exc, UsageError):
        return _json(400, {"error": exc.problem, "fix": exc.fix})
    return _json(
        400, {"error": f"bad parameter: {exc}", "fix": "from, page, limit, cut and timeout are numbers"}
    )


class TableRoutes:
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
            asked_cut = None if asked is None else int(asked)
        except (ValueError, UsageError) as exc:
            return _bad(exc)
        if asked_cut is None:
            cut_id, lsn, position, rows = await self._state(feed)
        else:
            cut_id = asked_cut
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
        chunk, nxt = one_page(rows, page, limit, request, {"cut": str(cut_id)})
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
        # the feed has published up to its own position from the log: a position it reached is known
        # even when this read of the latest cut is older than the poller's (another thread's read)
        if position > max(rng.end, feed.position):
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
