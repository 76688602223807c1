"""The Kafka log against a secured broker (issue 24 item 1; README Security): the session's
`secure_kafka`, the product's secured dev broker (SASL_SSL with SCRAM users, a server certificate
from a CA made at start with openssl; tests/fixtures/kafka.py). The `log: kafka` security settings reach every client:
capture (admin, producer, the publisher's consumer), the log view, and Spark's Kafka source in
apply and verify, which end identical. A wrong password or an untrusted CA is exit 3 naming the
setting, with no secret printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.devservices.kafka_secure import SecureKafka
from tests.fixtures.kafka_log import apply_ok, make_kpipe, snapshot, stream_until_current, verified
from tests.harness import cdc, sql

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # Spark's Kafka source over SASL_SSL


def test_capture_apply_verify_over_sasl_ssl(
    pg_db: str, tmp_path: Path, secure_kafka: SecureKafka, spark, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, ca, other_ca = secure_kafka, secure_kafka.ca_file, secure_kafka.certs_dir / "other.crt"
    password = broker.password
    monkeypatch.delenv("KAFKA_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("KAFKA_USER", broker.user)
    monkeypatch.setenv("KAFKA_PASSWORD", password)
    security = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "${KAFKA_USER}",
        "sasl_password": "${KAFKA_PASSWORD}",
        "ssl_cafile": str(ca),
    }
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'r' || g FROM generate_series(1, 20) g",
    )
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], broker.bootstrap, **security)
    assert "published 20 records to Kafka" in snapshot(pipe).out
    sql(
        pg_db,
        "UPDATE t SET v = 'u' WHERE id <= 3",
        "DELETE FROM t WHERE id = 4",
        "INSERT INTO t VALUES (21, 'new')",
    )
    stream_until_current(pipe)
    apply_ok(pipe, spark)  # Spark's Kafka source reads the topic over SASL_SSL
    verified(pipe, spark)  # cdc verify exit 0

    # a wrong password: exit 3 naming the setting, the secret never printed
    monkeypatch.setenv("KAFKA_PASSWORD", "wrong-" + password)
    run = cdc("stream", pipe.file, "--until", "current")
    assert run.code == 3, run
    assert (
        "refused the login of log.kafka.sasl_username 'cdc' (SCRAM-SHA-512): wrong log.kafka.sasl_password"
        in run.err
    ), run.err
    assert password not in run.out + run.err and "Traceback" not in run.err

    # a CA that did not sign the broker's certificate: exit 3 naming log.kafka.ssl_cafile
    monkeypatch.setenv("KAFKA_PASSWORD", password)
    pipe.write(**{**security, "ssl_cafile": str(other_ca)})
    run = cdc("stream", pipe.file, "--until", "current")
    assert run.code == 3, run
    assert "the broker's TLS certificate was refused (" in run.err, run.err
    assert f"; log.kafka.ssl_cafile is {other_ca}" in run.err, run.err
    assert "fix: set log.kafka.ssl_cafile to the CA that signed the brokers' certificates" in run.err, run.err
    assert password not in run.out + run.err and "Traceback" not in run.err
