"""The `delta:` settings of a `sinks:` entry (docs/reference/pipeline-file.md): where the Delta
tables go and how they are kept. Registered in sinks/registry.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from cdc.ground.settings import SinkSettings, check_tables, local_directory, view_list, view_names

if TYPE_CHECKING:
    from cdc.ground.config import SinkConfig


class DeltaSettings(SinkSettings):
    path: str = Field(
        description="directory of the Delta tables (a table is <path>/<schema>/<table>), on a local or "
        "shared (mounted) file system, absolute or relative to the pipeline file; a URI (s3://...) is refused"
    )
    mode: Literal["scd1", "scd2"] = Field(
        default="scd1",
        description="scd1: the current row per key; scd2: every version, with _cdc_start_lsn/_cdc_end_lsn",
    )
    tables: list[str] | None = Field(
        default=None, description="subset of the source tables (default: all, or none when `views` is given)"
    )
    views: list[str] = view_list()
    # Table features (docs/reading-the-lake.md): every feature a table takes on costs readers.
    column_mapping: Literal["auto", "name"] = Field(
        default="auto",
        description="auto: no column mapping; a column name plain Delta cannot hold (one of ' ,;{}()=', "
        "tab, newline) is stored encoded (`a b` -> `a_x0020_b`, the source name in the column's comment), so "
        "every reader reads the table; name: column mapping on every table this sink creates (renames are "
        "metadata only; delta-rs's Arrow path and Polars refuse such tables, its DataFusion reader and Spark "
        "read them)",
    )
    on_type_change: Literal["rewrite", "widen", "stop"] = Field(
        default="rewrite",
        description="a source column type Delta can widen (int -> bigint, float -> double, larger decimal, "
        "date -> timestamp): rewrite the table with the new type (every reader keeps it), widen in place "
        "with Delta type widening (only Spark with Delta 4+ reads the table then), or stop the apply",
    )
    small_cuts: Literal["delta-rs", "spark"] = Field(
        default="delta-rs",
        description="who writes a small cut (one the apply reads in its driver: at most 20,000 events and "
        "8 MiB per table) into a table on a local path: delta-rs in the apply's own process (tens of "
        "milliseconds where a Spark MERGE takes seconds; the same commit: rows and the follower's "
        "transaction id) or Spark, as for large cuts. A table with a feature delta-rs does not write "
        "(column mapping, type widening, deletion vectors, change data feed), a keyless table's deletes "
        "and `mode: scd2` are always written by Spark",
    )

    _path = field_validator("path")(local_directory)
    _tables = field_validator("tables")(check_tables)
    _views = field_validator("views")(view_names)

    def drops_columns(self) -> bool:
        return self.mode == "scd1"  # scd2 keeps every version's values


def delta_settings(config: SinkConfig) -> DeltaSettings:
    """The settings of a `delta:` sink, as the checker can follow them (the registry gives each kind its own class)."""
    settings = config.settings
    if not isinstance(settings, DeltaSettings):
        raise TypeError(f"sink {config.name} is a {config.kind} sink, not delta")
    return settings
