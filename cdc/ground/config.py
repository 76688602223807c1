"""The pipeline file's model (docs/reference/pipeline-file.md): the top-level `Pipeline` with its
`sinks:` and `views:` sections, the values resolved from it (state_dir, slot, the tables a
sink follows...), and pipeline_model(), which gives `sinks:` entries their follower kinds.

Strict on purpose: unknown keys, wrong types and missing required keys are errors naming the file,
the key path and what was expected. Relative paths are relative to the directory holding the
pipeline file.

The other sections live beside it: `source:` in source_config.py, `log:` in log_config.py,
`spark:`, `stream:`, `snapshot:` and `metrics:` in runtime_config.py; reading a file (YAML,
`${VAR}`, error wording) in pipeline_file.py. Each follower kind's settings live beside the kind
(sinks/<kind>/settings.py) and are registered in sinks/registry.py, whose
load_pipeline/parse_pipeline read files with them.
"""

from __future__ import annotations

import difflib
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

from pydantic import Field, create_model, field_validator, model_validator

from cdc.ground.errors import PipelineFileError, UsageError
from cdc.ground.log_config import LocalLog, LogConfig
from cdc.ground.runtime_config import MetricsConfig, SnapshotConfig, SparkConfig, StreamConfig
from cdc.ground.settings import NAME_RE, SinkSettings, Strict, local_directory
from cdc.ground.source_config import Source
from cdc.ground.tables import TableName, TableSelector


# --- sinks ----------------------------------------------------------------------------------------
# A `sinks:` entry is its name and options here, plus one follower kind's settings under the kind's
# key (`delta:`, `search:`, ...). The kinds and their settings models live in the sinks layer
# (sinks/<kind>/settings.py, registered in sinks/registry.py), above this one: it builds the full
# model with pipeline_model(), and loads pipeline files through it.
class _SinkName(Strict):
    name: str = Field(
        pattern=NAME_RE, description="the sink's name (`--sink NAME`; its checkpoint and metrics label)"
    )


class SinkConfig(_SinkName):
    """A `sinks:` entry; pipeline_model() adds one optional key per follower kind."""

    kinds: ClassVar[tuple[str, ...]] = ()  # the kind keys, as pipeline_model() added them

    on_lost: Literal["rebuild", "stop"] = Field(
        default="rebuild",
        description="when the engine lost data this follower had applied (its marker is gone or behind): "
        "rebuild the table from the log's base, or stop with the remedy",
    )
    dropped_columns: Literal["keep", "null", "drop"] = Field(
        default="keep",
        description="a column the source drops: keep its last values, set it NULL in every row, or drop it "
        "from the follower (delta and iceberg mode scd1, redis; docs/schema-changes.md)",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> SinkConfig:
        given = [k for k in self.kinds if getattr(self, k) is not None]
        if len(given) != 1:
            names = [f"`{k}`" for k in self.kinds]
            listed = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)
            raise ValueError(f"give exactly one sink kind: {listed}")
        if self.dropped_columns != "keep" and not self.settings.drops_columns():
            raise ValueError(
                "dropped_columns: null and drop are for delta and iceberg sinks with mode scd1 and redis sinks "
                "(scd2 keeps every version's values, search keeps the field): use keep"
            )
        return self

    @property
    def kind(self) -> str:
        return next(k for k in self.kinds if getattr(self, k) is not None)

    @property
    def settings(self) -> SinkSettings:
        """The kind's settings (sinks/<kind>/settings.py)."""
        settings: SinkSettings = getattr(self, self.kind)
        return settings


# --- derived views -------------------------------------------------------------------------------
VIEW_SCHEMA = "views"  # a view is followed as the table views.<name>


