"""The pipeline file (README "Pipeline file reference"): YAML -> validated, defaulted model.

Strict on purpose: unknown keys, wrong types and missing required keys are errors naming
the file, the key path and what was expected. `${VAR}` and `${VAR:-default}` in string
values are taken from the environment (`$$` is a literal `$`), or from the file `$VAR_FILE` names
(a mounted secret, trailing newline stripped). Relative paths are relative
to the directory holding the pipeline file.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cdc.ground.errors import PipelineFileError, UsageError
from cdc.ground.tables import TableName, TableSelector

NAME_RE = r"^[a-z][a-z0-9_]*$"
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


def _check_tables(values: list[str] | None) -> list[str] | None:
    for value in values or []:
        TableSelector.parse(value)  # raises ValueError with a readable message
    return values


TableList = Annotated[list[str], Field(min_length=1)]


# --- source ---------------------------------------------------------------------------------------
def options_of(table_options: dict[str, Any], table: TableName) -> Any:
    """The `table_options` entry naming `table`, source's or a sink's (keys are parsed, so quoting
    and case follow SQL); None when the table has none."""
    for key, options in table_options.items():
        if TableName.parse(key) == table:
            return options
    return None


class SourceTableOptions(_Strict):
    """What of one table leaves PostgreSQL (README "Choosing what is captured"): pushed down as the
    publication's column list and row filter (PostgreSQL 15 or later) and used by the snapshot's COPY."""

    columns: list[str] | None = Field(default=None, min_length=1, description="capture only these columns")
    exclude_columns: list[str] | None = Field(default=None, min_length=1, description="capture every column but these")
    where: str | None = Field(
        default=None, min_length=1, description="SQL predicate over replica identity columns: only rows that match are captured"
    )

    @model_validator(mode="after")
    def _one_list(self) -> SourceTableOptions:
        if self.columns is not None and self.exclude_columns is not None:
            raise ValueError("give `columns` or `exclude_columns`, not both")
        for name in (self.columns or []) + (self.exclude_columns or []):
            if not name:
                raise ValueError("empty column name")
        return self


class PostgresSource(_Strict):
    dsn: str = Field(description="libpq connection string or postgresql:// URI")
    tables: TableList = Field(description='schema-qualified tables; "schema.*" for every table of a schema')
    slot: str | None = Field(default=None, pattern=NAME_RE, description="replication slot (default cdc_<name>)")
    publication: str | None = Field(default=None, pattern=NAME_RE, description="publication (default cdc_<name>)")
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

    _tables = field_validator("tables")(_check_tables)

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


class Source(_Strict):
    postgres: PostgresSource = Field(description="the PostgreSQL database captured")


# --- log ------------------------------------------------------------------------------------------
class LocalLog(_Strict):
    path: str | None = Field(default=None, description="directory of the SQLite log (default <state_dir>/log)")
    synchronous: Literal["full", "normal"] = Field(
        default="full", description="SQLite fsync policy: full survives power loss, normal survives process crashes"
    )
    # Cut retention (cdc/log/local.py): the newest keep_cuts always, older ones while a follower's
    # position (checkpoint, view state) still needs them, up to the bound; past it they go, loudly.
    keep_cuts: int = Field(default=200, ge=10, description="newest cuts always kept (rewind targets of `cdc reset --to-cut`)")
    held_cuts_max: int = Field(
        default=1_000_000, ge=10, description="most cuts a lagging follower may hold back (then the oldest go, with an alarm)"
    )
    held_cuts_max_age_s: float = Field(
        default=86_400, gt=0, description="oldest cut a lagging follower may hold back, in seconds (then older ones go, with an alarm)"
    )


class KafkaLog(_Strict):
    bootstrap_servers: str | list[str] = Field(description='"host:port" (comma-separated) or a list of them')
    topic_prefix: str | None = Field(default=None, description="topic prefix (default: the pipeline name)")
    format: Literal["cdc", "debezium"] = Field(
        default="cdc", description="cdc: topics written by `cdc stream`; debezium: consume existing Debezium topics"
    )
    replication_factor: int = Field(default=1, ge=1, description="replication factor of topics we create (3 in production)")
    topic_config: dict[str, str] = Field(
        default_factory=dict, description="extra/overriding configs of the table topics (e.g. delete.retention.ms)"
    )
    fix_cleanup_policy: bool = Field(
        default=False, description="change existing topics with cleanup.policy=delete to compact instead of refusing"
    )
    publisher_workers: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="processes rendering large backlogs and snapshots for Kafka (default: none with the C speedup, else one per core, up to 4)",
    )
    transaction_topic: str | None = Field(
        default=None, description="debezium: the connector's transaction metadata topic (default <prefix>.transaction)"
    )
    dead_letter: str | None = Field(
        default=None, description="debezium: Delta table path where malformed records are parked (default: stop)"
    )
    # Security (README Security): one place, passed to every Kafka client of the tool
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="how clients talk to the brokers (SASL_SSL for managed Kafka)"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None, description="SASL_*: the mechanism the brokers enable"
    )
    sasl_username: str | None = Field(default=None, description="SASL_*: the user (e.g. ${KAFKA_USER})")
    sasl_password: str | None = Field(default=None, repr=False, description="SASL_*: its password, from ${ENV}")
    ssl_cafile: str | None = Field(default=None, description="SSL/SASL_SSL: PEM CA file (default: the system's CAs)")
    ssl_certfile: str | None = Field(default=None, description="SSL/SASL_SSL: client certificate (PEM), for mTLS")
    ssl_keyfile: str | None = Field(default=None, description="SSL/SASL_SSL: the client certificate's key (PEM, unencrypted PKCS#8)")
    ssl_check_hostname: bool = Field(default=True, description="check that the broker's certificate names the host")

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


class LogConfig(_Strict):
    local: LocalLog | None = Field(default=None, description="the embedded SQLite log (the default when `log` is left out)")
    kafka: KafkaLog | None = Field(default=None, description="Kafka topics (give exactly one of local and kafka)")

    @model_validator(mode="after")
    def _exactly_one(self) -> LogConfig:
        if (self.local is None) == (self.kafka is None):
            raise ValueError("give exactly one of `local` or `kafka`")
        return self


# --- sinks ----------------------------------------------------------------------------------------
MaskKind = Literal["hash", "redact", "null"]
# A renamed table's name in every sink kind: a Delta/tantivy directory, an OpenSearch index, a Redis key prefix.
RENAME_RE = r"^[a-z0-9][a-z0-9_.-]*$"
MIN_MASK_KEY = 16


class SinkTableOptions(_Strict):
    """What one sink gets of one table (README "Choosing what is captured"); applied by sinks/shaping.py."""

    columns: list[str] | None = Field(default=None, min_length=1, description="only these columns (key columns always)")
    exclude_columns: list[str] | None = Field(default=None, min_length=1, description="every column but these")
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
                raise ValueError(f"mask: column {column!r} is excluded (exclude_columns), so there is nothing to mask")
        return self


class _ShapedSink(_Strict):
    """Per-table columns, masks and renames, common to every sink kind."""

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
    def _options(self) -> _ShapedSink:
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


def _view_names(values: list[str]) -> list[str]:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"view {value!r} is named twice")
        seen.add(value)
    return values


# Every sink kind may follow derived views (README "Derived views"): named here, declared in `views:`.
def _view_list() -> Any:
    return Field(
        default_factory=list,
        description="derived views (names from the top-level `views:`) this sink follows, as tables views.<name>; "
        "a sink naming views and no `tables` follows only its views",
    )


class DeltaSink(_ShapedSink):
    path: str = Field(description="directory of the Delta tables (a table is <path>/<schema>/<table>)")
    mode: Literal["scd1", "scd2"] = Field(
        default="scd1", description="scd1: the current row per key; scd2: every version, with _cdc_start_lsn/_cdc_end_lsn"
    )
    tables: list[str] | None = Field(
        default=None, description="subset of the source tables (default: all, or none when `views` is given)"
    )
    views: list[str] = _view_list()
    # Table features (README "Reading the lake"): every feature a table takes on costs readers.
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

    _tables = field_validator("tables")(_check_tables)
    _views = field_validator("views")(_view_names)


SearchFieldType = Literal[
    "text", "keyword", "long", "integer", "short", "double", "float", "boolean", "date", "binary", "stored"
]


class AwsSigV4(_Strict):
    region: str = Field(min_length=1, description="the AWS region of the domain or collection (e.g. eu-west-1)")
    service: Literal["es", "aoss"] = Field(
        default="es", description="es: an Amazon OpenSearch Service domain; aoss: an OpenSearch Serverless collection"
    )


class SearchSink(_ShapedSink):
    engine: Literal["tantivy", "opensearch"] = Field(
        default="tantivy", description="tantivy: an embedded index on disk; opensearch: a cluster at `hosts`"
    )
    tables: TableList | None = Field(default=None, description="required unless `views` is given")
    views: list[str] = _view_list()
    path: str | None = Field(default=None, description="tantivy: index directory (default <state_dir>/search)")
    hosts: list[str] | None = Field(default=None, description="opensearch: node URLs")
    index_prefix: str | None = Field(default=None, description="opensearch: index name prefix (default: pipeline name)")
    fields: dict[str, dict[str, SearchFieldType]] = Field(
        default_factory=dict,
        description="per table, per column: the field type instead of the one derived from the source type "
        "(text: tokenized, keyword: exact, long/integer/short/double/float/boolean/date, binary or stored: kept, not searchable); "
        'e.g. {"public.customers": {"email": "keyword"}}',
    )
    gc_deletes: str = Field(
        default="7d",
        pattern=r"^[0-9]+(ms|s|m|h|d)$",
        description="opensearch: how long a deleted document's version is remembered (index.gc_deletes); a write "
        "older than a delete and arriving later than this could bring the document back",
    )
    shards: int | None = Field(
        default=None, ge=1, description="opensearch: primary shards of new indices (default 1)"
    )
    replicas: int | None = Field(
        default=None, ge=0, description="opensearch: replicas of new indices (default: the cluster's)"
    )
    bulk_actions: int = Field(
        default=1000, ge=1, le=100_000, description="opensearch: documents per bulk request"
    )
    timeout_s: float = Field(default=60.0, gt=0, description="opensearch: seconds a request may take")
    # Security (README Security): passed to every OpenSearch client of the tool (driver and executors)
    username: str | None = Field(default=None, description="opensearch: HTTP basic auth user (e.g. ${OPENSEARCH_USER})")
    password: str | None = Field(default=None, repr=False, description="opensearch: its password, from ${ENV}")
    ca_file: str | None = Field(default=None, description="opensearch: PEM CA file for https hosts (default: the system's CAs)")
    client_cert: str | None = Field(default=None, description="opensearch: client certificate (PEM), for mTLS")
    client_key: str | None = Field(default=None, description="opensearch: the client certificate's key (PEM, unencrypted)")
    verify_certs: bool = Field(
        default=True, description="opensearch: check the nodes' certificates (and that they name the host)"
    )
    aws_sigv4: AwsSigV4 | None = Field(
        default=None,
        description="opensearch: sign requests with AWS SigV4 (Amazon OpenSearch Service / Serverless); "
        "credentials from the standard AWS chain (env, profile, role); needs boto3",
    )

    _tables = field_validator("tables")(_check_tables)
    _views = field_validator("views")(_view_names)

    @model_validator(mode="after")
    def _engine_options(self) -> SearchSink:
        _tables_or_views(self)
        if self.engine == "opensearch" and not self.hosts:
            raise ValueError("engine opensearch needs `hosts`")
        security = ("username", "password", "ca_file", "client_cert", "client_key", "aws_sigv4")
        given = [k for k in security if getattr(self, k) is not None]
        if self.engine != "opensearch" and (given or not self.verify_certs):
            raise ValueError(f"{', '.join(given) or 'verify_certs'}: only for engine opensearch")
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together (HTTP basic auth)")
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key go together (a client certificate and its key)")
        if self.aws_sigv4 is not None and self.username is not None:
            raise ValueError("aws_sigv4 and username/password exclude each other (one way to sign in)")
        selectors = [TableSelector.parse(t) for t in self.tables or []]
        for table, columns in self.fields.items():
            name = TableName.parse(table)  # raises ValueError with a readable message
            if not any(s.matches(name) for s in selectors):
                raise ValueError(f"fields: table {table} is not among this sink's `tables`")
            if not all(columns):
                raise ValueError(f"fields: {table}: empty column name")
        return self


class RedisSink(_ShapedSink):
    url: str = Field(description="redis:// (or rediss://) URL of the database, e.g. redis://127.0.0.1:6379/0")
    tables: TableList | None = Field(default=None, description="required unless `views` is given")
    views: list[str] = _view_list()
    key: str | None = Field(default=None, description="key template (default '{schema}.{table}:{pk}')")
    ttl: int | None = Field(default=None, gt=0, description="seconds a cached row lives (default: forever)")
    allow_eviction: bool = Field(
        default=False,
        description="accept a Redis maxmemory-policy that may evict the follower's keys (a cache whose rows may go missing)",
    )

    _tables = field_validator("tables")(_check_tables)
    _views = field_validator("views")(_view_names)

    @model_validator(mode="after")
    def _follows_something(self) -> RedisSink:
        _tables_or_views(self)
        return self


class IcebergCatalog(_Strict):
    """Where the Iceberg follower's tables are listed (README "Iceberg follower", catalogs)."""

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
    def _uri(self) -> IcebergCatalog:
        if self.type == "sqlite" and self.uri is not None:
            raise ValueError("catalog type sqlite keeps its file at <warehouse>/catalog.db: give no `uri`")
        if self.type != "sqlite" and not self.uri:
            raise ValueError(f"catalog type {self.type} needs `uri`")
        if self.type != "jdbc" and (self.user or self.password):
            raise ValueError("user and password are for catalog type jdbc")
        return self


