"""The `iceberg:` settings of a `sinks:` entry (docs/follower-iceberg.md): the warehouse, the
catalog the tables are registered in, and how they are written. Registered in sinks/registry.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from cdc.ground.settings import (
    SinkSettings,
    SinkTableOptions,
    Strict,
    check_tables,
    options_of,
    view_list,
    view_names,
)

if TYPE_CHECKING:
    from cdc.ground.config import SinkConfig
    from cdc.ground.tables import TableName

WriteMode = Literal["merge-on-read", "copy-on-write"]


class IcebergTableOptions(SinkTableOptions):
    """An Iceberg sink's `table_options` entry: the options of every kind, and this table's own
    write mode (docs/follower-iceberg.md, write modes)."""

    write_mode: WriteMode | None = Field(
        default=None,
        description="this table's write mode, instead of the sink's `write_mode` (merge-on-read or copy-on-write); "
        "a change is set on the existing table's properties by the next cut that writes the table, without a rebuild",
    )


class CatalogSettings(Strict):
    """Where the Iceberg follower's tables are listed (docs/follower-iceberg.md, catalogs)."""

    type: Literal["sqlite", "jdbc", "rest"] = Field(
        default="sqlite",
        description="sqlite: Iceberg's JDBC catalog in the SQLite file <warehouse>/catalog.db (no server; "
        "pyiceberg's SqlCatalog reads it); jdbc: Iceberg's JDBC catalog on a database (`uri`, e.g. "
        "jdbc:postgresql://host/db); rest: an Iceberg REST catalog (`uri`)",
    )
    uri: str | None = Field(default=None, description="jdbc: the JDBC URL; rest: the catalog's URL")
    user: str | None = Field(default=None, description="jdbc: the database user")
    password: str | None = Field(default=None, repr=False, description="jdbc: its password, from ${ENV}")
    properties: dict[str, str] = Field(
        default_factory=dict,
        description="more Iceberg catalog properties, passed as they are (object stores: io-impl, s3.endpoint, "
        "...; rest: credential, token, ...)",
    )

    @model_validator(mode="after")
    def _uri(self) -> CatalogSettings:
        if self.type == "sqlite" and self.uri is not None:
            raise ValueError("catalog type sqlite keeps its file at <warehouse>/catalog.db: give no `uri`")
        if self.type != "sqlite" and not self.uri:
            raise ValueError(f"catalog type {self.type} needs `uri`")
        if self.type != "jdbc" and (self.user or self.password):
            raise ValueError("user and password are for catalog type jdbc")
        return self


class IcebergSettings(SinkSettings):
    """An Iceberg follower (sinks/iceberg/): one Iceberg table per source table, namespace = its schema."""

    warehouse: str = Field(
        description="where table files go: a path (relative to the pipeline file) or a URI"
    )
    catalog: CatalogSettings = Field(
        default_factory=CatalogSettings, description="where the tables are registered"
    )
    mode: Literal["scd1", "scd2"] = Field(
        default="scd1",
        description="scd1: the current row per key; scd2: every version, with _cdc_start_lsn/_cdc_end_lsn",
    )
    tables: list[str] | None = Field(
        default=None, description="subset of the source tables (default: all, or none when `views` is given)"
    )
    views: list[str] = view_list()
    write_mode: WriteMode = Field(
        default="merge-on-read",
        description="how a MERGE changes a data file: merge-on-read writes position deletes (a small cut "
        "rewrites no file), copy-on-write rewrites the files it touches; per table: table_options.<table>.write_mode",
    )
    table_options: dict[str, IcebergTableOptions] = Field(  # type: ignore[assignment]  # a kind's own entries
        default_factory=dict,
        description="per table of this sink: columns / exclude_columns, mask, rename, write_mode "
        '(e.g. {"public.users": {"exclude_columns": ["password_hash"], "write_mode": "copy-on-write"}})',
    )
    on_type_change: Literal["widen", "stop"] = Field(
        default="widen",
        description="a source column type Iceberg can widen (int -> bigint, float -> double, larger decimal "
        "precision): widen it in place (metadata only), or stop the apply",
    )

    _tables = field_validator("tables")(check_tables)
    _views = field_validator("views")(view_names)

    def drops_columns(self) -> bool:
        return self.mode == "scd1"  # scd2 keeps every version's values

    def write_mode_for(self, table: TableName) -> WriteMode:
        """The table's `table_options` write_mode, else the sink's."""
        options = options_of(self.table_options, table)
        return options.write_mode if options is not None and options.write_mode else self.write_mode


def iceberg_settings(config: SinkConfig) -> IcebergSettings:
    """The settings of a `iceberg:` sink, as the checker can follow them (the registry gives each kind its own class)."""
    settings = config.settings
    if not isinstance(settings, IcebergSettings):
        raise TypeError(f"sink {config.name} is a {config.kind} sink, not iceberg")
    return settings