class ViewConfig(Strict):
    """A derived view (docs/derived-views.md): Spark SQL over the captured tables, kept up to date
    cut by cut (pipelines/views) and followed by sinks that name it in their `views`."""

    name: str = Field(pattern=NAME_RE, description="followed as the table views.<name>")
    sql: str = Field(
        min_length=1, description="one Spark SQL query over the captured tables, named schema.table"
    )
    key: list[str] = Field(
        min_length=1, description="output columns that identify a view row (unique per row)"
    )

    @field_validator("key")
    @classmethod
    def _key_columns(cls, value: list[str]) -> list[str]:
        for column in value:
            if not column.strip():
                raise ValueError("empty column name")
        if len(set(value)) != len(value):
            raise ValueError(f"a column is named twice in {value}")
        return value

    @property
    def table(self) -> TableName:
        return TableName(VIEW_SCHEMA, self.name)


class Pipeline(Strict):
    sink_config: ClassVar[type[SinkConfig]] = (
        SinkConfig  # a `sinks:` entry (pipeline_model() gives it its kinds)
    )

    name: str = Field(
        pattern=NAME_RE, description="the pipeline's name (default slot, publication and topic prefix)"
    )
    source: Source = Field(description="where changes come from")
    log: LogConfig | None = Field(
        default=None, description="where captured changes are kept (default: local)"
    )
    state_dir: str | None = Field(
        default=None,
        description="checkpoints, locks and the local log (default .cdc/<name>), on a local file system",
    )
    _state_dir = field_validator("state_dir")(local_directory)
    sinks: list[SinkConfig] = Field(default_factory=list, description="the followers")
    views: list[ViewConfig] = Field(
        default_factory=list, description="derived views over the captured tables"
    )
    spark: SparkConfig = Field(default_factory=SparkConfig, description="the apply job's Spark")
    stream: StreamConfig = Field(
        default_factory=StreamConfig, description="`cdc stream` batching and reconnects"
    )
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="the Prometheus endpoint")
    snapshot: SnapshotConfig = Field(
        default_factory=SnapshotConfig, description="how `cdc snapshot` copies tables"
    )

    # Where the file was loaded from; relative paths resolve against its directory.
    base_dir: Path = Field(default=Path("."), exclude=True)
    # The file as given on the command line: printed remedies name it so they run as written.
    file: str = Field(default="PIPELINE", exclude=True)

    @model_validator(mode="after")
    def _kafka_files(self) -> Pipeline:
        """Kafka's certificate files, like every path, are relative to the pipeline file."""
        kafka = self.log.kafka if self.log else None
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if kafka is not None and getattr(kafka, key):
                object.__setattr__(kafka, key, str(self.path(getattr(kafka, key))))  # frozen model
        return self

    @model_validator(mode="after")
    def _sink_files(self) -> Pipeline:
        """The sinks' files (certificates) too."""
        for sink in self.sinks:
            settings = sink.settings
            for key in settings.file_keys:
                if getattr(settings, key):
                    object.__setattr__(settings, key, str(self.path(getattr(settings, key))))
        return self

    @model_validator(mode="after")
    def _unique_sinks(self) -> Pipeline:
        seen: set[str] = set()
        for sink in self.sinks:
            if sink.name in seen:
                raise ValueError(f"two sinks are named {sink.name!r}")
            seen.add(sink.name)
        return self

    @model_validator(mode="after")
    def _views_named(self) -> Pipeline:
        """View names are unique, sinks name declared views, and no captured schema is called
        `views` (a view is followed as the table views.<name>: the two would share names)."""
        declared: list[str] = []
        for i, view in enumerate(self.views):
            if view.name in declared:
                raise ValueError(f"views.{i}.name: two views are named {view.name!r}")
            declared.append(view.name)
        for sink in self.sinks:
            for name in sink_views(sink):
                if name not in declared:
                    close = difflib.get_close_matches(name, declared, n=1, cutoff=0.6)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    known = ", ".join(declared) or "none are declared under the top-level `views:`"
                    raise ValueError(
                        f"sinks.{sink.name}.{sink.kind}.views: unknown view {name!r}{hint} (views: {known})"
                    )
        clash = [t for t in self.source.postgres.tables if TableSelector.parse(t).schema == VIEW_SCHEMA]
        if self.views and clash:
            raise ValueError(
                f"source.postgres.tables: {', '.join(clash)} is in a schema named {VIEW_SCHEMA!r}, the name under which "
                "derived views are followed (views.<name>); capture it through a view of another name or drop `views:`"
            )
        return self

    @model_validator(mode="after")
    def _sink_table_options(self) -> Pipeline:
        """table_options name tables of their sink (a typo would leave a column unmasked), and a
        rename never takes a schema's directory (Delta and tantivy keep <path>/<schema>/<table>)."""
        for sink in self.sinks:
            settings = sink.settings
            chosen = settings.tables or ([] if settings.views else self.source.postgres.tables)
            selectors = [TableSelector.parse(t) for t in chosen]
            where = f"sinks.{sink.name}.{sink.kind}.table_options"
            for table, options in settings.table_options.items():
                if not any(s.matches(TableName.parse(table)) for s in selectors):
                    close = difflib.get_close_matches(table, chosen, n=1, cutoff=0.6)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(
                        f"{where}: table {table} is not among this sink's tables ({', '.join(chosen)}){hint}"
                    )
                schemas = {s.schema for s in selectors} | ({VIEW_SCHEMA} if settings.views else set())
                if options.rename in schemas:
                    raise ValueError(
                        f"{where}: {table}: rename {options.rename!r} is the name of a schema whose tables this sink "
                        "follows (their directories are <path>/<schema>/<table>); choose another name"
                    )
        return self

    # -- resolved values -------------------------------------------------------------------------
    def path(self, value: str | os.PathLike[str]) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else (self.base_dir / p)

    @property
    def state_path(self) -> Path:
        return self.path(self.state_dir or f".cdc/{self.name}")

    def command(self, verb: str, *args: str) -> str:
        """`cdc VERB <this pipeline file> ARGS`, shell-quoted, for `fix:` lines that run as printed."""
        return " ".join(["cdc", verb, shlex.quote(self.file), *args])

    @property
    def slot(self) -> str:
        return self.source.postgres.slot or f"cdc_{self.name}"

    @property
    def publication(self) -> str:
        return self.source.postgres.publication or f"cdc_{self.name}"

    @property
    def log_config(self) -> LogConfig:
        return self.log or LogConfig(local=LocalLog())

    @property
    def local_log_path(self) -> Path:
        """The embedded log; with `log: kafka` it is the staging log the publisher reads."""
        local = self.log_config.local
        if local is None:
            return self.state_path / "staging"
        return self.path(local.path) if local.path else self.state_path / "log"

    @property
    def table_selectors(self) -> list[TableSelector]:
        return [TableSelector.parse(t) for t in self.source.postgres.tables]

    def state_dir_problems(self) -> list[tuple[str, str]]:
        """(problem, fix) for each directory of ours (state_dir, the local log) that cannot be
        created or written. Checks only: nothing is created."""
        dirs = {"state_dir": self.state_path, "log.local.path": self.local_log_path}
        if self.log_config.local is None or not self.log_config.local.path:
            dirs.pop("log.local.path")  # under state_dir
        problems = []
        for key, path in dirs.items():
            why = directory_problem(path)
            if why:
                problems.append(
                    (
                        f"{key} {path}: {why}",
                        f"set {key} in the pipeline file to a directory this user can create and write, "
                        "or make that one so",
                    )
                )
        return problems

    def check_state_dir(self) -> None:
        """Raise PipelineFileError (exit 2) when state_dir or the log directory cannot be used."""
        problems = self.state_dir_problems()
        if problems:
            raise PipelineFileError("; ".join(p for p, _ in problems), problems[0][1])

    def view(self, name: str) -> ViewConfig:
        for view in self.views:
            if view.name == name:
                return view
        known = ", ".join(v.name for v in self.views) or "none"
        raise PipelineFileError(f"no view named {name!r} in pipeline {self.name!r} (views: {known})")

    def sink(self, name: str) -> SinkConfig:
        for sink in self.sinks:
            if sink.name == name:
                return sink
        known = ", ".join(s.name for s in self.sinks) or "none"
        raise PipelineFileError(f"no sink named {name!r} in pipeline {self.name!r} (sinks: {known})")

    def sink_of_kind(self, kind: str, name: str | None, example: str) -> SinkConfig:
        """For commands that read one kind of follower (`cdc sql`: delta, `cdc search`: search): the
        sink named `name`, which must be of that kind, or else the pipeline's first of that kind.
        `example` shows the settings of such a sink in the fix line."""
        if name:
            cfg = self.sink(name)
            if cfg.kind != kind:
                raise UsageError(
                    f"sink {name!r} is a {cfg.kind} sink, not a {kind} sink",
                    f"name a {kind} sink with --sink",
                )
            return cfg
        for cfg in self.sinks:
            if cfg.kind == kind:
                return cfg
        raise UsageError(f"pipeline {self.name} has no {kind} sink", f"add a sink with `{example}`")