class IcebergSink(_ShapedSink):
    """An Iceberg follower (sinks/iceberg/): one Iceberg table per source table, namespace = its schema."""

    warehouse: str = Field(description="where table files go: a path (relative to the pipeline file) or a URI")
    catalog: IcebergCatalog = Field(default_factory=IcebergCatalog, description="where the tables are registered")
    tables: list[str] | None = Field(default=None, description="subset of the source tables (default: all)")
    views: list[str] = Field(default_factory=list, description="derived views into Iceberg: not yet (give none)")
    write_mode: Literal["merge-on-read", "copy-on-write"] = Field(
        default="merge-on-read",
        description="how a MERGE changes a data file: merge-on-read writes position deletes (a small cut "
        "rewrites no file), copy-on-write rewrites the files it touches",
    )
    on_type_change: Literal["widen", "stop"] = Field(
        default="widen",
        description="a source column type Iceberg can widen (int -> bigint, float -> double, larger decimal "
        "precision): widen it in place (metadata only), or stop the apply",
    )

    _tables = field_validator("tables")(_check_tables)

    @field_validator("views")
    @classmethod
    def _no_views(cls, value: list[str]) -> list[str]:
        if value:
            raise ValueError("derived views into an Iceberg sink are not supported yet: follow them with a delta sink")
        return value


