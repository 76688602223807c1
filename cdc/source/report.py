"""What a look at the source found: the server and role (ServerInfo), each table's columns, key
and replica identity (TableInfo, read by catalog.py), and a check's problems, each with the
statement that fixes it, and notes (CheckReport, filled by checks.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cdc.filters import CaptureFilter
from cdc.ground.errors import SourceError
from cdc.ground.tables import TableName


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    attnum: int
    type_oid: int
    typmod: int
    not_null: bool


@dataclass(frozen=True)
class TableInfo:
    table: TableName
    oid: int
    relkind: str
    replica_identity: str  # d(efault) n(othing) f(ull) i(ndex)
    columns: tuple[ColumnInfo, ...]
    key_columns: tuple[str, ...]  # empty when the table has no usable key
    key_source: str  # 'primary key' | 'replica identity index' | 'unique index' | ''
    can_select: bool
    owned: bool

    @property
    def insert_only(self) -> bool:
        """No key and the default (or no) replica identity: followed by its inserts (and truncates)
        only, keyed by log position, through the pipeline's insert-only publication."""
        return not self.key_columns and self.replica_identity in ("d", "n")

    @property
    def multiset(self) -> bool:
        """No key and REPLICA IDENTITY FULL: its updates and deletes carry the whole old row, so a row
        is identified by its content (two identical rows are two rows); each change is keyed by its
        log position, and followers keep the multiset (docs/keyless-tables.md)."""
        return not self.key_columns and self.replica_identity == "f"


@dataclass
class ServerInfo:
    version: int
    version_text: str
    wal_level: str
    encoding: str
    max_replication_slots: int
    used_slots: int
    max_wal_senders: int
    used_wal_senders: int
    system_id: str
    database: str
    user: str
    superuser: bool
    replication_role: bool
    can_create_in_db: bool


@dataclass
class Problem:
    what: str
    fix: str
    # A followed keyless table switched from REPLICA IDENTITY FULL to DEFAULT, still in the main
    # publication: `cdc snapshot --tables` of it is the fix (it moves the table), and the stream
    # captures it exactly meanwhile (PostgreSQL refuses its updates and deletes), so warns instead
    moved_by_snapshot: TableName | None = None


@dataclass
class CheckReport:
    server: ServerInfo | None = None
    tables: list[TableInfo] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # what of each table is captured (source.postgres.table_options, cdc/filters.py)
    filters: dict[TableName, CaptureFilter] = field(default_factory=dict)

    def raise_if_problems(self) -> None:
        if self.problems:
            raise SourceError(
                "the source database cannot be captured as configured:\n  - "
                + "\n  - ".join(p.what for p in self.problems),
                "\n       ".join(p.fix for p in self.problems),
            )
