"""The Kafka log against a secured broker (issue 24 item 1; README Security): a real KRaft broker
with a SASL_SSL listener (SCRAM users added when its storage is formatted, a server certificate
from a CA made at test time with openssl). The `log: kafka` security settings reach every client:
capture (admin, producer, the publisher's consumer), the log view, and Spark's Kafka source in
apply and verify, which end identical. A wrong password or an untrusted CA is exit 3 naming the
setting, with no secret printed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.devservices.base import LOOPBACK, free_port, run
from pipelines.devservices.kafka import STORAGE_TOOL, LocalKafka, new_cluster_id
from tests.fixtures.certs import make_certs
from tests.fixtures.kafka_log import apply_ok, make_kpipe, snapshot, stream_until_current, verified
from tests.fixtures.services import running
from tests.harness import cdc, sql

pytestmark = [pytest.mark.integration]  # a broker JVM of its own

USER, PASSWORD = "cdc", "s3cret-Kafka-pw"


class SecureKafka(LocalKafka):
    """LocalKafka plus a SASL_SSL listener (SCRAM-SHA-512/256 and PLAIN); its PLAINTEXT listener
    stays for the readiness check and the broker's own traffic."""

    keystore: Path
    secure_port: int = 0

    def _properties(self) -> dict[str, str]:
        props = super()._properties()
        if not self.secure_port:
            self.secure_port = free_port()
        plain, secure, ctl = (
            f"{LOOPBACK}:{self.port}",
            f"{LOOPBACK}:{self.secure_port}",
            f"{LOOPBACK}:{self.controller_port}",
        )
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        props |= {
            "listeners": f"PLAINTEXT://{plain},SASL_SSL://{secure},CONTROLLER://{ctl}",
            "advertised.listeners": f"PLAINTEXT://{plain},SASL_SSL://{secure},CONTROLLER://{ctl}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram,
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": scram,
            "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{USER}="{PASSWORD}";'
            ),
            "listener.name.sasl_ssl.ssl.keystore.type": "PEM",
            "listener.name.sasl_ssl.ssl.keystore.location": str(self.keystore),
        }
        return props

    def _format(self, jars: Path) -> None:
        run(
            [*self._java(jars), STORAGE_TOOL, "format", "--standalone", "-t", new_cluster_id(), "-c", str(self.config_file),
             "--add-scram", f"SCRAM-SHA-512=[name={USER},password={PASSWORD}]",
             "--add-scram", f"SCRAM-SHA-256=[name={USER},password={PASSWORD}]"],
            "formatting Kafka storage with SCRAM users",
        )  # fmt: skip


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SecureKafka, Path, Path]]:
    """(broker, its CA file, another CA's file); bootstrap: 127.0.0.1:<broker.secure_port>."""
    ca, pem, other = make_certs(tmp_path_factory.mktemp("kafka-certs"))

    def build(base: Path) -> SecureKafka:
        broker = SecureKafka(base, settings={"log.cleaner.backoff.ms": "500"})
        broker.keystore = pem
        return broker

    with running("cdc-test-kafka-sasl-", build) as broker:
        yield broker, ca, other


def test_capture_apply_verify_over_sasl_ssl(
    pg_db: str, tmp_path: Path, secure_kafka, spark, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, ca, other_ca = secure_kafka
    monkeypatch.setenv("KAFKA_USER", USER)
    monkeypatch.setenv("KAFKA_PASSWORD", PASSWORD)
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
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], f"{LOOPBACK}:{broker.secure_port}", **security)
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
    monkeypatch.setenv("KAFKA_PASSWORD", "wrong-" + PASSWORD)
    run = cdc("stream", pipe.file, "--until", "current")
    assert run.code == 3, run
    assert (
        "refused the login of log.kafka.sasl_username 'cdc' (SCRAM-SHA-512): wrong log.kafka.sasl_password"
        in run.err
    ), run.err
    assert PASSWORD not in run.out + run.err and "Traceback" not in run.err

    # a CA that did not sign the broker's certificate: exit 3 naming log.kafka.ssl_cafile
    monkeypatch.setenv("KAFKA_PASSWORD", PASSWORD)
    pipe.write(**{**security, "ssl_cafile": str(other_ca)})
    run = cdc("stream", pipe.file, "--until", "current")
    assert run.code == 3, run
    assert "the broker's TLS certificate was refused (" in run.err, run.err
    assert f"; log.kafka.ssl_cafile is {other_ca}" in run.err, run.err
    assert "fix: set log.kafka.ssl_cafile to the CA that signed the brokers' certificates" in run.err, run.err
    assert PASSWORD not in run.out + run.err and "Traceback" not in run.err