def _tables_or_views(settings: SearchSink | RedisSink) -> None:
    """Search and Redis sinks name what they follow: tables, views or both (no "every table" default)."""
    if not settings.tables and not settings.views:
        raise ValueError("give `tables` (source tables) or `views` (derived views), or both")


SINK_KINDS = ("delta", "search", "redis", "iceberg")


class SinkConfig(_Strict):
    name: str = Field(pattern=NAME_RE, description="the sink's name (`--sink NAME`; its checkpoint and metrics label)")
    delta: DeltaSink | None = Field(default=None, description="a Delta Lake follower (give exactly one sink kind)")
    search: SearchSink | None = Field(default=None, description="a search index follower (tantivy or OpenSearch)")
    redis: RedisSink | None = Field(default=None, description="a Redis cache follower")
    iceberg: IcebergSink | None = Field(default=None, description="an Iceberg follower")
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
        kinds = [k for k in SINK_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("give exactly one sink kind: `delta`, `iceberg`, `search` or `redis`")
        if self.dropped_columns != "keep" and (
            self.search is not None or self.iceberg is not None or (self.delta and self.delta.mode == "scd2")
        ):
            raise ValueError(
                "dropped_columns: null and drop are for delta sinks with mode scd1 and redis sinks "
                "(scd2 keeps every version's values, search keeps the field, iceberg: not yet): use keep"
            )
        return self

    @property
    def kind(self) -> str:
        return next(k for k in SINK_KINDS if getattr(self, k) is not None)

    @property
    def settings(self) -> DeltaSink | SearchSink | RedisSink | IcebergSink:
        return getattr(self, self.kind)


# --- runtime knobs --------------------------------------------------------------------------------
class SparkConfig(_Strict):
    master: str = Field(default="local[2]", description="Spark master URL")
    conf: dict[str, str | int | float | bool] = Field(default_factory=dict, description="extra Spark confs")
    trigger_interval_s: float = Field(default=5.0, gt=0, description="continuous apply: seconds between batches")
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
        default=True, description="with `secret`: encrypt RPC (spark.network.crypto) and local shuffle/spill files"
    )
    # README "Secrets on the executors": the sinks' passwords reach executors by environment, not in tasks
    executor_secrets: Literal["conf", "workers"] = Field(
        default="conf",
        description="how executors on a cluster get the sinks' passwords (variables CDC_SECRET_<SINK>_<FIELD>): "
        "conf: the driver sets spark.executorEnv.<VAR> (values redacted in Spark's UI); workers: the workers' "
        "own environment (conf/spark-env.sh) has them, the driver sends nothing. Local masters: from the driver",
    )


