"""The `search:` settings of a `sinks:` entry (docs/reference/pipeline-file.md): the engine
(tantivy on disk or an OpenSearch cluster), field types, and the cluster's index and security
settings. Registered in sinks/registry.py."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from cdc.ground.executor_secrets import env_name, split_host_password
from cdc.ground.settings import (
    SinkSettings,
    Strict,
    TableList,
    check_tables,
    local_directory,
    tables_or_views,
    view_list,
    view_names,
)
from cdc.ground.tables import TableName, TableSelector

SearchFieldType = Literal[
    "text", "keyword", "long", "integer", "short", "double", "float", "boolean", "date", "binary", "stored"
]


class AwsSigV4(Strict):
    region: str = Field(
        min_length=1, description="the AWS region of the domain or collection (e.g. eu-west-1)"
    )
    service: Literal["es", "aoss"] = Field(
        default="es",
        description="es: an Amazon OpenSearch Service domain; aoss: an OpenSearch Serverless collection",
    )


class SearchSettings(SinkSettings):
    file_keys: ClassVar[tuple[str, ...]] = ("ca_file", "client_cert", "client_key")

    engine: Literal["tantivy", "opensearch"] = Field(
        default="tantivy", description="tantivy: an embedded index on disk; opensearch: a cluster at `hosts`"
    )
    tables: TableList | None = Field(default=None, description="required unless `views` is given")
    views: list[str] = view_list()
    path: str | None = Field(
        default=None,
        description="tantivy: index directory (default <state_dir>/search), on a local or shared file system",
    )
    hosts: list[str] | None = Field(default=None, description="opensearch: node URLs")
    index_prefix: str | None = Field(
        default=None, description="opensearch: index name prefix (default: pipeline name)"
    )
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
    # Security (docs/security.md): passed to every OpenSearch client of the tool (driver and executors)
    username: str | None = Field(
        default=None, description="opensearch: HTTP basic auth user (e.g. ${OPENSEARCH_USER})"
    )
    password: str | None = Field(
        default=None, repr=False, description="opensearch: its password, from ${ENV}"
    )
    ca_file: str | None = Field(
        default=None, description="opensearch: PEM CA file for https hosts (default: the system's CAs)"
    )
    client_cert: str | None = Field(
        default=None, description="opensearch: client certificate (PEM), for mTLS"
    )
    client_key: str | None = Field(
        default=None, description="opensearch: the client certificate's key (PEM, unencrypted)"
    )
    verify_certs: bool = Field(
        default=True, description="opensearch: check the nodes' certificates (and that they name the host)"
    )
    aws_sigv4: AwsSigV4 | None = Field(
        default=None,
        description="opensearch: sign requests with AWS SigV4 (Amazon OpenSearch Service / Serverless); "
        "credentials from the standard AWS chain (env, profile, role); needs boto3",
    )

    _path = field_validator("path")(local_directory)
    _tables = field_validator("tables")(check_tables)
    _views = field_validator("views")(view_names)

    @model_validator(mode="after")
    def _engine_options(self) -> SearchSettings:
        tables_or_views(self)
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

    def executor_secrets(self, sink: str) -> dict[str, str]:
        """The executors write with OpenSearch's clients: its password and those inside `hosts`
        (tantivy writes on the driver)."""
        if self.engine != "opensearch":
            return {}
        found = {env_name(sink, "password"): self.password} if self.password else {}
        for i, host in enumerate(self.hosts or []):
            password = split_host_password(host)[1]
            if password:
                found[env_name(sink, f"host{i}_password")] = password
        return found
