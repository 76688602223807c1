"""`cdc validate`: every check on the pipeline file and the source, reported at once."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

import psycopg2

from cdc.filters import publication_drift, refused
from cdc.ground.config import Pipeline
from cdc.ground.errors import ExitCode, PipelineFileError, UsageError
from cdc.ground.private import exposed
from cdc.ground.secrets import redact
from cdc.ground.tables import TableName
from cdc.schema import generated_columns
from cdc.source import Problem, connect, insert_publication, replica_index_without_key
from cdc.sslcheck import tls_warning
from cdc.tablewatch import check_pipeline_source, gone_from_source
from pipelines.ddl import describe as describe_ddl
from pipelines.validate_services import check_services
from sinks.cache.settings import RedisSettings
from snapshot.watermarks import watermark_right

logger = logging.getLogger(__name__)

OK, BAD, WARN = "ok  ", "FAIL", "warn"


def private_paths(pipeline: Pipeline) -> dict[str, Path]:
    """The existing directories of the pipeline's state that should be owner-only (0700)."""
    paths = {"state_dir": pipeline.state_path}
    if pipeline.log_config.local is not None and pipeline.log_config.local.path:
        paths["log.local.path"] = pipeline.local_log_path
    return {k: p for k, p in paths.items() if p.is_dir()}