class StreamConfig(_Strict):
    batch_max_events: int = Field(default=20000, gt=0, description="commit to the log after this many events...")
    batch_max_seconds: float = Field(default=0.5, gt=0, description="...or this many seconds, at a transaction boundary")
    status_interval_s: float = Field(default=10.0, gt=0, description="seconds between standby status updates")
    reconnect_timeout_s: float = Field(
        default=300.0,
        ge=0,
        description="after losing the source connection, keep reconnecting (with backoff) this long before "
        "giving up with exit 3; 0 gives up at once",
    )


SnapshotMode = Literal["auto", "exported", "chunked"]


class SnapshotConfig(_Strict):
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
        default=None, gt=0, description="chunked: copy at most this many rows per second (default: unthrottled)"
    )
    auto_min_rows: int = Field(
        default=1_000_000, ge=0, description="auto: tables estimated (pg_class.reltuples) at this many rows or more are chunked"
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


class MetricsConfig(_Strict):
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="serve Prometheus metrics on this port (stream, apply, run, snapshot); default: off",
    )
    host: str = Field(default="127.0.0.1", description="address the metrics endpoint binds (0.0.0.0: every interface)")


# --- derived views -------------------------------------------------------------------------------
VIEW_SCHEMA = "views"  # a view is followed as the table views.<name>


