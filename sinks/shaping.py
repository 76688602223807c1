"""What one sink gets of a table: columns, masks and its own name (docs/choosing-what-is-captured.md).

A sink's `table_options` shape every batch before the sink sees it, in one place: the apply job
(pipelines/apply/cut.py) calls `shape_batch`, so snapshots, bootstraps, rebuilds, SCD2 history
and schema changes all go through it. Shaping works on the log's rows themselves (the `vals`
texts and the `unch` unchanged-TOAST indexes), before they are typed, so the shaped batch is an
ordinary TableBatch whose schema has only the kept columns, a masked column typed `text`:
everything downstream (net change, casts, schema evolution, the sinks) needs nothing new.
`cdc verify` shapes the source's rows with the same functions, so it compares like with like.

Masks (NULL stays NULL for each):
* hash: HMAC-SHA256 of the value's PostgreSQL text form, keyed with the sink's `mask_key`, as 64
  lower-case hex digits. Built from Spark's sha2 (no Python UDF, so it runs on a cluster as is);
  the same key gives the same hash in every run and sink, so hashed columns still join.
  PostgreSQL with pgcrypto computes the same: encode(hmac(col::text, key, 'sha256'), 'hex').
* redact: the text `[redacted]`.
* null: NULL (the column keeps its type).

Rules are found by a column's name and, after a source-side rename, by its older names, so a
renamed column stays excluded or masked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc.ground.config import SinkConfig
from cdc.ground.errors import PipelineFileError
from cdc.ground.tables import TableName
from cdc.log.base import TableSchema
from sinks.changes import TableBatch
from sinks.masks import REDACTED, TEXT_OID, TEXT_TYPE, mask_text

_BLOCK = 64  # SHA-256 block size (RFC 2104)


# ---- the masks ---------------------------------------------------------------------------------------
def _pads(key: str) -> tuple[bytes, bytes]:
    k = key.encode()
    if len(k) > _BLOCK:
        k = hashlib.sha256(k).digest()
    k = k.ljust(_BLOCK, b"\0")
    return bytes(b ^ 0x36 for b in k), bytes(b ^ 0x5C for b in k)


def hmac_column(text: SparkColumn, key: str) -> SparkColumn:
    """HMAC-SHA256 hex of a string column: H((K^opad) || H((K^ipad) || m)) with Spark's sha2."""
    ipad, opad = _pads(key)
    inner = F.unhex(F.sha2(F.concat(F.lit(ipad), F.encode(text, "UTF-8")), 256))
    return F.sha2(F.concat(F.lit(opad), inner), 256)


def mask_column(kind: str, key: str | None, text: SparkColumn) -> SparkColumn:
    if kind == "null":
        return F.lit(None).cast("string")
    if kind == "redact":
        return F.when(text.isNotNull(), F.lit(REDACTED))
    assert key is not None
    return hmac_column(text, key)


# ---- one table of one sink -------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """How a sink's view of a table is made from the log's columns."""

    kept: tuple[int, ...]  # indexes of the log's columns the sink gets, in order
    masks: dict[str, str]  # follower column name -> hash | redact | null
    schema: TableSchema  # the sink's columns: kept ones, hashed/redacted ones typed text
    key: str | None  # mask_key

    def vals(self, vals: SparkColumn) -> SparkColumn:
        names = self.schema.column_names
        parts = []
        for new, old in enumerate(self.kept):
            text = vals[old]
            kind = self.masks.get(names[new])
            parts.append(text if kind is None else mask_column(kind, self.key, text))
        return F.when(vals.isNull(), vals).otherwise(F.array(*parts).cast("array<string>"))

    def unch(self, unch: SparkColumn) -> SparkColumn:
        """Unchanged-TOAST indexes renumbered to the kept columns (dropped columns' ones left out)."""
        kept = F.array(*(F.lit(i) for i in self.kept))
        moved = F.transform(unch, lambda i: F.array_position(kept, i).cast("int") - 1)
        return F.filter(moved, lambda i: i >= 0)


def options_for(sink: SinkConfig, table: TableName):
    return sink.settings.options_for(table)


def shape_record(sink: SinkConfig, table: TableName) -> str:
    """What the sink's follower of a table was shaped with, as stable text for its checkpoint: the
    table's options, and a short fingerprint of mask_key when a hash mask uses it (never the key
    itself). A change means the follower holds values shaped otherwise (an email stored before
    its mask was added): the apply job then rebuilds that table from the log's base. Only the
    options every kind shares shape values: a kind's own (an Iceberg table's write_mode) do not."""
    import json

    from cdc.ground.settings import SinkTableOptions

    options = options_for(sink, table)
    if options is None:
        return ""
    doc = options.model_dump(exclude_defaults=True, include=set(SinkTableOptions.model_fields))
    key = sink.settings.mask_key
    if key and "hash" in options.mask.values():
        doc["mask_key_sha256"] = hashlib.sha256(key.encode()).hexdigest()[:12]
    return json.dumps(doc, sort_keys=True) if doc else ""


