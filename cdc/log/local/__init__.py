"""The embedded log backend: one SQLite database (WAL mode) plus snapshot segment files.

Events hold what the source sent, undecoded: pgoutput TupleData bytes for stream events and
COPY text for snapshot rows; they are decoded when the log is read. The modules, one job each:

  store.py     the SQLite schema and connection, meta, write transactions, tables and schemas
  cuts.py      cuts: written with each durable batch, pruned by retention, looked up
  writer.py    capture's writes: stream batches, snapshots, table changes
  reader.py    followers' reads: parts of a range, records, counts
  records.py   read parts and stored rows decoded to records (usable without a LocalLog)
  segments.py  snapshot segment files read line by line (usable without a LocalLog)

This package exports LocalLog, the whole log, and the helpers Spark executors and the Kafka
publisher use without one.
"""

from __future__ import annotations

from cdc.log.local.reader import LocalReader
from cdc.log.local.records import (
    EventRun,
    ReadPart,
    SegmentSlice,
    copy_fields_to_values,
    decode_text_tuple,
    event_record,
    snapshot_record,
)
from cdc.log.local.segments import iter_segment, iter_segment_lines, iter_segment_positions
from cdc.log.local.store import open_db
from cdc.log.local.writer import LocalWriter


class LocalLog(LocalWriter, LocalReader):
    """One embedded log at `path`: capture writes it (LocalWriter), followers read it
    (LocalReader); `readonly` opens it for reading only."""


__all__ = [
    "EventRun",
    "LocalLog",
    "ReadPart",
    "SegmentSlice",
    "copy_fields_to_values",
    "decode_text_tuple",
    "event_record",
    "iter_segment",
    "iter_segment_lines",
    "iter_segment_positions",
    "open_db",
    "snapshot_record",
]