def pipeline_model(kinds: Mapping[str, tuple[type[SinkSettings], str]], module: str) -> type[Pipeline]:
    """The pipeline file's model with these follower kinds: kind key -> (its settings model, its
    description in the reference). The sinks layer builds it from its registry (sinks/registry.py).
    The models keep the names Pipeline and SinkConfig (pydantic's messages say them); pickle finds
    them as `module`.PipelineModel and `module`.SinkConfigModel, which the caller keeps."""
    keys: dict[str, Any] = {
        kind: (settings | None, Field(default=None, description=description))
        for kind, (settings, description) in kinds.items()
    }
    # pydantic lists fields base first along the MRO: name, the kinds, then SinkConfig's own keys
    # (the order of the reference and of pydantic's messages)
    kind_keys = create_model("SinkKinds", __base__=_SinkName, __module__=module, **keys)
    # create_model types a tuple of bases as its first: the model is a SinkConfig all the same
    sink_config = cast(
        "type[SinkConfig]", create_model("SinkConfig", __base__=(SinkConfig, kind_keys), __module__=module)
    )
    sink_config.kinds = tuple(kinds)
    sink_config.__qualname__ = "SinkConfigModel"
    sinks = Pipeline.model_fields["sinks"]
    pipeline = create_model(
        "Pipeline",
        __base__=Pipeline,
        __module__=module,
        sinks=(list[sink_config], Field(default_factory=list, description=sinks.description)),  # type: ignore[valid-type]
    )
    pipeline.sink_config = sink_config
    pipeline.__qualname__ = "PipelineModel"
    return pipeline