def run_validate(pipeline: Pipeline, spark_views: bool = False) -> int:
    """`spark_views`: every derived view analysed by Spark too (else only those sqlglot cannot resolve)."""
    sinks = ", ".join(f"{s.name} ({s.kind})" for s in pipeline.sinks) or "none"
    log = "kafka" if pipeline.log_config.kafka else f"local at {pipeline.local_log_path}"
    logger.info(f"{OK} pipeline file: {pipeline.name}, log {log}, sinks: {sinks}")
    dir_problems = pipeline.state_dir_problems()
    for what, fix in dir_problems:
        logger.info(f"{BAD} {what}\n       fix: {fix}")
    if not dir_problems:
        logger.info(
            f"{OK} state_dir {pipeline.state_path} can be {'written' if pipeline.state_path.is_dir() else 'created'}"
        )
    for key, path in private_paths(pipeline).items():
        why = exposed(path)
        if why:  # a warning, not a failure: the operator may share it on purpose
            logger.info(
                f"{WARN} {key} {path}: {why}, so other local users can read the captured rows in it\n"
                f"       fix: chmod -R go-rwx {shlex.quote(str(path))}"
            )
    tls = tls_warning(pipeline.source.postgres.dsn, pipeline.source.postgres.min_sslmode)
    if tls:  # a warning: the exit code stays (a private network may be trusted on purpose)
        logger.info(f"{WARN} {tls[0]}\n       fix: {tls[1]}")
    conn = connect(pipeline.source.postgres.dsn, application_name="cdc validate")
    try:
        gone = gone_from_source(pipeline, conn)  # dropped in the source, last changes still to stream: a note
        report = check_pipeline_source(pipeline, conn, gone)
        generated = {t.table: generated_columns(conn, t.oid) for t in report.tables}
        for t in report.tables:
            # deletes would reach the stream without the primary key: it would stop there
            index = replica_index_without_key(conn, t.table) if t.replica_identity == "i" else None
            if index is not None:
                report.problems.append(
                    Problem(
                        f"table {t.table} has REPLICA IDENTITY USING INDEX {index}, without the primary key columns: "
                        "PostgreSQL would send deleted (and key-changed) rows without the key, and `cdc stream` stops there",
                        f"run ALTER TABLE {t.table} REPLICA IDENTITY DEFAULT; (if `cdc stream` already stopped on it, then also "
                        "`cdc teardown PIPELINE --drop-slot --yes` and `cdc snapshot PIPELINE`)",
                    )
                )
        modes = {pipeline.snapshot.mode, *pipeline.snapshot.tables.values()}
        wm = watermark_right(conn) if modes != {"exported"} else None
        if wm is not None and "chunked" in modes:
            report.problems.append(Problem(*wm))
        elif wm is not None:  # auto: a table chunked only once it is big
            logger.info(
                f"{WARN} snapshot.mode auto: {wm[0]} (tables of {pipeline.snapshot.auto_min_rows:,} rows or more)\n       fix: {wm[1]}"
            )
        drift: dict = {}
        if not report.problems:
            try:  # compared in a transaction that is rolled back: nothing changes
                drift = publication_drift(conn, pipeline.publication, report.filters)
            except psycopg2.Error as exc:
                error = refused(exc, pipeline.publication)
                report.problems.append(Problem(error.problem, error.fix or ""))
        schemas = captured_schemas(conn, report) if pipeline.views else {}
        keep = wal_keep_limit(conn)
        ddl_mode = describe_ddl(conn, pipeline)  # with or without the DDL trigger (cdc ddl install)
    finally:
        conn.close()
    info = report.server
    assert info is not None
    logger.info(f"{OK} connected to {info.database} as {info.user}: {info.version_text.split(',')[0]}")
    logger.info(f"{OK if info.wal_level == 'logical' else BAD} wal_level = {info.wal_level}")
    logger.info(
        f"{OK} replication slots {info.used_slots}/{info.max_replication_slots} used, WAL senders {info.used_wal_senders}/{info.max_wal_senders}"
    )
    if keep is not None:
        logger.info(slot_safety_line(keep, pipeline.slot, pipeline.command("snapshot")))
    logger.info(
        f"{OK} {ddl_mode[0]}" if ddl_mode[1] is None else f"{WARN} {ddl_mode[0]}\n       fix: {ddl_mode[1]}"
    )
    switched = {p.moved_by_snapshot for p in report.problems}  # FULL -> DEFAULT while followed
    for t in report.tables:
        key = f"key ({', '.join(t.key_columns)}) from {t.key_source}" if t.key_columns else "NO KEY"
        if t.insert_only:
            key = (
                f"no key: followed insert-only (inserts and truncates, through publication "
                f"{insert_publication(pipeline.publication)}), each row identified by its log position (_cdc_lsn, _cdc_seq)"
            )
        if t.multiset:
            key = (
                "no key, REPLICA IDENTITY FULL: followed as a multiset (inserts, updates, deletes and truncates, "
                f"through publication {pipeline.publication}), each row identified by its content (two identical rows "
                "are two rows; an update or delete changes one of them)"
            )
        mark = OK if (t.key_columns or t.insert_only or t.multiset) and t.can_select else BAD
        if t.table in switched:
            key = (
                f"no key, REPLICA IDENTITY {'DEFAULT' if t.replica_identity == 'd' else 'NOTHING'} (was FULL): still in "
                f"publication {pipeline.publication}, its inserts captured (PostgreSQL refuses its updates and deletes)"
            )
            mark = BAD
        logger.info(f"{mark} table {t.table}: {len(t.columns)} columns, {key}")
        captured = report.filters.get(t.table)
        if captured is not None and captured.active:
            logger.info(
                f"{OK} table {t.table}: captures {captured.describe()} (source.postgres.table_options)"
            )
            logger.info(
                f"{WARN} table {t.table}: its publication column list / row filter makes PostgreSQL refuse "
                "ALTER COLUMN ... TYPE (and DROP, RENAME) of the columns it names\n"
                f"       fix: run such migrations with `{pipeline.command('migrate', '--sql', 'FILE')}`: one transaction "
                "takes the table out of the publication, runs FILE, and puts it back with its column list and row filter"
            )
        if t.table in drift:
            logger.info(
                f"note: table {t.table}: source.postgres.table_options changed: {drift[t.table]}; the next `cdc stream` "
                f"(or `{pipeline.command('snapshot')}`) sets the publication again and snapshots {t.table} again, "
                "so followers get it as the pipeline file says"
            )
        if generated[t.table]:
            logger.info(
                f"note: table {t.table}: generated column(s) {', '.join(generated[t.table])} are not captured: PostgreSQL does not "
                "publish generated columns (before 18; on 18 the publication keeps publish_generated_columns = none), so the log and every "
                "follower leave them out and `cdc verify` names them as not compared; compute them in a view (`views:`) "
                "if a follower needs them"
            )
    view_problems = check_views(pipeline, schemas, spark_views)
    for note in report.notes:
        logger.info(f"note: {note}")
    for p in report.problems:
        logger.info(f"{BAD} {p.what}\n       fix: {p.fix}")
    shape_problems = sink_shape_problems(pipeline, report)
    for p in shape_problems:
        logger.info(f"{BAD} {p.what}\n       fix: {p.fix}")
    engine_problems = check_engines(pipeline)
    # the Kafka log (sign-in, topic rights), OpenSearch sinks and the Spark master (validate_services.py)
    engine_problems += check_services(pipeline, [t.table for t in report.tables])
    if report.problems or dir_problems or engine_problems or shape_problems or view_problems:
        count = (
            len(report.problems) + len(dir_problems) + engine_problems + len(shape_problems) + view_problems
        )
        logger.info(f"{count} problem(s) found; nothing was changed")
        # the source's (and engines') problems first (3); a state_dir problem alone is the pipeline file's (2)
        return int(ExitCode.SOURCE if report.problems or engine_problems else ExitCode.USAGE)
    logger.info("all checks passed; nothing was changed")
    return int(ExitCode.OK)


