"""The pipeline file (README "Pipeline file reference"): YAML -> validated, defaulted model.

Strict on purpose: unknown keys, wrong types and missing required keys are errors naming
the file, the key path and what was expected. `${VAR}` and `${VAR:-default}` in string
values are taken from the environment (`$$` is a literal `$`), or from the file `$VAR_FILE` names
(a mounted secret, trailing newline stripped). Relative paths are relative
to the directory holding the pipeline file.

Here: the pipeline-level model (source, log, views, runtime knobs, a `sinks:` entry's common
keys) and loading. Each follower kind's settings live beside the kind (sinks/<kind>/settings.py)
and are registered in sinks/registry.py, whose load_pipeline/parse_pipeline read files with them.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, Union, cast, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model, field_validator, model_validator
from pydantic_core import ErrorDetails

from cdc.ground.errors import PipelineFileError, UsageError
from cdc.ground.settings import NAME_RE, SinkSettings, Strict, TableList, check_tables, options_of
from cdc.ground.tables import TableName, TableSelector

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


# --- source ---------------------------------------------------------------------------------------
class SourceTableOptions(Strict):
    """What of one table leaves PostgreSQL (README "Choosing what is captured"): pushed down as the
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


# --- log ------------------------------------------------------------------------------------------
class LocalLog(Strict):
    path: str | None = Field(
        default=None, description="directory of the SQLite log (default <state_dir>/log)"
    )
    synchronous: Literal["full", "normal"] = Field(
        default="full",
        description="SQLite fsync policy: full survives power loss, normal survives process crashes",
    )
    # Cut retention (cdc/log/local.py): the newest keep_cuts always, older ones while a follower's
    # position (checkpoint, view state) still needs them, up to the bound; past it they go, loudly.
    keep_cuts: int = Field(
        default=200, ge=10, description="newest cuts always kept (rewind targets of `cdc reset --to-cut`)"
    )
    held_cuts_max: int = Field(
        default=1_000_000,
        ge=10,
        description="most cuts a lagging follower may hold back (then the oldest go, with an alarm)",
    )
    held_cuts_max_age_s: float = Field(
        default=86_400,
        gt=0,
        description="oldest cut a lagging follower may hold back, in seconds (then older ones go, with an alarm)",
    )


class KafkaLog(Strict):
    bootstrap_servers: str | list[str] = Field(description='"host:port" (comma-separated) or a list of them')
    topic_prefix: str | None = Field(default=None, description="topic prefix (default: the pipeline name)")
    format: Literal["cdc", "debezium"] = Field(
        default="cdc",
        description="cdc: topics written by `cdc stream`; debezium: consume existing Debezium topics",
    )
    replication_factor: int = Field(
        default=1, ge=1, description="replication factor of topics we create (3 in production)"
    )
    topic_config: dict[str, str] = Field(
        default_factory=dict,
        description="extra/overriding configs of the table topics (e.g. delete.retention.ms)",
    )
    fix_cleanup_policy: bool = Field(
        default=False,
        description="change existing topics with cleanup.policy=delete to compact instead of refusing",
    )
    publisher_workers: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="processes rendering large backlogs and snapshots for Kafka (default: none with the C speedup, else one per core, up to 4)",
    )
    transaction_topic: str | None = Field(
        default=None,
        description="debezium: the connector's transaction metadata topic (default <prefix>.transaction)",
    )
    dead_letter: str | None = Field(
        default=None,
        description="debezium: Delta table path where malformed records are parked (default: stop)",
    )
    # Security (README Security): one place, passed to every Kafka client of the tool
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="how clients talk to the brokers (SASL_SSL for managed Kafka)"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None, description="SASL_*: the mechanism the brokers enable"
    )
    sasl_username: str | None = Field(default=None, description="SASL_*: the user (e.g. ${KAFKA_USER})")
    sasl_password: str | None = Field(
        default=None, repr=False, description="SASL_*: its password, from ${ENV}"
    )
    ssl_cafile: str | None = Field(
        default=None, description="SSL/SASL_SSL: PEM CA file (default: the system's CAs)"
    )
    ssl_certfile: str | None = Field(
        default=None, description="SSL/SASL_SSL: client certificate (PEM), for mTLS"
    )
    ssl_keyfile: str | None = Field(
        default=None, description="SSL/SASL_SSL: the client certificate's key (PEM, unencrypted PKCS#8)"
    )
    ssl_check_hostname: bool = Field(
        default=True, description="check that the broker's certificate names the host"
    )

    @model_validator(mode="after")
    def _security(self) -> KafkaLog:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and not (self.sasl_mechanism and self.sasl_username and self.sasl_password):
            raise ValueError(
                f"security_protocol {self.security_protocol} needs sasl_mechanism, sasl_username and sasl_password"
            )
        if not sasl and (self.sasl_mechanism or self.sasl_username or self.sasl_password):
            raise ValueError("sasl_* settings need security_protocol SASL_SSL (or SASL_PLAINTEXT)")
        ssl_files = [k for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if getattr(self, k)]
        if ssl_files and not self.security_protocol.endswith("SSL"):
            verb = "needs" if len(ssl_files) == 1 else "need"
            raise ValueError(f"{', '.join(ssl_files)} {verb} security_protocol SSL or SASL_SSL")
        if bool(self.ssl_certfile) != bool(self.ssl_keyfile):
            raise ValueError("ssl_certfile and ssl_keyfile go together (a client certificate and its key)")
        return self


