"""The `log:` section of the pipeline file (docs/reference/pipeline-file.md): where captured
changes are kept, the embedded SQLite log (`local:`, its cut retention) or Kafka topics (`kafka:`,
written by `cdc stream` or Debezium's, with the clients' security settings)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from cdc.ground.settings import Strict, local_directory


class LocalLog(Strict):
    path: str | None = Field(
        default=None,
        description="directory of the SQLite log (default <state_dir>/log), on a local file system",
    )
    _path = field_validator("path")(local_directory)
    synchronous: Literal["full", "normal"] = Field(
        default="full",
        description="SQLite fsync policy: full survives power loss, normal survives process crashes",
    )
    # Cut retention (cdc/log/local/cuts.py): the newest keep_cuts always, older ones while a follower's
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
    # Security (docs/security.md): one place, passed to every Kafka client of the tool
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
