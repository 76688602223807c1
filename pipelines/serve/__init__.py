"""`cdc serve`: a change feed for applications over HTTP (docs/change-feed.md).

Layers of this package, each with one job:
  tokens.py  bearer tokens (hashed) and the tables each may read
  shape.py   a sink's columns, masks and rename applied to the feed's rows
  logread.py blocking reads of the local log: whole transactions after an offset, the state at a cut
  feed.py    one shared reader per table, fan-out to bounded per-client queues
  app.py     the Starlette routes (initial state, SSE, long-poll, metrics, example page)
  server.py  uvicorn, TLS, the running-server file `cdc status` lists
The feed reads only the log: no client ever touches the source.
"""