def follower_name(sink: SinkConfig, table: TableName) -> str | None:
    """The sink's own name for the table (`rename`), or None for the default."""
    options = options_for(sink, table)
    return options.rename if options is not None else None


def _bad(sink: SinkConfig, table: TableName, problem: str, fix: str) -> PipelineFileError:
    return PipelineFileError(f"sink {sink.name}: table_options {table}: {problem}", fix)


def shape_of(
    sink: SinkConfig, table: TableName, schema: TableSchema, renames: dict[str, tuple[str, ...]] | None = None
) -> Shape | None:
    """The sink's shape of `table` with the log's `schema` (None: the sink takes it as it is).
    Raises PipelineFileError (exit 2) naming sink, table and column for a column the table does
    not have (a typo would leave a column unmasked) or a rule a key column cannot take."""
    options = options_for(sink, table)
    if options is None or not (options.columns or options.exclude_columns or options.mask):
        return None
    renames = renames or {}
    names = schema.column_names
    aliases = {n: (n, *renames.get(n, ())) for n in names}  # current name -> every name it had
    known = {a for al in aliases.values() for a in al}
    where = f"sinks: {sink.name}: {sink.kind}: table_options: {table}"
    for given in (options.columns or [], options.exclude_columns or [], list(options.mask)):
        for column in given:
            if column not in known:
                raise _bad(
                    sink,
                    table,
                    f"column {column!r} is not a column of {table} (its columns: {', '.join(names)})",
                    f"correct the column name under {where} (a column dropped in the source leaves the file too)",
                )

    def rule(values: Mapping[str, str], column: str) -> str | None:
        return next((values[a] for a in aliases[column] if a in values), None)

    def listed(values: Collection[str], column: str) -> bool:
        return any(a in values for a in aliases[column])

    kept: list[int] = []
    masks: dict[str, str] = {}
    for i, column in enumerate(names):
        is_key = column in schema.key
        if options.exclude_columns is not None and listed(options.exclude_columns, column):
            if is_key:
                raise _bad(
                    sink,
                    table,
                    f"column {column!r} is a key column: it cannot be excluded (followers key their rows on it)",
                    f"remove it from exclude_columns under {where} (mask it with hash to hide its values)",
                )
            continue
        if options.columns is not None and not is_key and not listed(options.columns, column):
            continue  # key columns are always kept
        kind = rule(options.mask, column)
        if kind in ("redact", "null") and is_key:
            raise _bad(
                sink,
                table,
                f"column {column!r} is a key column: mask {kind} would give every row the same key",
                f"use mask hash for it under {where} (distinct keys stay distinct), or no mask",
            )
        if kind is not None:
            masks[column] = kind
        kept.append(i)
    columns = []
    for i in kept:
        col = schema.columns[i]
        kind = masks.get(col.name)
        if kind is None:
            columns.append(col)
        elif kind == "null":
            columns.append(replace(col, missing=None))
        else:
            key = sink.settings.mask_key
            columns.append(
                replace(col, type_oid=TEXT_OID, typmod=-1, ndims=0, missing=mask_text(kind, key, col.missing))
            )
    types = dict(schema.types)
    if any(k in ("hash", "redact") for k in masks.values()):
        types.setdefault(TEXT_OID, TEXT_TYPE)
    shaped = TableSchema(tuple(columns), schema.key, types)
    return Shape(tuple(kept), masks, shaped, sink.settings.mask_key)


def shape_rows(df: DataFrame, shape: Shape | None) -> DataFrame:
    """Log rows (or the source's COPY rows for verify) with `vals` (and `unch`) shaped."""
    if shape is None:
        return df
    df = df.withColumn("vals", shape.vals(F.col("vals")))
    if "unch" in df.columns:
        df = df.withColumn(
            "unch", F.when(F.col("unch").isNull(), F.col("unch")).otherwise(shape.unch(F.col("unch")))
        )
    return df


def shape_batch(batch: TableBatch, sink: SinkConfig) -> TableBatch:
    """The batch as this sink gets it (the same batch when the sink takes the table as it is)."""
    shape = shape_of(sink, batch.table, batch.schema, batch.renames)
    if shape is None:
        return batch
    names = set(shape.schema.column_names)
    defaults = {}
    for column, (lsn, text) in batch.defaults.items():
        if column not in names:
            continue
        kind = shape.masks.get(column)
        if kind == "null":
            continue  # rows from before the column hold NULL like every other row
        masked = text if kind is None else mask_text(kind, shape.key, text)
        assert masked is not None  # a text hashed or redacted is text ("null" went above)
        defaults[column] = (lsn, masked)
    shaped = TableBatch(
        batch.table,
        shape.schema,
        shape_rows(batch.raw, shape),
        batch.bootstrap,
        batch.snapshot_lsn,
        batch.first_offset,
        batch.last_offset,
        batch.value_kind,
    )
    shaped.defaults = defaults
    shaped.retired = frozenset(c for c in batch.retired if c in names)
    shaped.renames = {c: old for c, old in batch.renames.items() if c in names}
    shaped.base, shaped.inserts_new = batch.base, batch.inserts_new
    return shaped
