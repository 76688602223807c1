"""The `source:` section of the pipeline file (docs/reference/pipeline-file.md): the PostgreSQL
database captured, its tables, slot and publication, and what of each table leaves it
(`table_options`, docs/choosing-what-is-captured.md)."""

from __future__ import annotations

import difflib
from typing import Literal

from pydantic import Field, field_validator, model_validator

from cdc.ground.settings import NAME_RE, Strict, TableList, check_tables, options_of
from cdc.ground.tables import TableName, TableSelector


class SourceTableOptions(Strict):
    """What of one table leaves PostgreSQL (docs/choosing-what-is-captured.md): pushed down as the
    publication's column list and row filter (PostgreSQL 15 or later) and used by the snapshot's COPY."""

    columns: list[str] | None = Field(default=None, min_length=1, description="capture only these columns")
    exclude_columns: list[str] | None = Field(
        default=None, min_length=1, description="capture every column but these"
    )
    where: str | None = Field(
        default=None,
        min_length=1,
        description="SQL predicate over replica identity columns: only rows that match are captured",
    )

    @model_validator(mode="after")
    def _one_list(self) -> SourceTableOptions:
        if self.columns is not None and self.exclude_columns is not None:
            raise ValueError("give `columns` or `exclude_columns`, not both")
        for name in (self.columns or []) + (self.exclude_columns or []):
            if not name:
                raise ValueError("empty column name")
        return self


class PostgresSource(Strict):
    dsn: str = Field(description="libpq connection string or postgresql:// URI")
    tables: TableList = Field(description='schema-qualified tables; "schema.*" for every table of a schema')
    slot: str | None = Field(
        default=None, pattern=NAME_RE, description="replication slot (default cdc_<name>)"
    )
    publication: str | None = Field(
        default=None, pattern=NAME_RE, description="publication (default cdc_<name>)"
    )
    failover: bool = Field(
        default=False,
        description="create the slot as a failover slot (PostgreSQL 17 or later): a standby with sync_replication_slots "
        "keeps a copy, so after a failover the pipeline goes on against the promoted standby (docs/recovery-and-rewind.md, Failover)",
    )
    min_sslmode: Literal["require", "verify-ca", "verify-full"] = Field(
        default="verify-full",
        description="`cdc validate` warns when the DSN names a host that is not loopback with a weaker sslmode "
        "(require: encryption without checking the server's certificate is enough)",
    )

    table_options: dict[str, SourceTableOptions] = Field(
        default_factory=dict,
        description="per table of `tables` (schema-qualified name): columns or exclude_columns, and where",
    )

    _tables = field_validator("tables")(check_tables)

    @model_validator(mode="after")
    def _options_name_tables(self) -> PostgresSource:
        selectors = [TableSelector.parse(t) for t in self.tables]
        for key in self.table_options:
            name = TableName.parse(key)  # raises ValueError with a readable message
            if not any(s.matches(name) for s in selectors):
                close = difflib.get_close_matches(key, self.tables, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"table_options: {key} is not among `tables`{hint}")
        return self

    def options_for(self, table: TableName) -> SourceTableOptions | None:
        return options_of(self.table_options, table)


class Source(Strict):
    postgres: PostgresSource = Field(description="the PostgreSQL database captured")
