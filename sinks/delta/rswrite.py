"""A small cut written into a Delta table by delta-rs in the apply's own process, not by Spark
(docs/follower-delta.md, "Who writes a cut"; bench/small_cut.py).

Spark still reads, checks and nets the cut; only the write differs. A Spark MERGE of a few
thousand rows costs 1-2.5 s here whatever its size (jobs, code generation, Delta's state rebuild),
delta-rs's MERGE of the same rows tens of milliseconds. The commit holds the same actions Spark's
would: the rows, and the follower's position as Delta's transaction id (txn action: app id, cut),
so every reader and `cdc`'s own position reads are unchanged. Delta skips a Spark write whose cut
the table holds; delta-rs does not, so the cut is looked up first (a replay after a crash between
this write and the checkpoint writes nothing).

Only where delta-rs writes the table exactly as Spark would: a local path (as the cut record,
sinks/delta/cuts.py) and no table feature outside SAFE_FEATURES (column mapping, type widening,
deletion vectors, change data feed... are Spark's). A MERGE rewrites files it reads, so a table
whose Parquet files may hold Spark's INT96 timestamps (which delta-rs reads as nanoseconds: a
value outside 1677-2262 would be rewritten wrong) stays with Spark: one with a `timestamp` column
and made before cdc wrote INT64 timestamps (INT64_TIMESTAMPS, set when the sink creates a table).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow

# Features delta-rs 1.6 writes as Delta does; a table with any other stays with Spark.
SAFE_FEATURES = frozenset({"timestampNtz", "appendOnly", "invariants", "checkConstraints"})
# Legacy protocol versions without a feature list: (1, 2) has only appendOnly and invariants.
LEGACY_WRITER = 2


# A table property: every Parquet file of the table holds timestamps as INT64 (pipelines/spark.py).
INT64_TIMESTAMPS = {"cdc.timestamps": "int64"}


def _has_timestamp(t: Any) -> bool:
    """A `timestamp` (with time zone; Spark writes those as INT96) anywhere in an Arrow type."""
    import pyarrow as pa

    if pa.types.is_timestamp(t):
        return t.tz is not None
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _has_timestamp(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_timestamp(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _has_timestamp(t.key_type) or _has_timestamp(t.item_type)
    return False


def is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file:")


def writable(path: str) -> bool:
    """delta-rs writes this table as Spark would (its protocol and properties are checked)."""
    from deltalake import DeltaTable

    if not is_local(path):
        return False
    table = DeltaTable(path)
    protocol = table.protocol()
    if protocol.min_writer_version > LEGACY_WRITER and protocol.min_writer_version < 7:
        return False  # legacy versions 3-6 bring features by number (CDF, column mapping...)
    features = set(protocol.writer_features or ()) | set(protocol.reader_features or ())
    if not features <= SAFE_FEATURES:
        return False
    config = table.metadata().configuration
    if str(config.get("delta.enableChangeDataFeed", "false")).lower() == "true":
        return False
    if all(config.get(k) == v for k, v in INT64_TIMESTAMPS.items()):
        return True
    import pyarrow as pa

    return not any(_has_timestamp(f.type) for f in pa.schema(table.schema().to_arrow()))


def holds(path: str, app_id: str, cut_id: int) -> bool:
    """The table already holds this follower's cut (a replay): nothing to write."""
    from deltalake import DeltaTable

    done = DeltaTable(path).transaction_version(app_id)
    return done is not None and done >= cut_id


def _commit(app_id: str, cut_id: int):
    from deltalake import CommitProperties, Transaction

    return CommitProperties(app_transactions=[Transaction(app_id=app_id, version=cut_id)])


def ident(name: str) -> str:
    """A column name as DataFusion's SQL reads it (double quotes keep its case)."""
    return '"' + name.replace('"', '""') + '"'


def merge(
    path: str,
    source: pyarrow.Table,
    *,
    on: str,
    delete_when: str,
    update_when: str,
    update: dict[str, str],
    insert_when: str,
    insert: dict[str, str],
    app_id: str,
    cut_id: int,
) -> dict[str, Any] | None:
    """MERGE `source` (alias s) into the table (alias t) in one commit carrying (app_id, cut_id);
    None when the table holds that cut already. Clauses are DataFusion SQL; keys of `update` and
    `insert` are target columns as `ident` writes them. Returns delta-rs's metrics."""
    from deltalake import DeltaTable

    if holds(path, app_id, cut_id):
        return None
    return (
        DeltaTable(path)
        .merge(source, on, source_alias="s", target_alias="t", commit_properties=_commit(app_id, cut_id))
        .when_matched_delete(predicate=delete_when)
        .when_matched_update(update, predicate=update_when)
        .when_not_matched_insert(insert, predicate=insert_when)
        .execute()
    )


def append(path: str, rows: pyarrow.Table, app_id: str, cut_id: int) -> int:
    """Append `rows` in one commit carrying (app_id, cut_id), cast to the table's own types;
    a replay writes nothing. Returns how many rows the cut holds. A column of the table the rows
    lack (one the source dropped, kept by `dropped_columns: keep`) is NULL in them, as Spark's
    append writes it and as the MERGE inserts it."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    if not holds(path, app_id, cut_id):
        schema = pa.schema(DeltaTable(path).schema().to_arrow())
        columns = [
            rows.column(f.name) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
            for f in schema
        ]
        # Spark's Arrow types, the table's names
        target = pa.Table.from_arrays(columns, names=schema.names).cast(schema)
        write_deltalake(path, target, mode="append", commit_properties=_commit(app_id, cut_id))
    return rows.num_rows
