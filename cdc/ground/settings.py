"""What the pipeline file's models are made of: the strict base model and table lists (used by
config.py), and `SinkSettings`, what every follower kind's settings share (per-table columns,
masks and renames; each kind's own settings extend it in sinks/<kind>/settings.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cdc.ground.tables import TableName, TableSelector

NAME_RE = r"^[a-z][a-z0-9_]*$"


class Strict(BaseModel):
    """Unknown keys are errors, values are frozen, strings stripped."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")


def local_directory(value: str | None) -> str | None:
    """A field validator for a directory cdc reads and writes with file-system calls (a Delta lake,
    a tantivy index): a URI would silently become a local folder named after its scheme."""
    if value is not None and _URI.match(value):
        raise ValueError(
            f"{value!r} is a URI: this directory must be on a local or shared (mounted) file system, "
            "object stores are not supported; give a path, absolute or relative to the pipeline file"
        )
    return value


def check_tables(values: list[str] | None) -> list[str] | None:
    """A field validator for table selectors ("schema.table", "schema.*")."""
    for value in values or []:
        TableSelector.parse(value)  # raises ValueError with a readable message
    return values


TableList = Annotated[list[str], Field(min_length=1)]

T = TypeVar("T")


def options_of(table_options: Mapping[str, T], table: TableName) -> T | None:
    """The `table_options` entry naming `table`, source's or a sink's (keys are parsed, so quoting
    and case follow SQL); None when the table has none."""
    for key, options in table_options.items():
        if TableName.parse(key) == table:
            return options
    return None


# --- what every follower kind's settings share -------------------------------------------------------
MaskKind = Literal["hash", "redact", "null"]
# A renamed table's name in every sink kind: a Delta/tantivy directory, an OpenSearch index, a Redis key prefix.
RENAME_RE = r"^[a-z0-9][a-z0-9_.-]*$"
MIN_MASK_KEY = 16


class SinkTableOptions(Strict):
    """What one sink gets of one table (docs/choosing-what-is-captured.md); applied by sinks/shaping.py."""

    columns: list[str] | None = Field(
        default=None, min_length=1, description="only these columns (key columns always)"
    )
    exclude_columns: list[str] | None = Field(
        default=None, min_length=1, description="every column but these"
    )
    mask: dict[str, MaskKind] = Field(
        default_factory=dict,
        description="per column: hash (HMAC-SHA256 hex with mask_key), redact (the text [redacted]) or null",
    )
    rename: str | None = Field(
        default=None,
        pattern=RENAME_RE,
        description="the follower's name for the table: Delta table directory <path>/<rename>, search index "
        "<rename>, Redis keys <rename>:<pk>",
    )

    @field_validator("mask", mode="before")
    @classmethod
    def _yaml_null(cls, value: Any) -> Any:
        # `mask: {notes: null}` without quotes is YAML's null: it means the mask `null`
        if isinstance(value, dict):
            return {k: "null" if v is None else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SinkTableOptions:
        if self.columns is not None and self.exclude_columns is not None:
            raise ValueError("give `columns` or `exclude_columns`, not both")
        dropped = set(self.exclude_columns or ())
        for column in self.mask:
            if column in dropped:
                raise ValueError(
                    f"mask: column {column!r} is excluded (exclude_columns), so there is nothing to mask"
                )
        return self


class SinkSettings(Strict):
    """The settings under a `sinks:` entry's kind key (`delta:`, `search:`, ...): per-table columns,
    masks and renames, common to every kind. A kind's settings (sinks/<kind>/settings.py) extend it
    with their own keys, `tables` and `views` among them (each kind says what it follows by default)."""

    if TYPE_CHECKING:  # declared by every kind, with its own default and description
        tables: list[str] | None
        views: list[str]

    # Keys naming files, resolved against the pipeline file's directory when it is loaded.
    file_keys: ClassVar[tuple[str, ...]] = ()

    table_options: dict[str, SinkTableOptions] = Field(
        default_factory=dict,
        description="per table of this sink: columns / exclude_columns, mask, rename "
        '(e.g. {"public.users": {"exclude_columns": ["password_hash"], "mask": {"email": "hash"}}})',
    )
    mask_key: str | None = Field(
        default=None,
        repr=False,
        description=f"secret key of the `hash` mask (at least {MIN_MASK_KEY} characters), from the environment: ${{CDC_MASK_KEY}}",
    )

    @model_validator(mode="after")
    def _options(self) -> SinkSettings:
        hashed = [f"{t}.{c}" for t, o in self.table_options.items() for c, m in o.mask.items() if m == "hash"]
        if hashed and not self.mask_key:
            raise ValueError(
                f"mask hash ({', '.join(hashed)}) needs mask_key: write `mask_key: ${{CDC_MASK_KEY}}` in the sink "
                f"and export CDC_MASK_KEY=<a secret of at least {MIN_MASK_KEY} characters>"
            )
        if self.mask_key is not None and len(self.mask_key) < MIN_MASK_KEY:
            raise ValueError(
                f"mask_key is shorter than {MIN_MASK_KEY} characters (a short key makes hashed values guessable); "
                "export a longer secret in its environment variable"
            )
        renamed: dict[str, str] = {}
        for table, options in self.table_options.items():
            TableName.parse(table)  # schema.table, no wildcard (raises ValueError with a readable message)
            if options.rename is not None:
                if options.rename in renamed:
                    raise ValueError(
                        f"table_options: {renamed[options.rename]} and {table} are both renamed to {options.rename!r}"
                    )
                renamed[options.rename] = table
        return self

    def options_for(self, table: TableName) -> SinkTableOptions | None:
        return options_of(self.table_options, table)

    def drops_columns(self) -> bool:
        """Whether the entry's `dropped_columns: null | drop` apply to this follower
        (docs/schema-changes.md); kinds that can set a dropped column NULL or drop it say so."""
        return False

    def executor_secrets(self, sink: str) -> dict[str, str]:
        """Variable -> value: the secrets the Spark executors writing this follower need
        (cdc/ground/executor_secrets.py); kinds writing from the executors with a password say which."""
        return {}


def view_names(values: list[str]) -> list[str]:
    """A field validator for a kind's `views`: each named once."""
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"view {value!r} is named twice")
        seen.add(value)
    return values


def view_list() -> Any:
    """The `views` field of a kind that may follow derived views (docs/derived-views.md): named
    there, declared under the top-level `views:`."""
    return Field(
        default_factory=list,
        description="derived views (names from the top-level `views:`) this sink follows, as tables views.<name>; "
        "a sink naming views and no `tables` follows only its views",
    )


def tables_or_views(settings: SinkSettings) -> None:
    """For kinds that name what they follow (no "every table" default): tables, views or both."""
    if not settings.tables and not settings.views:
        raise ValueError("give `tables` (source tables) or `views` (derived views), or both")