class LogConfig(Strict):
    local: LocalLog | None = Field(
        default=None, description="the embedded SQLite log (the default when `log` is left out)"
    )
    kafka: KafkaLog | None = Field(
        default=None, description="Kafka topics (give exactly one of local and kafka)"
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> LogConfig:
        if (self.local is None) == (self.kafka is None):
            raise ValueError("give exactly one of `local` or `kafka`")
        return self


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
        "from the follower (delta mode scd1 and redis; docs/schema-changes.md)",
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
                "dropped_columns: null and drop are for delta sinks with mode scd1 and redis sinks "
                "(scd2 keeps every version's values, search keeps the field, iceberg: not yet): use keep"
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


# --- runtime knobs --------------------------------------------------------------------------------
class SparkConfig(Strict):
    master: str = Field(default="local[2]", description="Spark master URL")
    conf: dict[str, str | int | float | bool] = Field(default_factory=dict, description="extra Spark confs")
    trigger_interval_s: float = Field(
        default=5.0, gt=0, description="continuous apply: seconds between batches"
    )
    follower_check_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="continuous apply: seconds between self-checks of a follower with no new cut (its tables and "
        "markers still in the engine); a new cut and `cdc apply --once` always check; 0 = every round",
    )
    stall_timeout_s: float = Field(
        default=900.0,
        ge=0,
        description="end an apply (exit 4, for its supervisor to start it again) when nothing moves for this long "
        "while a cut is applied: no Spark task finished, no job or step began or ended; 0 = never",
    )
    apply_parallelism: int | None = Field(
        default=None,
        ge=1,
        description="tables of a cut applied at the same time per sink (driver threads); "
        "default twice Spark's default parallelism, at least 2; 1 = one after another",
    )
    # Security on a cluster (README "Running on a cluster"): the secret reaches the driver's JVM over
    # py4j, never its command line, and is masked in messages.
    secret: str | None = Field(
        default=None,
        repr=False,
        description="spark.authenticate secret shared with the cluster, from ${ENV} (turns authentication on)",
    )
    encrypt: bool = Field(
        default=True,
        description="with `secret`: encrypt RPC (spark.network.crypto) and local shuffle/spill files",
    )
    # README "Secrets on the executors": the sinks' passwords reach executors by environment, not in tasks
    executor_secrets: Literal["conf", "workers"] = Field(
        default="conf",
        description="how executors on a cluster get the sinks' passwords (variables CDC_SECRET_<SINK>_<FIELD>): "
        "conf: the driver sets spark.executorEnv.<VAR> (values redacted in Spark's UI); workers: the workers' "
        "own environment (conf/spark-env.sh) has them, the driver sends nothing. Local masters: from the driver",
    )


