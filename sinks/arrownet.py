"""A small cut's net change computed by pyarrow in the driver, from the events the embedded log's
reader holds there and their values typed by sinks/arrowtyping.py: the same rows Spark's netting
gives (sinks/changes.py TableBatch.net), with no Spark job, for a writer in this process (delta-rs).

Per key the newest event by (lsn, seq) after the cut's last truncate wins. A column an update may
leave unchanged (a TOASTed value PostgreSQL did not send) takes the newest value the cut knows for
that key, and a flag column says when the cut knows none (the follower keeps its own value), as
Spark's window over the cut's earlier values does.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def _newest_per_key(order: pa.Table) -> pa.Table:
    """The first row of each key's run in `order` (sorted by key, then newest first)."""
    keys = order["key"].combine_chunks()
    if not len(keys):
        return order
    first = pa.concat_arrays([pa.array([True]), pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1))])
    return order.filter(first)


def net_events(
    events: pa.Table,
    typed: pa.Table,
    truncate: tuple[int, int] | None,
    resolved: dict[int, tuple[str, str]],
) -> pa.Table:
    """`events`: the cut's events as the reader holds them (truncates included); `typed`: its
    other events typed, row for row (arrowtyping.typed_events); `truncate`: the last truncate's
    (lsn, seq); `resolved`: column index -> (column name, flag column) for the columns an update
    may leave unchanged. Returns one row per key: the typed columns, each resolved one followed by
    its flag (True: no value known in the cut), then the META columns."""
    rows = events.filter(pc.not_equal(events["op"], "t"))  # typed_events' rows, in order
    order = pa.table(
        {
            "key": rows["key"],
            "lsn": rows["lsn"],
            "seq": rows["seq"],
            "unch": rows["unch"],
            "at": pa.array(range(rows.num_rows), type=pa.int64()),
        }
    )
    if truncate is not None:
        lsn, seq = truncate
        after = pc.or_(
            pc.greater(order["lsn"], lsn), pc.and_(pc.equal(order["lsn"], lsn), pc.greater(order["seq"], seq))
        )
        order = order.filter(after)
    order = order.sort_by([("key", "ascending"), ("lsn", "descending"), ("seq", "descending")])
    newest = _newest_per_key(order)
    net = typed.take(newest["at"])
    if not resolved:
        return net
    unch = order["unch"].combine_chunks()
    parents = pc.list_parent_indices(unch)
    flat = pc.list_flatten(unch)
    every = pa.array(range(order.num_rows), type=pa.int64())
    columns: dict[str, pa.ChunkedArray | pa.Array] = {}
    for name in typed.column_names:
        columns[name] = net[name]
        index = next((i for i, (n, _) in resolved.items() if n == name), None)
        if index is None:
            continue
        # per key, the newest event that carries this column's value
        unknown = pc.filter(parents, pc.equal(flat, index))
        known = _newest_per_key(order.filter(pc.invert(pc.is_in(every, value_set=unknown))))
        where = pc.index_in(newest["key"], value_set=known["key"])
        columns[name] = typed[name].take(known["at"].take(where))
        columns[resolved[index][1]] = pc.is_null(where)
    return pa.table(columns)