# What to set when the source keeps WAL for slots without a limit; a size the WAL disk can spare.
SUGGESTED_WAL_KEEP = "10GB"


def wal_keep_limit(conn) -> str | None:
    """The source's max_slot_wal_keep_size as SHOW prints it ('-1': no limit); None before PG 13."""
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('max_slot_wal_keep_size', true)")
        row = cur.fetchone()
    return row[0] if row and row[0] else None


def slot_safety_line(keep: str, slot: str, snapshot_cmd: str) -> str:
    """The safety net of docs/source-database.md (Slots and WAL retention): a warning, not a failure, when
    a stopped pipeline's slot may keep WAL until the source's disk is full."""
    if keep != "-1":
        return (
            f"{OK} max_slot_wal_keep_size = {keep}: a slot that falls more than that behind is invalidated "
            f"(then `{snapshot_cmd}` copies every table again) instead of filling the source's disk"
        )
    return (
        f"{WARN} max_slot_wal_keep_size = -1 (no limit): while the pipeline is stopped or behind, slot {slot} keeps "
        "every WAL segment it has not acknowledged, until the source's disk is full (an outage of the source)\n"
        f"       fix: set a limit the WAL disk can spare, e.g. ALTER SYSTEM SET max_slot_wal_keep_size = "
        f"'{SUGGESTED_WAL_KEEP}'; SELECT pg_reload_conf(); (a managed service: its parameter settings). A slot "
        "that falls more than that behind is then invalidated (wal_status lost) instead: the changes since are "
        f"gone from the source, and the pipeline needs a new snapshot (drop the slot, then `{snapshot_cmd}`)"
    )


def captured_schemas(conn, report) -> dict:
    """Each captured table's schema as the log will hold it (captured columns, resolved types)."""
    from cdc.schema import TypeCache, build_schema, column_extras

    types = TypeCache()
    schemas = {}
    for t in report.tables:
        captured = report.filters.get(t.table)
        cols = [
            (c.name, c.type_oid, c.typmod) for c in t.columns if captured is None or captured.keeps(c.name)
        ]
        schemas[t.table] = build_schema(conn, cols, t.key_columns, types, column_extras(conn, t.table))
    return schemas