class StreamConfig(Strict):
    batch_max_events: int = Field(
        default=20000, gt=0, description="commit to the log after this many events..."
    )
    batch_max_seconds: float = Field(
        default=0.5, gt=0, description="...or this many seconds, at a transaction boundary"
    )
    status_interval_s: float = Field(default=10.0, gt=0, description="seconds between standby status updates")
    reconnect_timeout_s: float = Field(
        default=300.0,
        ge=0,
        description="after losing the source connection, keep reconnecting (with backoff) this long before "
        "giving up with exit 3; 0 gives up at once",
    )


SnapshotMode = Literal["auto", "exported", "chunked"]


class SnapshotConfig(Strict):
    """How `cdc snapshot` copies tables (README "Snapshots of big tables")."""

    mode: SnapshotMode = Field(
        default="auto",
        description="exported: every table inside the slot's exported snapshot (one long transaction); chunked: "
        "key-ordered chunks in short transactions between WAL watermarks, resumable per chunk; auto: chunked for "
        "tables with an orderable key and at least auto_min_rows rows, exported otherwise",
    )
    tables: dict[str, SnapshotMode] = Field(
        default_factory=dict, description="per table (schema-qualified name): its mode, overriding `mode`"
    )
    chunk_rows: int = Field(default=100_000, gt=0, description="rows per chunk (one short transaction each)")
    max_rows_per_s: float | None = Field(
        default=None,
        gt=0,
        description="chunked: copy at most this many rows per second (default: unthrottled)",
    )
    auto_min_rows: int = Field(
        default=1_000_000,
        ge=0,
        description="auto: tables estimated (pg_class.reltuples) at this many rows or more are chunked",
    )

    @field_validator("tables")
    @classmethod
    def _table_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            TableName.parse(key)  # raises ValueError with a readable message
        return value

    def mode_for(self, table: TableName) -> str:
        for key, mode in self.tables.items():
            if TableName.parse(key) == table:
                return mode
        return self.mode


class MetricsConfig(Strict):
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="serve Prometheus metrics on this port (stream, apply, run, snapshot); default: off",
    )
    host: str = Field(
        default="127.0.0.1", description="address the metrics endpoint binds (0.0.0.0: every interface)"
    )


# --- derived views -------------------------------------------------------------------------------
VIEW_SCHEMA = "views"  # a view is followed as the table views.<name>


