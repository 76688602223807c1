"""Redis cache follower (DESIGN.md §7): one Redis string per row, guarded by position.

Pipeline file: `redis: {url, tables, key?, ttl?}`.

Layout
  * Key: the `key` template (default `{schema}.{table}:{pk}`), see sinks/cache/keys.py for how
    key values are printed (Spark's string cast, bytea as base64, `\\` and `:` escaped,
    composite keys joined by `:`).
  * Value: the row as JSON, made in Spark on the executors (`to_json`): first `_cdc_lsn`,
    `_cdc_seq` (the position: commit LSN, index in the transaction), `_cdc_op`,
    `_cdc_commit_ts`, then the source columns under their names, typed as in Delta (README
    "Type mapping"): numbers, booleans, strings, arrays as JSON; numeric as a string of its
    exact text (`"9.99"`, `"1.50"`, as in the envelope); bytea as base64; timestamptz
    as `2024-01-31T10:00:00.123456Z`; timestamp as `2024-01-31T10:00:00.123456`; date as
    `2024-01-31`; NaN/±Infinity as the strings "NaN", "Infinity", "-Infinity". NULL is written
    as null. Example: `{"_cdc_lsn":23456789,"_cdc_seq":3,"_cdc_op":"u",
    "_cdc_commit_ts":"2024-01-31T10:00:00.123456Z","id":42,"name":"Ada"}`.

Writes (sinks/cache/writer.py, scripts.py)
  * Executors write their partition of the net changes in pipelined EVALSHA calls (200 rows
    per call, 10 calls per round trip). The Lua script is a compare-and-set on the position:
    a write whose position is older than or equal to the stored one is ignored, so replays,
    retried Spark tasks and late batches never regress a key. The stored position is read
    with GETRANGE of the value's first 64 bytes.
  * Delete: the key is removed and a tombstone `__cdc:d:<key>` = `<lsn>:<seq>` is kept for
    TOMBSTONE_TTL_S (7 days), so an older upsert replayed within that time cannot resurrect
    the row. An upsert that passes removes the tombstone.
  * Truncate (and a table starting over from a new snapshot, at (snapshot_lsn, 0)): the table's
    marker `__cdc:t:<table pattern>` = `<lsn>:<seq>` is raised first (kept forever, one key per
    table); every later upsert or delete older than it is ignored. Then the driver SCANs the
    table's keys (MATCH on the template with {pk} = *, 1000 per step; the key set is not change
    data) and a script deletes the rows older than the marker. Rows written before the marker
    and not purged yet (a crash in between) count as absent for every write.
  * Unchanged TOAST values (the `__cdc_u_<i>` flags): the script takes those members' raw JSON
    from the stored value (compared by name, nothing re-encoded); a member the stored value
    lacks stays absent. With no row cached to keep it from, the row is left out of the cache (a
    cache miss, never a row with a wrong NULL). A column the source dropped (retired: rows
    written after the drop keep what the follower has) is kept the same way, and left out where
    the cached row never had it; the row itself is always written (never a stale row left
    behind by an update that could not be merged).
  * Columns added with a constant DEFAULT (PostgreSQL fills them without WAL): cached rows
    written before the column existed get the member, as Delta backfills them; which columns
    were filled is remembered in `__cdc:s:<table pattern>`.
  * A renamed source column: `prepare` renames the member in every cached row of the table
    (SCAN + the RENAME script, in place, TTL kept) before the batch is written. A dropped
    column's member stays, with the last value the source had.
  * `ttl`: upserts are written with EX ttl; tombstones keep their own TTL. An expired row is a
    cache miss until its next change; it also forgets its position, so a replay of an older
    cut after the expiry could write that older version back (until the next change or ttl).
    `cdc verify` compares every row, so use it only on followers without `ttl`.

Markers (sinks/marker.py)
  * `__cdc:m:<table pattern>`: each table's marker, written after the cut's rows. A cut begins by
    setting the follower's fence `__cdc:f:<app id>` = `<cut id>` (before the markers
    are checked); a marker is written only while that fence is there (scripts.FENCED_MARKER). So a
    FLUSHALL, FLUSHDB or restart without persistence during the apply leaves no marker behind: the
    cut fails and the next run rebuilds the lost tables, as after a wipe while idle.

Exactly once
  The compare-and-set makes re-applying a cut idempotent: a cut applied again (after a crash
  between the writes and the checkpoint, or after Redis died mid-apply) writes only what
  did not land before. No per-cut txnVersion is stored. The checkpoint advances only after
  every partition's writes were acknowledged. Durability is Redis's: with AOF and
  `appendfsync everysec` a Redis crash can lose the last second of acknowledged writes, which
  a follower whose checkpoint already moved past them does not redo; use `appendfsync always`
  when that matters.

Errors
  Redis unreachable or failing (also mid-apply, in executors) is a SinkError naming the URL
  (password masked) and the fix; Spark's wrapped executor errors are unwrapped to that one
  line. The follower's checkpoint stays where it was (its cut is pending) and the next
  `cdc apply` re-applies that cut.

Reading back (`current`, for `cdc verify`): the driver SCANs the table's keys, MGETs them and
parses the values with the table's Spark schema (`from_json`); our `__cdc:` keys never count.

Limits: a standalone Redis (not Redis Cluster: a script touches the row, its tombstone and the
table's marker, which a cluster would put in different slots). Moving to a new source whose
LSNs are lower than the cached positions needs the cache (and its `__cdc:*` keys) flushed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.ground.errors import CdcError, EngineSettingError, SinkError
from cdc.ground.executor_secrets import SecretRef, env_name, split_password
from cdc.ground.secrets import redact
from cdc.ground.tables import TableName
from cdc.ground.tables import spark_ident as q
from cdc.log import open_log_view
from cdc.log.base import TableSchema
from cdc.schema import schema_types
from sinks.base import ApplyStats, Sink
from sinks.cache import scripts
from sinks.cache.eviction import EVICTION_FIX, eviction_problem
from sinks.cache.keys import FENCE, INTERNAL, TOMBSTONE, KeyTemplate, TableKeys, glob_escape
from sinks.cache.writer import add_counts, connect, describe, tagged_message, write_partition
from sinks.changes import META_COLUMNS, Batch, NetChanges
from sinks.executor_env import missing_error, provide
from sinks.shaping import shape_of
from sinks.sparktypes import spark_type

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc.ground.config import Pipeline, SinkConfig

TOMBSTONE_TTL_S = 7 * 24 * 3600
SCAN_COUNT = 1000
JSON_OPTIONS = {
    "ignoreNullFields": "false",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "dateFormat": "yyyy-MM-dd",
}


def exact_type(dtype: T.DataType) -> T.DataType:
    """`dtype` with every decimal (also inside arrays) replaced by string.

    numeric is written as its exact text ("9.99", "1.50"), as the envelope does: a JSON number
    would be read as a binary float by most clients (9.99 -> 9.9900000000000002131...)."""
    if isinstance(dtype, T.DecimalType):
        return T.StringType()
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(exact_type(dtype.elementType), dtype.containsNull)
    return dtype


def json_ready(col: SparkColumn, dtype: T.DataType) -> SparkColumn:
    """The column as it goes into the cached JSON (decimals as their exact text)."""
    exact = exact_type(dtype)
    return col if exact == dtype else col.cast(exact)


def value_column(fields: list[T.StructField]) -> Any:
    """The row's JSON: position first (the scripts read it from the head), then the source columns."""
    columns = [json_ready(F.col(q(f.name)), f.dataType).alias(f.name) for f in fields]
    return F.to_json(F.struct(*(F.col(m) for m in META_COLUMNS), *columns), JSON_OPTIONS)


