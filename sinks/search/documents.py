"""What a search follower stores per source row, shared by both engines (tantivy, OpenSearch).

**One document per key.** The document id is the key: the single key column's value as text
(`42`, `alice`, `2024-01-01`), or the JSON array of the key values for a composite key
(`[7,"x"]`); an id longer than 512 bytes (OpenSearch's limit) becomes `#sha256:<hex>`. The
document holds every source column as a JSON value (below); what is *searchable* is decided
per column by its field type.

**Position -> version.** A document carries one integer that orders like the position
(commit LSN, index in the transaction) of the change that wrote it:

    version = 2 * lsn + (1 if seq > 0 else 0)

Collapsing `seq` to one bit is safe because two changes of the same key never compare with
the same LSN and different seq > 0: within one batch a key appears once (the net change), and
a transaction (one commit LSN) never spans batches, so two versions of one key from different
batches have different commit LSNs. The only same-LSN pair that can meet is a snapshot row
at (consistent point, 0) and a stream change committed at that LSN, (cp, k > 0): 2cp < 2cp + 1
keeps the stream change newer. A replayed change has the same version (not newer: ignored),
an older one a smaller version. LSNs are below 2^62 in practice, so the version fits a signed
64-bit integer (OpenSearch's external version, tantivy's i64 field).

**Truncate.** A truncate at position p deletes every document with version < version(p) and
the follower remembers version(p): later writes older than that are dropped, so a late
write cannot bring back a truncated row. A table starting over from a new snapshot (bootstrap)
is a truncate at (snapshot LSN, 0).

**Field types** (`fields:` in the sink's settings overrides them per column):

| source type | field type |
|---|---|
| key columns holding text (any string type) | keyword |
| text, varchar, char, citext, name, json, jsonb, xml, tsvector | text (tokenized) |
| uuid, enums, inet, interval, timetz, money, other string-typed values | keyword (exact) |
| int2 / int4 / int8 (oid, xid, time as µs) | short / integer / long |
| float4 / float8, numeric(p,s), numeric | float / double / double / double |
| bool | boolean |
| date, timestamp, timestamptz | date |
| bytea | binary (kept, not searchable) |
| arrays | the element's field type, one value per element |

A derived numeric or date field is lenient: a value it cannot index (NaN, a date after 9999)
is kept in the document and only left out of the index. A field type given in `fields:` is
strict: a value it cannot take rejects the row, and the apply stops naming table and key.

**JSON values** (what the document holds; `current()` turns them back into the source's
Spark types for `cdc verify`): numbers as numbers; float NaN/±Infinity as "NaN", "Infinity",
"-Infinity"; numeric(p,s) as its exact text ("12.50"); bytea as base64; date as
"YYYY-MM-DD"; timestamp as "YYYY-MM-DDTHH:MM:SS.ffffff", timestamptz the same with "Z" (UTC);
arrays as (nested) lists; everything else as the Spark string. Timestamps without time zone go
through Spark's session time zone, which pipelines/spark.py sets to UTC; the sink refuses to
write them under another one.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.errors import SinkError
from cdc.log.base import TableSchema
from cdc.pgdatetime import civil_from_days, days_from_civil
from cdc.schema import schema_types
from cdc.typemap import PgType
from sinks.changes import Batch, NetChanges
from sinks.sparktypes import from_text, spark_type

FIELD_TYPES = (
    "text",
    "keyword",
    "long",
    "integer",
    "short",
    "double",
    "float",
    "boolean",
    "date",
    "binary",
    "stored",
)
MAX_ID_BYTES = 512
TEXT_TYPES = {"text", "varchar", "bpchar", "citext", "name", "json", "jsonb", "xml", "tsvector"}
_US_PER_DAY = 86_400_000_000


def version(lsn: int, seq: int) -> int:
    """The position (lsn, seq) as one orderable integer (see the module docstring)."""
    return 2 * lsn + (1 if seq > 0 else 0)


def truncate_version(batch: Batch) -> int | None:
    """Version below which the batch empties the table (new base or truncate), or None."""
    found = []
    if batch.bootstrap and batch.snapshot_lsn is not None:
        found.append(version(batch.snapshot_lsn, 0))
    if batch.truncate_position is not None:
        found.append(version(*batch.truncate_position))
    return max(found) if found else None


# ---- field types ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class FieldSpec:
    column: str
    type: str  # one of FIELD_TYPES
    derived: bool  # True: from the source type (lenient); False: configured (strict)


def _scalar_field(t: PgType, dtype: T.DataType, is_key: bool) -> str:
    if isinstance(dtype, T.ByteType | T.ShortType):
        return "short"
    if isinstance(dtype, T.IntegerType):
        return "integer"
    if isinstance(dtype, T.LongType):
        return "long"
    if isinstance(dtype, T.FloatType):
        return "float"
    if isinstance(dtype, T.DoubleType | T.DecimalType):
        return "double"
    if isinstance(dtype, T.BooleanType):
        return "boolean"
    if isinstance(dtype, T.BinaryType):
        return "binary"
    if isinstance(dtype, T.DateType | T.TimestampType | T.TimestampNTZType):
        return "date"
    if t.kind == "base" and t.name == "numeric":  # numeric without precision: exact text, indexed as a number
        return "double"
    if is_key:
        return "keyword"
    return "text" if t.kind == "base" and t.name in TEXT_TYPES else "keyword"


def derive_field(t: PgType, dtype: T.DataType, is_key: bool) -> str:
    while isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    if t.kind == "array" and t.element is not None:
        t = t.element
    return _scalar_field(t, dtype, is_key)


def field_specs(schema: TableSchema, configured: dict[str, str], table: str) -> list[FieldSpec]:
    names = set(schema.column_names)
    unknown = sorted(set(configured) - names)
    if unknown:
        raise SinkError(
            f"{table}: `fields` names column(s) the table does not have: {', '.join(unknown)}",
            f"the columns are: {', '.join(schema.column_names)}",
        )
    types = schema_types(schema)
    specs = []
    for col in schema.columns:
        if col.name in configured:
            specs.append(FieldSpec(col.name, configured[col.name], False))
        else:
            t = types[col.type_oid]
            specs.append(
                FieldSpec(col.name, derive_field(t, spark_type(t, col), col.name in schema.key), True)
            )
    return specs


def spark_schema(schema: TableSchema) -> T.StructType:
    types = schema_types(schema)
    return T.StructType(
        [T.StructField(c.name, spark_type(types[c.type_oid], c), True) for c in schema.columns]
    )


# ---- Spark rows -> JSON values (apply) -----------------------------------------------------------
def _has_time(dtype: T.DataType) -> bool:
    while isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    return isinstance(dtype, T.DateType | T.TimestampType | T.TimestampNTZType)


def to_wire(col: SparkColumn, dtype: T.DataType) -> SparkColumn:
    """Spark side, before rows reach Python: dates as day numbers, timestamps as µs since the
    epoch (no Python datetime, whose range and time zone handling differ from Spark's)."""
    if isinstance(dtype, T.DateType):
        return F.unix_date(col)
    if isinstance(dtype, T.TimestampType):
        return F.unix_micros(col)
    if isinstance(dtype, T.TimestampNTZType):
        return F.unix_micros(col.cast(T.TimestampType()))
    if isinstance(dtype, T.ArrayType) and _has_time(dtype.elementType):
        return F.transform(col, lambda x: to_wire(x, dtype.elementType))
    return col


def _year(year: int) -> str:
    if 0 <= year <= 9999:
        return f"{year:04d}"
    return f"+{year}" if year > 9999 else f"-{-year:04d}"


def format_date(days: int) -> str:
    y, m, d = civil_from_days(days)
    return f"{_year(y)}-{m:02d}-{d:02d}"


def format_timestamp(micros: int, zone: bool) -> str:
    days, of_day = divmod(micros, _US_PER_DAY)
    seconds, frac = divmod(of_day, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{format_date(days)}T{hour:02d}:{minute:02d}:{second:02d}.{frac:06d}" + ("Z" if zone else "")


def _float_json(v: float) -> float | str:
    if math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def encoder(dtype: T.DataType) -> Callable[[Any], Any] | None:
    """Non-NULL Python value of a `to_wire` column -> its JSON value in the document; None when
    the value is its own JSON value (ints, bools, strings, arrays of them)."""
    if isinstance(dtype, T.DateType):
        return format_date
    if isinstance(dtype, T.TimestampType):
        return lambda v: format_timestamp(v, True)
    if isinstance(dtype, T.TimestampNTZType):
        return lambda v: format_timestamp(v, False)
    if isinstance(dtype, T.FloatType | T.DoubleType):
        return _float_json
    if isinstance(dtype, T.DecimalType):
        return lambda v: format(v, "f")
    if isinstance(dtype, T.BinaryType):
        return lambda v: base64.b64encode(bytes(v)).decode()
    if isinstance(dtype, T.ArrayType):
        inner = encoder(dtype.elementType)
        if inner is None:
            return list
        return lambda v: [None if x is None else inner(x) for x in v]
    return None


def encoders(layout: RowLayout) -> list[Callable[[Any], Any] | None]:
    return [encoder(t) for t in layout.dtypes]


# ---- JSON values -> Spark rows (current(), for verify) -------------------------------------------
_DATE = re.compile(r"([+-]?\d{4,})-(\d\d)-(\d\d)")
_STAMP = re.compile(r"([+-]?\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?Z?")


def parse_date(text: str) -> int:
    m = _DATE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a date: {text!r}")
    return days_from_civil(int(m.group(1)), int(m.group(2)), int(m.group(3)))


def parse_timestamp(text: str) -> int:
    m = _STAMP.fullmatch(text)
    if m is None:
        raise ValueError(f"not a timestamp: {text!r}")
    days = days_from_civil(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    frac = int(((m.group(7) or "") + "000000")[:6])
    return (
        days * _US_PER_DAY
        + ((int(m.group(4)) * 60 + int(m.group(5))) * 60 + int(m.group(6))) * 1_000_000
        + frac
    )


_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def wire_type(dtype: T.DataType) -> T.DataType:
    """The Spark type `decoder` values are read in, before `from_wire` gives the source type."""
    if isinstance(dtype, T.DateType):
        return T.IntegerType()
    if isinstance(dtype, T.TimestampType | T.TimestampNTZType):
        return T.LongType()
    if isinstance(dtype, T.DecimalType):
        return T.StringType()
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(wire_type(dtype.elementType), True)
    return dtype


def decoder(dtype: T.DataType) -> Callable[[Any], Any]:
    """A document's JSON value -> a Python value of `wire_type(dtype)`."""
    if isinstance(dtype, T.DateType):
        return lambda v: None if v is None else parse_date(v)
    if isinstance(dtype, T.TimestampType | T.TimestampNTZType):
        return lambda v: None if v is None else parse_timestamp(v)
    if isinstance(dtype, T.FloatType | T.DoubleType):
        return lambda v: None if v is None else (_SPECIAL_FLOATS[v] if isinstance(v, str) else float(v))
    if isinstance(dtype, T.DecimalType):
        return lambda v: None if v is None else str(v)
    if isinstance(dtype, T.BinaryType):
        return lambda v: None if v is None else bytearray(base64.b64decode(v))
    if isinstance(dtype, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        return lambda v: None if v is None else int(v)
    if isinstance(dtype, T.StringType):
        return lambda v: None if v is None else (v if isinstance(v, str) else orjson.dumps(v).decode())
    if isinstance(dtype, T.ArrayType):
        inner = decoder(dtype.elementType)
        return lambda v: None if v is None else [inner(x) for x in v]
    return lambda v: v


def from_wire(col: SparkColumn, dtype: T.DataType) -> SparkColumn:
    if isinstance(dtype, T.DateType):
        return F.date_from_unix_date(col)
    if isinstance(dtype, T.TimestampType):
        return F.timestamp_micros(col)
    if isinstance(dtype, T.TimestampNTZType):
        return F.timestamp_micros(col).cast(T.TimestampNTZType())
    if isinstance(dtype, T.DecimalType):
        return col.cast(dtype)
    if (
        isinstance(dtype, T.ArrayType)
        and isinstance(wire_type(dtype), T.ArrayType)
        and wire_type(dtype) != dtype
    ):
        return F.transform(col, lambda x: from_wire(x, dtype.elementType))
    return col


ABSENT = "__cdc_absent"


def _decode_partition(names: list[str], dtypes: list[T.DataType], docs: Iterable[dict]) -> Iterator[tuple]:
    decoders = [decoder(t) for t in dtypes]
    for doc in docs:
        values = []
        absent = []
        for name, dec in zip(names, decoders, strict=True):
            if name in doc:
                values.append(dec(doc[name]))
            else:
                values.append(None)
                absent.append(name)
        values.append(absent)
        yield tuple(values)


def documents_frame(spark: SparkSession, docs, schema: TableSchema) -> DataFrame:
    """The follower's documents (an RDD of JSON objects, read in executors) as a DataFrame of the
    source columns, typed like the source. A column missing from a document (written before the
    column was added) holds the column's fast default, as in the source, or NULL."""
    target = spark_schema(schema)
    names = [f.name for f in target.fields]
    dtypes = [f.dataType for f in target.fields]
    wire = T.StructType(
        [T.StructField(f"c{i}", wire_type(t), True) for i, t in enumerate(dtypes)]
        + [T.StructField(ABSENT, T.ArrayType(T.StringType(), False), False)]
    )
    rows = docs.mapPartitions(lambda it: _decode_partition(names, dtypes, it))
    df = spark.createDataFrame(rows, wire, verifySchema=False)
    types = schema_types(schema)
    cols = []
    for i, (col, dtype) in enumerate(zip(schema.columns, dtypes, strict=True)):
        value = from_wire(F.col(f"c{i}"), dtype)
        if col.missing is not None:
            default = from_text(F.lit(col.missing), types[col.type_oid], col)
            value = F.when(F.array_contains(F.col(ABSENT), col.name), default).otherwise(value)
        cols.append(value.alias(col.name))
    return df.select(*cols)


# ---- document ids and display --------------------------------------------------------------------
def renamed_row(row: dict, renames: dict[str, tuple[str, ...]]) -> bool:
    """Rename a stored row's members after source column renames (new name -> older names); True if any was."""
    changed = False
    for new, olds in renames.items():
        old = next((o for o in olds if o in row), None) if new not in row else None
        if old is not None:
            row[new] = row.pop(old)
            changed = True
    return changed


def pending_renames(schema_json: dict, renames: dict[str, tuple[str, ...]]) -> bool:
    """Whether the index was written with a column under a name it has since lost."""
    names = {c[0] for c in schema_json.get("columns", [])}
    return any(new not in names and any(o in names for o in olds) for new, olds in renames.items())


def doc_id(key_values: list[Any]) -> str:
    """The document id of a key, from its JSON values."""
    if len(key_values) == 1 and isinstance(key_values[0], str):
        text = key_values[0]
    elif len(key_values) == 1:
        text = orjson.dumps(key_values[0]).decode()
    else:
        text = orjson.dumps(key_values).decode()
    if len(text.encode()) > MAX_ID_BYTES:
        return "#sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text


def show_key(names: Iterable[str], values: Iterable[Any]) -> str:
    return ", ".join(f"{n}={v!r}" for n, v in zip(names, values, strict=True))


def render_row(doc: dict, columns: list[str], skip: Iterable[str] = (), width: int = 160) -> str:
    """A short one-line rendering of a document for `cdc search`."""
    skipped = set(skip)
    parts = []
    for name in columns:
        if name in skipped or name not in doc:
            continue
        value = doc[name]
        text = value if isinstance(value, str) else orjson.dumps(value).decode()
        if len(text) > 60:
            text = text[:57] + "..."
        parts.append(f"{name}={text}")
    line = " | ".join(parts)
    return line if len(line) <= width else line[: width - 3] + "..."


# ---- the batch as rows for executors -------------------------------------------------------------
@dataclass(frozen=True)
class RowLayout:
    """How `write_frame` lays out a row: c0..cN-1 (source columns, JSON-ready), lsn, seq, op,
    then one unchanged-TOAST flag per toastable column (`flags`: column index -> row index)."""

    table: str
    names: tuple[str, ...]
    dtypes: tuple[T.DataType, ...]
    key: tuple[int, ...]
    flags: tuple[tuple[int, int], ...]

    @property
    def lsn(self) -> int:
        return len(self.names)

    @property
    def seq(self) -> int:
        return len(self.names) + 1

    @property
    def op(self) -> int:
        return len(self.names) + 2


def write_frame(spark: SparkSession, batch: Batch, changes: NetChanges) -> tuple[DataFrame, RowLayout]:
    schema = batch.spark_schema
    names = [f.name for f in schema.fields]
    if any(isinstance(f.dataType, T.TimestampNTZType) or _ntz_array(f.dataType) for f in schema.fields):
        zone = spark.conf.get("spark.sql.session.timeZone")
        if zone not in ("UTC", "Etc/UTC", "Z", "+00:00", "GMT"):
            raise SinkError(
                f"{batch.table}: timestamp columns need Spark's session time zone UTC (it is {zone})",
                "remove spark.sql.session.timeZone from spark.conf in the pipeline file",
            )
    cols = [
        to_wire(F.col(f"`{n.replace('`', '``')}`"), f.dataType).alias(f"c{i}")
        for i, (n, f) in enumerate(zip(names, schema.fields, strict=True))
    ]
    cols += [F.col("_cdc_lsn"), F.col("_cdc_seq"), F.col("_cdc_op")]
    flags = []
    for i, name in enumerate(names):
        flag = changes.unchanged.get(name)
        if flag is not None:
            flags.append((i, len(cols)))
            cols.append(F.col(flag))
    layout = RowLayout(
        str(batch.table),
        tuple(names),
        tuple(f.dataType for f in schema.fields),
        # a keyless (insert-only) table's document id is its position: the row's lsn and seq
        tuple(names.index(k) for k in batch.schema.key) or (len(names), len(names) + 1),
        tuple(flags),
    )
    return changes.df.select(*cols), layout


def default_values(spark: SparkSession, batch: Batch) -> dict[str, Any]:
    """The batch's columns with a fast default (`ADD COLUMN ... DEFAULT <constant>`) -> that value
    as a document holds it (`write_frame`'s wire value, then `encoder`), for the documents written
    before the column existed (one Spark job for all of them; {} when there are none)."""
    fields = [f for f in batch.spark_schema.fields if f.name in batch.defaults]
    if not fields:
        return {}
    [row] = (
        spark.range(1)
        .select(
            *(
                to_wire(batch.default_value(f.name).cast(f.dataType), f.dataType).alias(f"d{i}")
                for i, f in enumerate(fields)
            )
        )
        .collect()
    )
    values = {}
    for i, f in enumerate(fields):
        enc, wire = encoder(f.dataType), row[f"d{i}"]
        values[f.name] = wire if enc is None or wire is None else enc(wire)
    return values


def _ntz_array(dtype: T.DataType) -> bool:
    while isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    return isinstance(dtype, T.TimestampNTZType)


class Row:
    """One net change, decoded on an executor (`encoders(layout)` gives `codecs`)."""

    __slots__ = ("id", "key", "lsn", "op", "seq", "unchanged", "values", "version")
    id: str
    key: list[Any]
    lsn: int
    op: str
    seq: int
    unchanged: tuple[str, ...]  # columns whose unchanged TOAST value the document keeps
    values: dict[str, Any] | None  # None: a delete
    version: int

    def __init__(self, layout: RowLayout, codecs: list[Callable[[Any], Any] | None], raw: tuple) -> None:
        self.lsn = raw[layout.lsn]
        self.seq = raw[layout.seq]
        self.op = raw[layout.op]
        self.version = 2 * self.lsn + (1 if self.seq > 0 else 0)  # version(lsn, seq), inlined: hot path
        key = []
        for i in layout.key:
            value, enc = raw[i], codecs[i] if i < len(codecs) else None  # past the columns: the position
            key.append(value if enc is None or value is None else enc(value))
        self.key = key
        self.id = doc_id(key)
        if self.op == "d":
            self.values = None
            self.unchanged = ()
            return
        values = {}
        for name, enc, value in zip(layout.names, codecs, raw):  # noqa: B905 - raw has meta columns after
            values[name] = value if enc is None or value is None else enc(value)
        self.values = values
        self.unchanged = tuple(layout.names[i] for i, pos in layout.flags if raw[pos]) if layout.flags else ()

    def show_key(self, layout: RowLayout) -> str:
        return show_key([(*layout.names, "_cdc_lsn", "_cdc_seq")[i] for i in layout.key], self.key)


# ---- errors --------------------------------------------------------------------------------------
_PY_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception)): (.+)$", re.M)


def spark_failure(exc: BaseException) -> str:
    """A one-line reason from an exception Spark raised for a failed task (no Java/Py4J stack)."""
    text = str(exc)
    found = _PY_ERROR.findall(text)
    if found:
        kind, message = found[-1]
        return f"{kind}: {message.strip()}"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:300]