class ViewConfig(_Strict):
    """A derived view (README "Derived views"): Spark SQL over the captured tables, kept up to date
    cut by cut (pipelines/views) and followed by sinks that name it in their `views`."""

    name: str = Field(pattern=NAME_RE, description="followed as the table views.<name>")
    sql: str = Field(min_length=1, description="one Spark SQL query over the captured tables, named schema.table")
    key: list[str] = Field(min_length=1, description="output columns that identify a view row (unique per row)")

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


class Pipeline(_Strict):
    name: str = Field(pattern=NAME_RE, description="the pipeline's name (default slot, publication and topic prefix)")
    source: Source = Field(description="where changes come from")
    log: LogConfig | None = Field(default=None, description="where captured changes are kept (default: local)")
    state_dir: str | None = Field(default=None, description="checkpoints, locks and the local log (default .cdc/<name>)")
    sinks: list[SinkConfig] = Field(default_factory=list, description="the followers")
    views: list[ViewConfig] = Field(default_factory=list, description="derived views over the captured tables")
    spark: SparkConfig = Field(default_factory=SparkConfig, description="the apply job's Spark")
    stream: StreamConfig = Field(default_factory=StreamConfig, description="`cdc stream` batching and reconnects")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="the Prometheus endpoint")
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig, description="how `cdc snapshot` copies tables")

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
    def _search_files(self) -> Pipeline:
        """The search sinks' certificate files too."""
        for sink in self.sinks:
            for key in ("ca_file", "client_cert", "client_key"):
                if sink.search is not None and getattr(sink.search, key):
                    object.__setattr__(sink.search, key, str(self.path(getattr(sink.search, key))))
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
                    raise ValueError(f"sinks.{sink.name}.{sink.kind}.views: unknown view {name!r}{hint} (views: {known})")
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
                    f"sink {name!r} is a {cfg.kind} sink, not a {kind} sink", f"name a {kind} sink with --sink"
                )
            return cfg
        for cfg in self.sinks:
            if cfg.kind == kind:
                return cfg
        raise UsageError(f"pipeline {self.name} has no {kind} sink", f"add a sink with `{example}`")


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
        return "is a file, not a directory" if existing == path else f"cannot be created: {existing} is a file, not a directory"
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