def spark_schema(schema: TableSchema) -> T.StructType:
    types = schema_types(schema)
    return T.StructType(
        [T.StructField(c.name, spark_type(types[c.type_oid], c), True) for c in schema.columns]
    )


class RedisSink(Sink):
    kind = "redis"

    def __init__(self, config: SinkConfig, pipeline: Pipeline, spark: SparkSession) -> None:
        super().__init__(config, pipeline, spark)
        self.url: str = self.settings.url
        # executors get the URL without its password and the password by reference (README
        # "Secrets on the executors"): the pickled task names CDC_SECRET_<SINK>_PASSWORD only
        self.task_url, password = split_password(self.url)
        self.password = SecretRef(env_name(self.name, "password"), password) if password else None
        self.ttl: int = self.settings.ttl or 0
        renames = {TableName.parse(t): o.rename for t, o in self.settings.table_options.items() if o.rename}
        self.template = KeyTemplate(self.settings.key, self.name, renames)
        self._conn: Any = None
        self._fence: str | None = None  # this cut's fence token (begin_cut)

    def describe(self) -> str:
        return f"{self.name} (redis {redact(self.url)})"

    # ---- connection and errors -------------------------------------------------------------------
    def _error(self, detail: str, doing: str) -> SinkError | EngineSettingError:
        missing = missing_error(detail, self.name)
        if missing is not None:
            return missing
        resume = "this follower keeps its checkpoint and the next `cdc apply` resumes it from there"
        if detail.startswith(
            "OutOfMemoryError"
        ):  # noeviction at maxmemory: nothing was evicted, writes refused
            fix = f"give Redis more memory (`CONFIG SET maxmemory <bytes>`, 0 for no limit, and in redis.conf) or free some; {resume}"
        elif detail.startswith(("ConnectionError", "TimeoutError", "AuthenticationError")):
            fix = f"check that Redis is running and reachable at that URL (or correct `url` of the sink); {resume}"
        else:  # Redis answered with an error: out of memory, a key of another type, ACL...
            fix = f"correct what Redis reports (maxmemory, a foreign key under the table's key pattern, ACL rights); {resume}"
        return SinkError(redact(f"sink {self.name}: {doing} Redis at {self.url} failed: {detail}"), fix)

    def _client(self) -> Any:
        if self._conn is None:
            from redis.exceptions import RedisError

            client = connect(self.url)
            try:
                client.ping()
            except RedisError as exc:
                client.close()
                raise self._error(describe(exc), "connecting to") from None
            self._conn = client
        return self._conn

    def _redis(self, doing: str, fn, *args, **kwargs):
        """Run a driver-side Redis call, turning its failures into a SinkError."""
        from redis.exceptions import RedisError

        try:
            return fn(*args, **kwargs)
        except RedisError as exc:
            raise self._error(describe(exc), doing) from None

    def _spark(self, doing: str, action):
        """Run a Spark action that writes to Redis in executors; unwrap their failures."""
        try:
            return action()
        except CdcError:
            raise
        except Exception as exc:
            # PythonException / Py4JJavaError / SparkException wrapping the executor's error
            text = str(exc)
            found = tagged_message(text)
            if found is None:
                lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
                found = f"{type(exc).__name__}: {lines[0] if lines else ''}"
            raise self._error(found, doing) from None

    def _scan(self, client: Any, keys: TableKeys):
        """The table's row keys, SCAN_COUNT at a time (our own `__cdc:` keys left out)."""
        from redis.exceptions import RedisError

        internal = INTERNAL.encode()
        cursor = 0
        while True:
            try:
                cursor, found = client.scan(cursor, match=keys.pattern, count=SCAN_COUNT)
            except RedisError as exc:
                raise self._error(describe(exc), "scanning") from None
            batch = [k for k in found if not k.startswith(internal)]
            if batch:
                yield batch
            if cursor == 0:
                return

    # ---- Sink ------------------------------------------------------------------------------------
    def prepare(self, batches: Sequence[Batch]) -> None:
        self._keys = {k.table: k for k in self.template.check_distinct([b.table for b in batches])}
        client = self._client()
        for batch in batches:
            self._rename_columns(client, batch)
            self._backfill_defaults(client, batch)

    def _rename_columns(self, client: Any, batch: Batch) -> None:
        """A renamed source column: every cached row of the table holding it under an older name
        gets the member renamed (idempotent, so a cut applied again changes nothing more)."""
        if not batch.renames:
            return
        keys = self._keys[batch.table]
        names = sorted({n for new, olds in batch.renames.items() for n in (new, *olds)})
        quoted = dict(zip(names, self._json_names(names), strict=True))
        script = client.register_script(scripts.RENAME)
        for new, olds in batch.renames.items():
            args = [quoted[new], *(quoted[o] for o in olds)]
            for chunk in self._scan(client, keys):
                self._redis("writing to", script, keys=chunk, args=args)

    def _retire_columns(self, client: Any, keys: TableKeys, batch: Batch) -> None:
        """`dropped_columns: null | drop`: the columns the source dropped in this cut set to null in,
        or removed from, every cached row of the table (idempotent: a replayed cut changes nothing more)."""
        how = self.config.dropped_columns
        names = sorted(batch.retired)
        quoted = self._json_names(names)
        script = client.register_script(scripts.RETIRE)
        changed = 0
        for chunk in self._scan(client, keys):
            changed += int(self._redis("writing to", script, keys=chunk, args=[how, *quoted]))
        what = "set to null in" if how == "null" else "removed from"
        logger.info(
            f"sink {self.name}: {batch.table}: column(s) {', '.join(names)} dropped at the source: {what} {changed:,} cached row(s)"
        )

    def _json_names(self, names: list[str]) -> list[str]:
        """Each name quoted exactly as to_json writes a member name (one small Spark job)."""
        [row] = (
            self.spark.range(1)
            .select(*(F.to_json(F.struct(F.lit(0).alias(n))).alias(f"q{i}") for i, n in enumerate(names)))
            .collect()
        )
        return [row[f"q{i}"][1 : -len(":0}")] for i in range(len(names))]

    def _backfill_defaults(self, client: Any, batch: Batch) -> None:
        names = [c.name for c in batch.schema.columns]
        wanted = [n for n in batch.defaults if n in names]
        if not wanted:
            return
        keys = self._keys[batch.table]
        done = {m.decode() for m in self._redis("reading", client.smembers, keys.defaults_key)}
        todo = [n for n in wanted if n not in done]
        if not todo:
            return
        script = client.register_script(scripts.BACKFILL)
        one = self.spark.range(1)
        for name in todo:
            dtype = batch.spark_schema[name].dataType
            typed = json_ready(batch.default_value(name).cast(dtype), dtype)
            [member_row] = one.select(F.to_json(F.struct(typed.alias(name)), JSON_OPTIONS)).collect()
            member = member_row[0][1:-1]
            [quoted] = self._json_names([name])
            for chunk in self._scan(client, keys):
                self._redis("writing to", script, keys=chunk, args=[member, quoted])
            self._redis("writing to", client.sadd, keys.defaults_key, name)

    def apply(self, batch: Batch, changes: NetChanges, cut_id: int) -> ApplyStats:
        stats = ApplyStats(str(batch.table))
        keys = self._keys.get(batch.table) or self.template.for_table(batch.table)
        client = self._client()
        cut = None
        if batch.bootstrap and batch.snapshot_lsn is not None:
            cut = (batch.snapshot_lsn, 0)  # the table starts over from a new snapshot
        if batch.truncate_position is not None:
            cut = max(cut or batch.truncate_position, batch.truncate_position)
        if cut is not None:
            stats.deleted += self._truncate(client, keys, cut)
        counts = self._write(batch, changes, keys)
        if batch.retired and self.config.dropped_columns != "keep":
            self._retire_columns(client, keys, batch)  # after the cut's writes (scripts.RETIRE)
        stats.inserted += counts["inserted"]
        stats.updated += counts["updated"]
        stats.deleted += counts["deleted"]
        return stats

    def _truncate(self, client: Any, keys: TableKeys, position: tuple[int, int]) -> int:
        """Raise the table's marker to `position`, then delete the cached rows older than it."""
        mark = client.register_script(scripts.MARK)
        purge = client.register_script(scripts.PURGE)
        self._redis("writing to", mark, keys=[keys.truncate_key], args=list(position))
        gone = 0
        for chunk in self._scan(client, keys):
            gone += int(self._redis("writing to", purge, keys=[keys.truncate_key, *chunk]))
        return gone

    def _write(self, batch: Batch, changes: NetChanges, keys: TableKeys) -> dict[str, int]:
        names = [f.name for f in batch.spark_schema.fields]
        key = keys.key_column(batch.spark_schema, batch.key_columns)
        # 'o': a column the source dropped (retired) is optional in the cached row (scripts.UPSERT)
        flags = [
            F.when(
                F.col(q(flag)),
                F.lit(("o" if col in batch.retired else "") + str(len(META_COLUMNS) + 1 + names.index(col))),
            )
            for col, flag in changes.unchanged.items()
            if col in names
        ]
        rows = changes.df.select(
            key.alias("k"),
            F.concat(F.lit(TOMBSTONE), key).alias("t"),
            F.col("_cdc_op").alias("op"),
            F.col("_cdc_lsn").alias("lsn"),
            F.col("_cdc_seq").alias("seq"),
            F.when(F.col("_cdc_op") != "d", value_column(batch.spark_schema.fields)).alias("v"),
            (F.concat_ws(",", *flags) if flags else F.lit("")).alias("u"),
        )
        script = scripts.UPSERT
        sha = self._redis("writing to", self._client().script_load, script)
        writer = functools.partial(
            write_partition,
            url=self.task_url,
            password=self.password,
            script=script,
            sha=sha,
            truncate_key=keys.truncate_key,
            ttl=self.ttl,
            tomb_ttl=TOMBSTONE_TTL_S,
        )
        provide(self.spark, [self.password] if self.password else [])
        names_out = ("inserted", "updated", "deleted", "ignored")
        totals = self._spark(
            "writing to", lambda: rows.rdd.mapPartitions(writer).fold((0, 0, 0, 0), add_counts)
        )
        return dict(zip(names_out, (int(n) for n in totals), strict=True))

    # ---- reads -----------------------------------------------------------------------------------
    def _schema_of(self, table: TableName) -> T.StructType:
        log = open_log_view(self.pipeline)
        try:
            schema = log.schema(table)
            shape = shape_of(self.config, table, schema)  # the columns this sink was given (sinks/shaping.py)
            return spark_schema(shape.schema if shape is not None else schema)
        finally:
            log.close()

    def current(self, table: TableName, batch_schema: Batch | None = None) -> DataFrame | None:
        schema = batch_schema.spark_schema if batch_schema is not None else self._schema_of(table)
        client = self._client()
        keys = self.template.for_table(table)
        values: list[tuple[str]] = []
        seen: set[bytes] = set()  # SCAN may return a key more than once
        for found in self._scan(client, keys):
            chunk = [k for k in found if k not in seen]
            seen.update(chunk)
            if not chunk:
                continue
            for value in self._redis("reading from", client.mget, chunk):
                if value is not None:  # MGET answers nil for keys gone meanwhile and for non-strings
                    values.append((value.decode("utf-8", errors="replace"),))
        if not values:
            return None
        raw = self.spark.createDataFrame(values, "v string")
        return raw.select(F.from_json("v", schema, JSON_OPTIONS).alias("r")).select("r.*")

    def check_engine(self) -> None:
        if self.settings.allow_eviction:
            return
        problem = self._redis("reading from", eviction_problem, self._client(), self.ttl)
        if problem is not None:
            raise EngineSettingError(
                redact(f"sink {self.name}: Redis at {self.url}: {problem}"), EVICTION_FIX
            )

    def clear_table(self, table: TableName) -> None:
        client = self._client()
        keys = self.template.for_table(table)
        for pattern in (keys.pattern, glob_escape(TOMBSTONE) + keys.pattern):
            cursor = 0
            while True:
                cursor, found = self._redis("scanning", client.scan, cursor, match=pattern, count=SCAN_COUNT)
                if found:
                    self._redis("writing to", client.delete, *found)
                if cursor == 0:
                    break
        self._redis("writing to", client.delete, keys.truncate_key, keys.defaults_key, keys.marker_key)

    # ---- marker (sinks/marker.py) ----------------------------------------------------------------
    markers = True
    reads_without_spark = True  # a client of the engine, no session (sinks/base.py)

    def read_marker(self, table: TableName) -> str | None:
        client = self._client()
        raw = self._redis("reading from", client.get, self.template.for_table(table).marker_key)
        return raw.decode() if isinstance(raw, bytes) else raw

    def begin_cut(self, cut_id: int) -> None:
        """A fence key for this cut, set before the markers are checked: a wipe of Redis from now
        on (FLUSHALL, a restart without persistence) takes it with the rows, so `write_marker`
        does not write markers over the loss (scripts.FENCED_MARKER)."""
        # the cut id alone: a flush removes the key whatever it holds, and a replayed cut then
        # writes the same value again (a replay leaves Redis byte for byte as it was)
        self._fence = str(cut_id)
        self._redis("writing to", self._client().set, FENCE + self.app_id, self._fence)

    def write_marker(self, table: TableName, text: str) -> None:
        client, marker_key = self._client(), self.template.for_table(table).marker_key
        if self._fence is None:  # no cut begun (the fence is the apply job's)
            self._redis("writing to", client.set, marker_key, text)
            return
        script = client.register_script(scripts.FENCED_MARKER)
        written = self._redis(
            "writing to", script, keys=[FENCE + self.app_id, marker_key], args=[self._fence, text]
        )
        if not written:
            cut = self._fence
            raise SinkError(
                redact(
                    f"sink {self.name}: Redis at {self.url} lost this follower's data while cut {cut} was applied: "
                    "its fence key is gone (FLUSHALL or FLUSHDB, or a restart without persistence); "
                    "no marker was written over the loss"
                ),
                f"run `{self.pipeline.command('apply', '--once', '--sink', self.name)}` again: it finds the "
                "tables lost and rebuilds them from the log's base (with `on_lost: stop` it stops and prints the fix)",
            )

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