def pipeline_tables(pipeline: Pipeline, tables: list[TableName]) -> list[TableName]:
    """The tables of `tables` the pipeline file names in source.postgres.tables. The log may hold
    more (a table removed from the file, or renamed away): followers follow the file."""
    selectors = pipeline.table_selectors
    return [t for t in tables if any(s.matches(t) for s in selectors)]


def directory_problem(path: Path) -> str | None:
    """Why `path` cannot be used as a directory we create (if needed) and write, or None."""
    existing = path
    while not existing.exists():  # False below a regular file too (NotADirectoryError)
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        return (
            "is a file, not a directory"
            if existing == path
            else f"cannot be created: {existing} is a file, not a directory"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "is" if existing == path else f"cannot be created: {existing} is"
        return f"{where} not writable (permissions or a read-only file system)"
    return None


def sink_tables(sink: SinkConfig, all_tables: list[TableName]) -> list[TableName]:
    """The source tables a sink follows: its own `tables` selection, or all of them (none for a
    sink that names views and no tables)."""
    chosen = sink.settings.tables
    if not chosen:
        return [] if sink.settings.views else list(all_tables)
    selectors = [TableSelector.parse(t) for t in chosen]
    return [t for t in all_tables if any(s.matches(t) for s in selectors)]


def sink_views(sink: SinkConfig) -> list[str]:
    """The names of the derived views a sink follows (as tables views.<name>), in file order."""
    return list(sink.settings.views)
