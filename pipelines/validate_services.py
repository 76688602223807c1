"""`cdc validate`'s checks of the services a pipeline names besides the source: the Kafka log
(connect, sign in, the rights the log needs on its topics), OpenSearch sinks (reachable, sign-in)
and a Spark standalone master (reachable). Each problem is a FAIL line with its fix, counted by
the caller as an engine problem (exit 3, like a source problem); nothing is created or changed
(a missing topic is asked about with CreateTopics' validate_only). Never prints a secret: errors
come from the clients' own explainers (cdc/log/kafka/client.py, sinks/search), which name the
settings, not their values.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from cdc.ground.config import Pipeline
from cdc.ground.errors import CdcError
from cdc.ground.log_config import KafkaLog
from cdc.ground.tables import TableName
from sinks.search.settings import SearchSettings

logger = logging.getLogger(__name__)

OK, BAD = "ok  ", "FAIL"

# What the log does with each of its topics (docs/kafka-debezium.md): `cdc stream`
# creates missing ones, checks their cleanup.policy and writes; apply, status and verify read.
WRITER_NEEDS = ("DESCRIBE", "WRITE", "READ", "DESCRIBE_CONFIGS")
READER_NEEDS = ("DESCRIBE", "READ")  # format: debezium: the connector writes, we only read


def check_services(pipeline: Pipeline, tables: list[TableName]) -> int:
    """FAIL lines for the Kafka log, OpenSearch sinks and Spark master; their count."""
    return check_kafka(pipeline, tables) + check_opensearch(pipeline) + check_spark_master(pipeline)


def _fail(problem: str, fix: str | None) -> int:
    logger.info(f"{BAD} {problem}\n       fix: {fix or 'see docs/security.md'}")
    return 1


# --- Kafka ----------------------------------------------------------------------------------------
def log_topics(pipeline: Pipeline, cfg: KafkaLog, tables: list[TableName]) -> list[str]:
    """The topics the log reads or writes for these tables."""
    from cdc.log.kafka.topics import cuts_topic, schemas_topic, table_topic

    prefix = cfg.topic_prefix or pipeline.name
    topics = [table_topic(prefix, t) for t in tables]
    if cfg.format == "debezium":
        return [*topics, cfg.transaction_topic or f"{prefix}.transaction"]
    return [*topics, cuts_topic(prefix), schemas_topic(prefix)]


def check_kafka(pipeline: Pipeline, tables: list[TableName]) -> int:
    cfg = pipeline.log_config.kafka
    if cfg is None:
        return 0
    from cdc.log.kafka.client import admin, servers

    where = f"log.kafka at {','.join(servers(cfg.bootstrap_servers))}"
    who = f" as {cfg.sasl_username!r} ({cfg.sasl_mechanism})" if cfg.sasl_username else ""
    if cfg.security_protocol == "SSL" and cfg.ssl_certfile:
        who = " with the client certificate log.kafka.ssl_certfile"
    try:
        client = admin(cfg)  # connects and signs in; a refused login or TLS names its setting
    except CdcError as exc:
        return _fail(exc.problem, exc.fix)
    try:
        logger.info(f"{OK} {where}: connected ({cfg.security_protocol}){who}")
        return _kafka_rights(client, pipeline, cfg, tables, where)
    except Exception as exc:  # kafka-python raises many kinds; each is a FAIL line
        return _fail(
            f"{where}: the topic check failed: {type(exc).__name__}: {exc}",
            "check the broker and the user's rights",
        )
    finally:
        client.close()


def _kafka_rights(client: Any, pipeline: Pipeline, cfg: KafkaLog, tables: list[TableName], where: str) -> int:
    topics = log_topics(pipeline, cfg, tables)
    if not topics:
        return 0
    user = f"user {cfg.sasl_username!r}" if cfg.sasl_username else "this client"
    needs = READER_NEEDS if cfg.format == "debezium" else WRITER_NEEDS
    if cfg.format != "debezium" and cfg.fix_cleanup_policy:
        needs = (*needs, "ALTER_CONFIGS")
    acl_fix = (
        f"grant {user} on the topics {cfg.topic_prefix or pipeline.name}.* (a PREFIXED ACL): "
        f"{', '.join(needs)}{', CREATE' if cfg.format != 'debezium' else ''} "
        "(kafka-acls --add --allow-principal User:<user> --operation ... --topic <prefix>. --resource-pattern-type prefixed)"
    )
    problems, missing, denied = 0, [], []
    for topic in sorted(client.describe_topics(topics), key=lambda t: str(t.get("name"))):
        name, code = topic.get("name"), topic.get("error_code", 0)
        if code == 3:  # UNKNOWN_TOPIC_OR_PARTITION: not created yet
            missing.append(name)
        elif code == 29:  # TOPIC_AUTHORIZATION_FAILED: not even DESCRIBE
            denied.append(name)
        elif code:
            problems += _fail(f"{where}: topic {name}: error code {code}", "check the broker's log")
        else:
            allowed = set(topic.get("authorized_operations") or needs)
            lacking = [op for op in needs if op not in allowed and "ALL" not in allowed]
            if lacking:
                denied.append(f"{name} (lacks {', '.join(lacking)})")
    if denied:
        problems += _fail(f"{where}: {user} may not use topic(s) the log needs: {', '.join(denied)}", acl_fix)
    if missing and cfg.format == "debezium":
        logger.info(
            f"note: {where}: topic(s) {', '.join(missing)} do not exist yet (the Debezium connector creates them)"
        )
    elif missing:
        answer = client.create_topics(
            {t: {"num_partitions": 1, "replication_factor": cfg.replication_factor} for t in missing},
            validate_only=True,
            raise_errors=False,
        )
        refused = [
            f"{t['name']} ({t.get('error_message') or 'error ' + str(t['error_code'])})"
            for t in sorted(answer["topics"], key=lambda t: str(t["name"]))
            if t.get("error_code")
        ]
        if refused:
            problems += _fail(
                f"{where}: {user} may not create topic(s) the log needs: {', '.join(refused)}", acl_fix
            )
        else:
            logger.info(
                f"{OK} {where}: {len(missing)} topic(s) to be created by `cdc stream` (CREATE allowed)"
            )
    if not problems and len(topics) > len(missing):
        logger.info(
            f"{OK} {where}: {user} may {'read' if cfg.format == 'debezium' else 'write and read'} the log's {len(topics) - len(missing)} existing topic(s)"
        )
    return problems


# --- OpenSearch -----------------------------------------------------------------------------------
def check_opensearch(pipeline: Pipeline) -> int:
    problems = 0
    for sink in pipeline.sinks:
        if not isinstance(sink.settings, SearchSettings) or sink.settings.engine != "opensearch":
            continue
        from sinks.search.opensearch_bulk import show_hosts
        from sinks.search.opensearch_engine import OpenSearchSink

        follower = OpenSearchSink(sink, pipeline, None)  # no Spark: only its clients and their errors
        where = f"sink {sink.name}: OpenSearch at {show_hosts(follower.hosts)}"
        try:
            with follower.calls("the cluster check (cluster:monitor/main)"):
                info = follower.client().info()
        except CdcError as exc:
            problems += _fail(exc.problem, exc.fix)
            continue
        version = (info.get("version") or {}).get("number", "?") if isinstance(info, dict) else "?"
        logger.info(f"{OK} {where}: reachable, signed in (version {version})")
    return problems


# --- Spark ----------------------------------------------------------------------------------------
def check_spark_master(pipeline: Pipeline) -> int:
    """A standalone master (spark://host:port[,host2:port2]) accepts connections; other masters
    (local, yarn, k8s://) are not checked here."""
    master = pipeline.spark.master
    if not master.startswith("spark://"):
        return 0
    answered, failures = [], []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
                answered.append(address)
        except (OSError, ValueError) as exc:
            failures.append(f"{address} ({getattr(exc, 'strerror', None) or exc})")
    if answered:
        logger.info(f"{OK} spark.master {master}: {', '.join(answered)} accepts connections")
        return 0
    return _fail(
        f"spark.master {master}: no master answers: {', '.join(failures)}",
        "start the cluster (`cdc dev up spark` for a local one) or correct spark.master in the pipeline file",
    )