class ViewConfig(Strict):
    """A derived view (README "Derived views"): Spark SQL over the captured tables, kept up to date
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
        default=None, description="checkpoints, locks and the local log (default .cdc/<name>)"
    )
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


# --- loading --------------------------------------------------------------------------------------
def interpolate(value: Any, where: str = "") -> Any:
    """Replace ${VAR} / ${VAR:-default} in every string of a parsed YAML tree."""
    if isinstance(value, dict):
        return {k: interpolate(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, f"{where}.{i}") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        var, default = match.group(1), match.group(2)
        from_file = secret_file(var, where)
        if from_file is not None:
            return from_file
        if var in os.environ:
            return os.environ[var]
        if default is not None:
            return default
        raise PipelineFileError(
            f"{where}: environment variable {var} is not set",
            f"export {var}=..., or {var}_FILE=<a file holding the value>, or write ${{{var}:-default}} in the pipeline file",
        )

    return _VAR.sub(sub, value)


def secret_file(var: str, where: str) -> str | None:
    """${VAR} from the file $VAR_FILE names (a secret as container orchestrators mount it), its
    trailing newline stripped; None when VAR_FILE is not set. Setting both is ambiguous: an error."""
    path = os.environ.get(f"{var}_FILE")
    if path is None:
        return None
    if var in os.environ:
        raise PipelineFileError(
            f"{where}: both {var} and {var}_FILE are set (the value would be ambiguous)",
            f"unset one of them: {var} holds the value itself, {var}_FILE the path of a file holding it",
        )
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise PipelineFileError(
            f"{where}: ${{{var}}} is read from {var}_FILE={path}, which cannot be read ({why})",
            f"put the secret in that file, readable by this user (mode 0600 or 0400), or point {var}_FILE at the file holding it",
        ) from None
    return text.rstrip("\r\n")  # `echo pw > file` and editors add a newline the secret does not have


def _models_in(tp: Any) -> list[Any]:
    """The types a (possibly Optional / Union / Annotated) annotation can hold."""
    if get_origin(tp) is Annotated:
        return _models_in(get_args(tp)[0])
    if get_origin(tp) in (Union, UnionType):
        return [m for arg in get_args(tp) for m in _models_in(arg)]
    return [tp]


def keys_at(model: type[Pipeline], loc: tuple[Any, ...]) -> list[str]:
    """The keys the pipeline file allows in the mapping at `loc` (a pydantic error location);
    union tags pydantic puts into locations are stepped over."""
    current: list[Any] = [model]
    for part in loc:
        following: list[Any] = []
        for tp in (m for c in current for m in _models_in(c)):
            origin, args = get_origin(tp), get_args(tp)
            if isinstance(part, int) and origin is list and args:
                following.append(args[0])
            elif isinstance(part, str) and isinstance(tp, type) and issubclass(tp, BaseModel):
                field = tp.model_fields.get(part)
                if field is not None:
                    following.append(field.annotation)
            elif isinstance(part, str) and origin is dict and len(args) == 2:
                following.append(args[1])
        if following:
            current = following  # else: a union tag in the location, not a key
    keys: list[str] = []
    for tp in (m for c in current for m in _models_in(c)):
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            keys += [f.alias or name for name, f in tp.model_fields.items()]
    return keys


_SECRET_KEYS = frozenset({"mask_key", "sasl_password", "password"})


def _describe(error: ErrorDetails, model: type[Pipeline]) -> str:
    loc = ".".join(str(p) for p in error["loc"]) or "(top level)"
    kind, msg = error["type"], error["msg"]
    if kind == "extra_forbidden":
        parent, key = loc.rpartition(".")[0], error["loc"][-1]
        # a typo (stat_dir, mdoe) gets the key it most likely meant
        close = difflib.get_close_matches(str(key), keys_at(model, tuple(error["loc"][:-1])), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{parent or '(top level)'}: unknown key {key!r}{hint}"
    if kind == "missing":
        return f"{loc}: required key is missing"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    got = error.get("input")
    secret = bool(error["loc"]) and error["loc"][-1] in _SECRET_KEYS  # a wrong secret is still a secret
    shown = "" if isinstance(got, dict | list) or got is None or secret else f" (got {got!r})"
    return f"{loc}: {msg}{shown}"


def parse_pipeline(
    data: Any, source: str = "<pipeline>", base_dir: Path | None = None, *, model: type[Pipeline]
) -> Pipeline:
    """The pipeline file's parsed YAML as `model` (pipeline_model(): sinks/registry.py's
    parse_pipeline and load_pipeline give the follower kinds)."""
    if not isinstance(data, dict):
        raise PipelineFileError(f"{source}: the pipeline file must be a YAML mapping (name:, source:, ...)")
    try:
        data = interpolate(data)
    except PipelineFileError as exc:
        raise PipelineFileError(f"{source}: {exc.problem}", exc.fix) from None
    try:
        # base_dir first: validators resolve relative paths (certificate files) against it
        pipeline = model.model_validate(data | {"base_dir": base_dir or Path(".")})
    except ValidationError as exc:
        lines = [_describe(e, model) for e in exc.errors()]
        raise PipelineFileError(
            f"{source}: invalid pipeline file:\n  " + "\n  ".join(lines),
            "see docs/reference/pipeline-file.md",
        ) from None
    return pipeline.model_copy(update={"base_dir": base_dir or Path(".")})


def load_pipeline(path: str | os.PathLike[str], *, model: type[Pipeline]) -> Pipeline:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PipelineFileError(
            f"pipeline file {file} does not exist", "check the path (relative to the current directory)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineFileError(f"cannot read pipeline file {file}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise PipelineFileError(
            f"{file}: not valid YAML{at}: {problem}",
            "fix the YAML syntax there (indentation, a missing ':', an unclosed bracket or quote)",
        ) from None
    pipeline = parse_pipeline(data, str(file), file.resolve().parent, model=model)
    return pipeline.model_copy(update={"file": str(path)})
