"""A chunk's segment in the log reconciled with its window (snapshot/chunked.py): the table's stream
events committed between the chunk's watermarks, and the segment file rewritten without the rows
they supersede (the rule is snapshot/reconcile.py's)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from cdc.ground.private import private_open
from cdc.keys import key_from_copy_fields
from cdc.log.local import LocalLog, iter_segment_lines
from cdc.pgoutput import UNCHANGED, decode_tuple
from snapshot.chunk_checkpoint import ChunkMark
from snapshot.reconcile import Reconciled, WindowEvent, reconcile


def window_events(log: LocalLog, table_id: int, mark: ChunkMark) -> Iterator[WindowEvent]:
    """The table's stream events committed inside the chunk's window (low, high)."""
    for lsn, op, key, payload in log.events_after(table_id, mark.after):
        if lsn <= mark.low:
            continue  # committed before the window (the stream appends in commit order)
        if lsn >= mark.high:
            return
        whole = op != "u" or payload is None or not any(v is UNCHANGED for v in decode_tuple(payload, 0)[0])
        yield WindowEvent(key, op, whole)


def reconcile_segment(
    log: LocalLog, table_id: int, snapshot_id: int, mark: ChunkMark, key_idx: tuple[int, ...]
) -> Reconciled:
    """Drop the chunk rows the window's events supersede, rewriting the segment file in place."""
    counts = Reconciled()
    path = log.segment_path(table_id, snapshot_id, mark.number)
    events = list(window_events(log, table_id, mark))
    if not events:
        counts.kept = mark.rows
        return counts
    tmp = path.with_suffix(".reconcile")
    rows = (
        (key_from_copy_fields(line.rstrip(b"\n").split(b"\t"), key_idx), line)
        for line in iter_segment_lines(path)
    )
    with private_open(tmp, "wb", buffering=1 << 20) as out:
        for line in reconcile(rows, events, counts):
            out.write(line)
        out.flush()
        os.fsync(out.fileno())
        nbytes = out.tell()
    os.replace(tmp, path)
    log.add_segment(snapshot_id, mark.number, path, counts.kept, nbytes)
    return counts
