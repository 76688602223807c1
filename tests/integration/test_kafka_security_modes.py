"""Every documented Kafka security mode against one real secured broker (the session `secure_kafka`,
the product's `cdc dev up kafka --secure` broker): SASL_SSL with PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512, and mTLS (issue 34 items 3 and 10). Each runs `cdc validate` (connect, sign in,
the log's topic rights), a `cdc snapshot` into the topics and `cdc log read` back through the
product's clients. The password comes from a file (KAFKA_PASSWORD_FILE). A wrong password, an
untrusted CA and a user without the ACLs the log needs each fail validate with exit 3 naming the
setting, with no secret in the output; the OpenSearch and Spark master checks fail on addresses
where nothing answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourceType,
)

from pipelines.devservices.base import free_port
from pipelines.devservices.kafka_secure import SecureKafka
from tests.fixtures.kafka import LIMITED_PASSWORD, LIMITED_USER
from tests.fixtures.kafka_log import make_kpipe, snapshot
from tests.harness import cdc, sql, write_pipeline

pytestmark = pytest.mark.integration

ROWS = 7


def _security(broker: SecureKafka, mode: str) -> tuple[str, dict]:
    """(bootstrap, log.kafka security settings) of a mode; passwords as ${KAFKA_PASSWORD}."""
    if mode == "mTLS":
        return broker.mtls_bootstrap, {
            "security_protocol": "SSL",
            "ssl_cafile": str(broker.ca_file),
            "ssl_certfile": str(broker.client_cert),
            "ssl_keyfile": str(broker.client_key),
        }
    return broker.bootstrap, {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": mode,
        "sasl_username": "${KAFKA_USER}",
        "sasl_password": "${KAFKA_PASSWORD}",
        "ssl_cafile": str(broker.ca_file),
    }


def _table(dsn: str) -> None:
    sql(
        dsn,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        f"INSERT INTO t SELECT g, 'r' || g FROM generate_series(1, {ROWS}) g",
    )


@pytest.mark.parametrize("mode", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "mTLS"])
def test_each_security_mode_validates_snapshots_and_reads_back(
    pg_db: str, tmp_path: Path, secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setenv("KAFKA_USER", secure_kafka.user)
    monkeypatch.delenv("KAFKA_PASSWORD", raising=False)
    monkeypatch.setenv("KAFKA_PASSWORD_FILE", str(secure_kafka.password_file))  # as an orchestrator mounts it
    _table(pg_db)
    bootstrap, security = _security(secure_kafka, mode)
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], bootstrap, **security)

    run = cdc("validate", pipe.file)
    assert run.code == 0, run
    protocol = "SSL" if mode == "mTLS" else "SASL_SSL"
    who = "with the client certificate log.kafka.ssl_certfile" if mode == "mTLS" else f"as 'cdc' ({mode})"
    assert f"connected ({protocol}) {who}" in run.out, run.out
    assert "3 topic(s) to be created by `cdc stream` (CREATE allowed)" in run.out, run.out
    assert "all checks passed" in run.out, run.out

    assert f"published {ROWS} records to Kafka" in snapshot(pipe).out
    read = cdc("log", "read", pipe.file, "--table", "public.t")
    assert read.code == 0, read
    events = [json.loads(line) for line in read.out.splitlines() if line.strip()]
    assert sorted(e["after"]["id"] for e in events) == list(range(1, ROWS + 1)), read.out
    assert {e["op"] for e in events} == {"r"}

    run = cdc("validate", pipe.file)  # the topics exist now: the rights on them are checked
    assert run.code == 0, run
    assert "may write and read the log's 3 existing topic(s)" in run.out, run.out
    assert secure_kafka.password not in run.out + run.err + read.out + read.err


def test_wrong_password_and_untrusted_ca_fail_validate(
    pg_db: str, tmp_path: Path, secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = "wrong-" + secure_kafka.password
    monkeypatch.setenv("KAFKA_USER", secure_kafka.user)
    monkeypatch.delenv("KAFKA_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("KAFKA_PASSWORD", wrong)
    _table(pg_db)
    bootstrap, security = _security(secure_kafka, "SCRAM-SHA-512")
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], bootstrap, **security)
    run = cdc("validate", pipe.file)
    assert run.code == 3, run
    assert (
        f"FAIL Kafka at {secure_kafka.bootstrap} refused the login of log.kafka.sasl_username 'cdc' "
        "(SCRAM-SHA-512): wrong log.kafka.sasl_password" in run.out
    ), run.out
    assert "fix: check log.kafka.sasl_username, log.kafka.sasl_password" in run.out, run.out
    assert "all checks passed" not in run.out and "1 problem(s) found" in run.out, run.out
    text = run.out + run.err
    assert wrong not in text and secure_kafka.password not in text and "Traceback" not in text

    monkeypatch.setenv("KAFKA_PASSWORD", secure_kafka.password)
    other_ca = secure_kafka.certs_dir / "other.crt"
    pipe.write(**{**security, "ssl_cafile": str(other_ca)})
    run = cdc("validate", pipe.file)
    assert run.code == 3, run
    assert "the broker's TLS certificate was refused (" in run.out, run.out
    assert f"log.kafka.ssl_cafile is {other_ca}" in run.out, run.out
    assert secure_kafka.password not in run.out + run.err and "Traceback" not in run.err


def _grant(broker: SecureKafka, prefix: str, *operations: ACLOperation) -> None:
    admin = broker.admin()
    try:
        topics = ResourcePattern(ResourceType.TOPIC, prefix, ACLResourcePatternType.PREFIXED)
        acls = [ACL(f"User:{LIMITED_USER}", "*", op, ACLPermissionType.ALLOW, topics) for op in operations]
        result = admin.create_acls(acls)
        assert not result["failed"], result
    finally:
        admin.close()


def test_validate_names_the_topic_rights_the_log_lacks(
    pg_db: str, tmp_path: Path, secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KAFKA_USER", LIMITED_USER)
    monkeypatch.delenv("KAFKA_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("KAFKA_PASSWORD", LIMITED_PASSWORD)
    _table(pg_db)
    bootstrap, security = _security(secure_kafka, "SCRAM-SHA-256")
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], bootstrap, **security)
    topics = [pipe.topic("public.t"), pipe.cuts_topic, pipe.schemas_topic]

    def validate_fails(expected: str) -> None:
        run = cdc("validate", pipe.file)
        assert run.code == 3, run
        assert expected in run.out, run.out
        assert (
            f"fix: grant user {LIMITED_USER!r} on the topics {pipe.prefix}.* (a PREFIXED ACL)" in run.out
        ), run.out
        assert LIMITED_PASSWORD not in run.out + run.err and "Traceback" not in run.err

    # no ACL at all: the topics cannot even be described
    validate_fails(f"user {LIMITED_USER!r} may not use topic(s) the log needs: {', '.join(sorted(topics))}\n")
    # may see the topics, not create them
    _grant(secure_kafka, pipe.prefix, ACLOperation.DESCRIBE, ACLOperation.READ)
    refused = ", ".join(f"{t} (Authorization failed.)" for t in sorted(topics))
    validate_fails(f"user {LIMITED_USER!r} may not create topic(s) the log needs: {refused}\n")
    # they exist, but may not be written
    admin = secure_kafka.admin()
    try:
        admin.create_topics({t: {"num_partitions": 1, "replication_factor": 1} for t in topics})
    finally:
        admin.close()
    validate_fails(f"{topics[0]} (lacks WRITE, DESCRIBE_CONFIGS)")
    _grant(secure_kafka, pipe.prefix, ACLOperation.WRITE, ACLOperation.DESCRIBE_CONFIGS)
    run = cdc("validate", pipe.file)
    assert run.code == 0, run
    assert f"user {LIMITED_USER!r} may write and read the log's 3 existing topic(s)" in run.out, run.out


def test_unreachable_opensearch_and_spark_master_fail_validate(pg_db: str, tmp_path: Path) -> None:
    _table(pg_db)
    search_port, master_port = free_port(), free_port()
    pipe = write_pipeline(
        tmp_path,
        pg_db,
        ["public.t"],
        sinks=[
            {
                "name": "search",
                "search": {
                    "engine": "opensearch",
                    "hosts": [f"http://127.0.0.1:{search_port}"],
                    "tables": ["public.t"],
                },
            }
        ],
        spark={"master": f"spark://127.0.0.1:{master_port}"},
    )
    run = cdc("validate", pipe)
    assert run.code == 3, run
    assert f"FAIL OpenSearch at http://127.0.0.1:{search_port} is unreachable (" in run.out, run.out
    assert (
        f"FAIL spark.master spark://127.0.0.1:{master_port}: no master answers: 127.0.0.1:{master_port} (Connection refused)"
        in run.out
    ), run.out
    assert "2 problem(s) found" in run.out and "Traceback" not in run.err, run
