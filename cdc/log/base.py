"""What every log backend offers (DESIGN.md §6) and the records that flow through it.

Positions: an event's position is (commit LSN, index inside its transaction). Stream events
count from 1; snapshot rows sit at (consistent point, 0), before anything the stream adds at
that LSN. A log keeps, per table, offsets that grow in position order from the table's
`base` (the first row of its current snapshot), so "read from offset" and "compact by key"
never reorder history.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc.ground.tables import TableName

# Row layout handed to LogWriter.append (a plain tuple: the stream reader builds ~250k/s of them).
#   (lsn, seq, op, key, payload, before, before_kind, schema_version, xid, commit_ts, event_lsn)
# op: 'c' insert, 'u' update, 'd' delete, 't' truncate. key: canonical key bytes (None for 't').
# payload/before: pgoutput TupleData bytes (None where absent). before_kind: 'K' | 'O' | None.
# commit_ts: microseconds since the Unix epoch.
ChangeRow = tuple[int, int, str, bytes | None, bytes | None, bytes | None, str | None, int, int, int, int]


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    typmod: int
    ndims: int = 0  # declared array dimensions (pg_attribute.attndims), 0 for non-arrays
    # PostgreSQL text of the value rows that existed before the column was added have
    # (ADD COLUMN ... DEFAULT <constant>: pg_attribute.attmissingval); they get it without any WAL.
    missing: str | None = None
    # pg_attribute.attnum: a column's identity across renames (a rename keeps it, a drop + add
    # does not). 0 = unknown (logs written before it was recorded): columns then match by name.
    attnum: int = 0


@dataclass(frozen=True)
class TableSchema:
    """Columns (in PostgreSQL's order) and key of one table, plus resolved type descriptors by oid
    so a reader needs no connection to the source."""

    columns: tuple[Column, ...]
    key: tuple[str, ...]
    types: Mapping[int, dict[str, Any]] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key_indexes(self) -> tuple[int, ...]:
        names = [c.name for c in self.columns]
        return tuple(names.index(k) for k in self.key)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def to_json(self) -> dict[str, Any]:
        return {
            "columns": [[c.name, c.type_oid, c.typmod, c.ndims, c.missing, c.attnum] for c in self.columns],
            "key": list(self.key),
            "types": {str(k): v for k, v in self.types.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TableSchema:
        return cls(
            columns=tuple(Column(*c) for c in data["columns"]),
            key=tuple(data["key"]),
            types={int(k): v for k, v in data.get("types", {}).items()},
        )


@dataclass(frozen=True)
class TableRange:
    base: int  # first offset of the table's current snapshot (followers bootstrap from here)
    end: int  # last offset included in the cut


@dataclass(frozen=True)
class Cut:
    """A consistent point of the log: every transaction that committed before `lsn` and touched a
    listed table is in the log, whole, at or before that table's `end` offset."""

    id: int
    lsn: int
    ts_ms: int
    tables: Mapping[TableName, TableRange]


@dataclass(frozen=True)
class TableState:
    table: TableName
    id: int
    state: (
        str  # 'pending' (seen, no snapshot yet) | 'snapshotting' | 'live' | 'dropped' (gone from the source)
    )
    base: int | None
    snapshot_lsn: int | None
    purged_below: int  # deletes/truncates below this offset were compacted away
    schema_version: int | None
    dropped_lsn: int | None = None  # 'dropped': the stream had every change of the table up to here
    relid: int | None = None  # the source relation's OID (None: not recorded, or not known here)


@dataclass(slots=True)
class LogRecord:
    """One decoded event. values/before are PostgreSQL text values aligned with `schema.columns`:
    str, None for NULL, or cdc.pgoutput.UNCHANGED for an unchanged TOAST value."""

    table: TableName
    offset: int
    lsn: int
    seq: int
    op: str  # c u d r t
    key: bytes | None
    values: list[Any] | None
    before: list[Any] | None
    before_kind: str | None
    schema: TableSchema
    xid: int | None
    commit_ts: int | None  # µs since Unix epoch
    event_lsn: int | None
    schema_version: int = 0


class LogWriter(ABC):
    """Capture side. Rows are appended inside an open batch; commit() makes the whole batch durable
    at once together with a new cut, so readers never see part of a transaction."""

    @abstractmethod
    def table_id(self, table: TableName) -> int | None: ...

    @abstractmethod
    def ensure_table(self, table: TableName) -> int:
        """Register a table (state 'pending' when new); return its id."""

    @abstractmethod
    def schema_version(self, table_id: int, schema: TableSchema, since_lsn: int) -> int:
        """The version number of this schema for the table, adding it when it is new."""

    @abstractmethod
    def append(self, table_id: int, rows: Sequence[ChangeRow]) -> None: ...

    @abstractmethod
    def commit(self, lsn: int, stream_position: tuple[int, int] | None) -> Cut:
        """Durably commit the open batch; `lsn` is the source position the log now covers;
        stream_position=(commit_lsn, end_lsn) of the last whole transaction written."""

    @abstractmethod
    def rollback(self) -> None: ...

    @abstractmethod
    def stream_position(self) -> tuple[int, int] | None:
        """(commit_lsn, end_lsn) of the last transaction made durable by the stream reader."""


class LogReader(ABC):
    @abstractmethod
    def latest_cut(self) -> Cut | None: ...

    @abstractmethod
    def tables(self) -> list[TableState]: ...

    @abstractmethod
    def schema(self, table: TableName, version: int | None = None) -> TableSchema: ...

    @abstractmethod
    def read(self, table: TableName, after: int, upto: int) -> Iterator[LogRecord]:
        """Events with after < offset <= upto, oldest first; snapshot segments expanded to 'r' rows."""
