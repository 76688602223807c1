"""`cdc stream`: the WAL change stream (pgoutput) into the log, in commit order.

`cdc.reader.run_stream` is the entry point; `cdc.stream.reader.StreamReader` one run, assembled from
this package's parts (each module says its job).

Per change the hot loop does only what the log needs: find the table, number the event
inside its transaction, cut out the key and keep the raw tuple bytes. Decoding values is
left to readers of the log, which keeps this loop as fast as the walsender.

Durability and acknowledgement:
  * events go into the log inside an open batch; a batch only ends at a transaction boundary
    (every `batch_max_events` events or `batch_max_seconds`), with one durable commit that
    also records a cut and the (commit LSN, end LSN) of the last transaction;
  * the flush LSN acknowledged to PostgreSQL is that end LSN, so the slot never moves past
    anything not durable in the log;
  * after a crash PostgreSQL resends from the acknowledged position; transactions whose commit
    LSN the log already recorded are skipped, so the log holds each position exactly once;
  * with nothing in flight, the slot follows the server's keepalives, so WAL is released on
    idle or filtered traffic too.
"""