def check_views(pipeline: Pipeline, schemas: dict, spark_check: bool = False) -> int:
    """Each derived view analysed (pipelines/views/sql.py) and its columns resolved against the
    captured schemas (no source row is read): a line per view saying whether it is maintained
    incrementally or recomputed each cut and why; FAIL lines (the count returned) for views that
    cannot work. Columns are resolved by sqlglot (pipelines/views/namecheck.py, no JVM); a view it
    cannot resolve, or all views with `spark_check`, is run by Spark on empty tables, whose verdict
    (and message) counts."""
    if not pipeline.views:
        return 0
    from pipelines.views.namecheck import check_names, output_names
    from pipelines.views.sql import analyse

    columns = {t: s.column_names for t, s in schemas.items()}
    # tables the file names that the source check found unusable count as captured here (their
    # problem is reported above), so such a view is not called one reading an uncaptured table
    named = [TableName(s.schema, s.name) for s in pipeline.table_selectors if s.name is not None]
    captured = list(schemas) + [t for t in named if t not in schemas]
    plans, problems = [], 0
    for view in pipeline.views:
        try:
            plans.append(analyse(view, captured, columns))
        except UsageError as exc:
            problems += 1
            logger.info(f"{BAD} {exc.problem}\n       fix: {exc.fix}")
    spark = None
    for plan in plans:
        followers = [s.name for s in pipeline.sinks if plan.name in s.settings.views] or [
            "no sink follows it"
        ]
        unusable = [str(t) for t in plan.tables if t not in schemas]
        if unusable:
            logger.info(
                f"note: view {plan.name}: not checked: {', '.join(unusable)} cannot be used at the source (above)"
            )
            continue
        names = None if spark_check else output_names(plan, columns)
        if names is not None:
            try:
                check_names(plan, names)
            except UsageError:
                names = None  # Spark names the problem (its column names are the followers')
        if names is None:
            if spark is None:
                from pipelines.spark import spark_session
                from pipelines.views.check import struct_of, view_schema

                spark = spark_session(None, master="local[1]")  # not the pipeline's cluster: nothing runs
                structs = {t: struct_of(s) for t, s in schemas.items()}
            try:
                names = view_schema(spark, plan, structs).fieldNames()
            except UsageError as exc:
                problems += 1
                logger.info(f"{BAD} {exc.problem}\n       fix: {exc.fix}")
                continue
        logger.info(
            f"{OK} {plan.describe()} ({len(names)} columns, key {', '.join(plan.key)}; sinks: {', '.join(followers)})"
        )
    return problems


def sink_shape_problems(pipeline: Pipeline, report) -> list[Problem]:
    """Sinks' table_options naming a column the table does not have (as captured), or a rule a key
    column cannot take: found here, before `cdc apply` stops on them (sinks/shaping.py)."""
    from cdc.log.base import Column, TableSchema

    problems: list[Problem] = []
    for sink in pipeline.sinks:
        for t in report.tables:
            if sink.settings.options_for(t.table) is None or not t.key_columns:
                continue
            from sinks.shaping import shape_of  # imports pyspark (types, no JVM): only when needed

            captured = report.filters.get(t.table)
            cols = tuple(
                Column(c.name, c.type_oid, c.typmod)
                for c in t.columns
                if captured is None or captured.keeps(c.name)
            )
            try:
                shape_of(sink, t.table, TableSchema(cols, t.key_columns))
            except PipelineFileError as exc:
                problems.append(Problem(exc.problem, exc.fix or ""))
    return problems


def check_engines(pipeline: Pipeline) -> int:
    """Followers' engines set up to lose data (a Redis that may evict keys): FAIL lines, their count.
    An engine that cannot be reached is a note here (`cdc apply` reports it when it runs)."""
    redis = [
        (sink.name, sink.settings) for sink in pipeline.sinks if isinstance(sink.settings, RedisSettings)
    ]
    if not redis:
        return 0  # the Redis client is imported only for a pipeline with Redis
    from sinks.cache.eviction import EVICTION_FIX, eviction_problem
    from sinks.cache.writer import connect as redis_connect
    from sinks.cache.writer import describe

    problems = 0
    for name, settings in redis:
        where = f"sink {name}: Redis at {redact(settings.url)}"
        try:
            client = redis_connect(settings.url)
            try:
                problem = eviction_problem(client, settings.ttl)
            finally:
                client.close()
        except Exception as exc:  # redis-py errors: unreachable, auth, INFO not allowed
            logger.info(f"note: {where}: not checked ({describe(exc)})")
            continue
        if problem is None:
            logger.info(f"{OK} {where}: keys are not evicted")
        elif settings.allow_eviction:
            logger.info(f"note: {where}: {problem} (accepted: allow_eviction: true)")
        else:
            problems += 1
            logger.info(f"{BAD} {where}: {problem}\n       fix: {EVICTION_FIX}")
    return problems