def keys_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys the pipeline file allows in the mapping at `loc` (a pydantic error location);
    union tags pydantic puts into locations are stepped over."""
    current: list[Any] = [Pipeline]
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


def _describe(error: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in error["loc"]) or "(top level)"
    kind, msg = error["type"], error["msg"]
    if kind == "extra_forbidden":
        parent, key = loc.rpartition(".")[0], error["loc"][-1]
        # a typo (stat_dir, mdoe) gets the key it most likely meant
        close = difflib.get_close_matches(str(key), keys_at(tuple(error["loc"][:-1])), n=1, cutoff=0.6)
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


def parse_pipeline(data: Any, source: str = "<pipeline>", base_dir: Path | None = None) -> Pipeline:
    if not isinstance(data, dict):
        raise PipelineFileError(f"{source}: the pipeline file must be a YAML mapping (name:, source:, ...)")
    try:
        data = interpolate(data)
    except PipelineFileError as exc:
        raise PipelineFileError(f"{source}: {exc.problem}", exc.fix) from None
    try:
        # base_dir first: validators resolve relative paths (certificate files) against it
        pipeline = Pipeline.model_validate(data | {"base_dir": base_dir or Path(".")})
    except ValidationError as exc:
        lines = [_describe(e) for e in exc.errors()]
        raise PipelineFileError(
            f"{source}: invalid pipeline file:\n  " + "\n  ".join(lines),
            "see docs/reference/pipeline-file.md",
        ) from None
    return pipeline.model_copy(update={"base_dir": base_dir or Path(".")})


def load_pipeline(path: str | os.PathLike[str]) -> Pipeline:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PipelineFileError(f"pipeline file {file} does not exist", "check the path (relative to the current directory)") from None
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
    pipeline = parse_pipeline(data, str(file), file.resolve().parent)
    return pipeline.model_copy(update={"file": str(path)})
