"""`cdc dev up kafka --secure` (issue 34 item 6): a broker with TLS only, whose printed exports are
all a pipeline file needs: `cdc validate` passes with them over SASL_SSL and over mTLS, a
snapshot goes into the topics and `cdc log read` reads it back. No secret is printed (the
password is a file: KAFKA_PASSWORD_FILE), the password and keys are owner-only, a plaintext
client is refused, and `cdc dev status|down` find the secured broker; the same --dir cannot be
started plain."""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from pipelines.devservices.base import port_open
from pipelines.devservices.kafka_secure import SecureKafka
from tests.harness import cdc, sql, write_pipeline

pytestmark = pytest.mark.integration


@pytest.fixture
def dev_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="cdc-test-dev-kafka-secure-"))
    try:
        yield base
    finally:
        broker = SecureKafka(base / "kafka")
        if broker.running():  # a failed test must not leave the JVM behind
            broker.stop()
        shutil.rmtree(base, ignore_errors=True)


def _exports(out: str) -> dict[str, str]:
    env = {}
    for line in out.splitlines():
        assert line.startswith("export "), out
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = shlex.split(value)[0]
    return env


def test_dev_up_kafka_secure_exports_run_a_pipeline(dev_dir: Path, pg_db: str, tmp_path: Path) -> None:
    up = cdc("dev", "up", "kafka", "--secure", "--dir", dev_dir, timeout=240)
    assert up.code == 0, up
    env = _exports(up.out)
    assert set(env) == {
        "KAFKA_BOOTSTRAP", "KAFKA_USER", "KAFKA_PASSWORD_FILE", "KAFKA_CA_FILE",
        "KAFKA_MTLS_BOOTSTRAP", "KAFKA_CERT_FILE", "KAFKA_KEY_FILE",
    }, up.out  # fmt: skip
    password_file = Path(env["KAFKA_PASSWORD_FILE"])
    password = password_file.read_text().strip()
    assert len(password) >= 24 and password not in up.out + up.err
    assert "note: kafka listens on 127.0.0.1 with TLS only" in up.err, up.err
    for private in (password_file, Path(env["KAFKA_KEY_FILE"]), dev_dir / "kafka" / "server.properties"):
        assert private.stat().st_mode & 0o777 == 0o600, private
    assert (dev_dir / "kafka" / "certs").stat().st_mode & 0o777 == 0o700

    # a client without TLS and a login gets nothing
    port = int(env["KAFKA_BOOTSTRAP"].rpartition(":")[2])
    assert port_open(port)
    with pytest.raises(KafkaError):  # NoBrokersAvailable: no answer it understands
        KafkaAdminClient(
            bootstrap_servers=[env["KAFKA_BOOTSTRAP"]], bootstrap_timeout_ms=3000, request_timeout_ms=3000
        )

    status = cdc("dev", "status", "kafka", "--dir", dev_dir)
    assert f"kafka: running KAFKA_BOOTSTRAP={env['KAFKA_BOOTSTRAP']} KAFKA_USER=cdc" in status.out, status

    # the exports, as `eval "$(cdc dev up kafka --secure)"` leaves them, run a pipeline
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'r' || g FROM generate_series(1, 5) g",
    )
    sasl = {
        "bootstrap_servers": "${KAFKA_BOOTSTRAP}",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "${KAFKA_USER}",
        "sasl_password": "${KAFKA_PASSWORD}",
        "ssl_cafile": "${KAFKA_CA_FILE}",
    }
    pipe = write_pipeline(tmp_path, pg_db, ["public.t"], name="devsecure", log={"kafka": sasl}, sinks=[])
    run = cdc("validate", pipe, env=env)
    assert run.code == 0, run
    assert "connected (SASL_SSL) as 'cdc' (SCRAM-SHA-512)" in run.out, run.out
    snap = cdc("snapshot", pipe, "--no-progress", env=env)
    assert snap.code == 0 and "published 5 records to Kafka" in snap.out, snap
    read = cdc("log", "read", pipe, "--table", "public.t", env=env)
    assert read.code == 0, read
    assert sorted(json.loads(line)["after"]["id"] for line in read.out.splitlines()) == [1, 2, 3, 4, 5]
    assert password not in run.out + run.err + snap.out + snap.err + read.out + read.err

    mtls = {
        "bootstrap_servers": "${KAFKA_MTLS_BOOTSTRAP}",
        "security_protocol": "SSL",
        "ssl_cafile": "${KAFKA_CA_FILE}",
        "ssl_certfile": "${KAFKA_CERT_FILE}",
        "ssl_keyfile": "${KAFKA_KEY_FILE}",
    }
    pipe = write_pipeline(tmp_path, pg_db, ["public.t"], name="devsecure", log={"kafka": mtls}, sinks=[])
    run = cdc("validate", pipe, env=env)
    assert run.code == 0, run
    assert "may write and read the log's 3 existing topic(s)" in run.out, run.out  # the same user as SCRAM's

    down = cdc("dev", "down", "kafka", "--dir", dev_dir, timeout=120)
    assert down.code == 0 and "kafka: stopped" in down.out, down
    assert not port_open(port)
    plain = cdc("dev", "up", "kafka", "--dir", dev_dir)
    assert plain.code == 2, plain
    assert "holds a secured dev Kafka; it cannot be started plain" in plain.err, plain.err
