"""The pipeline file's runtime sections (docs/reference/pipeline-file.md): `spark:` (the apply
job's session, its pacing and security), `stream:` (batching and reconnects), `snapshot:` (how
tables are copied) and `metrics:` (the Prometheus endpoint)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from cdc.ground.settings import Strict
from cdc.ground.tables import TableName


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
    class_archive: bool = Field(
        default=True,
        description="keep a class-data-sharing archive of the driver JVM's classes in the user's cache "
        "(~/.cache/cdc/jvm, one per class path): the first `cdc apply --once` makes it as its JVM exits, later "
        "starts map it instead of loading Spark's classes again; false = start without one",
    )
    # Security on a cluster (docs/cluster.md): the secret reaches the driver's JVM over
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
    # docs/cluster.md, secrets on the executors: the sinks' passwords reach executors by environment, not in tasks
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
    """How `cdc snapshot` copies tables (docs/snapshot-big-tables.md)."""

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
