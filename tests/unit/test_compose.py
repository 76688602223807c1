"""docker-compose.yml (README "Operations", "Running in containers"): valid per the Compose
Specification, no secret in the file, and in step with the example pipeline and the secrets
scripts/compose-secrets.sh writes; Kafka's client listener is SASL_SSL (SCRAM-SHA-512) and
OpenSearch's HTTP is TLS with sign-in, the pipeline uses both, the certificates the script makes
verify against its CA, and the Kafka entry point formats a storage with the SCRAM user through
Kafka 4.3.1's own storage tool (the jars of .jars/kafka).

No Docker engine runs here, so no container is started and the file is validated against the Compose Specification's JSON
schema: the copy the PyPI package check-jsonschema 0.39.0 vendors from the compose-spec project
(check_jsonschema/builtin_schemas/vendor/compose-spec.json, Apache-2.0), read from the wheel
scripts/setup.sh downloads into .cache/pypi (not installed). Its sha256 is the one the package
records for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import stat
import subprocess
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml

from sinks.registry import load_pipeline

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
WHEEL = REPO / ".cache/pypi/check_jsonschema-0.39.0-py3-none-any.whl"
VENDOR = "check_jsonschema/builtin_schemas/vendor"
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
EXAMPLE = REPO / "pipelines/examples/shop.yml"


def schema() -> dict:
    assert WHEEL.exists(), f"{WHEEL.relative_to(REPO)} is missing: scripts/setup.sh downloads it"
    with zipfile.ZipFile(WHEEL) as wheel:
        text = wheel.read(f"{VENDOR}/compose-spec.json")
        recorded = wheel.read(f"{VENDOR}/sha256/compose-spec.sha256").decode().split()[0]
    assert hashlib.sha256(text).hexdigest() == recorded
    return json.loads(text)


def _ports(service: str) -> set[int]:
    svc = COMPOSE["services"][service]
    return {int(str(p).split(":")[-1]) for p in svc.get("ports", []) + svc.get("expose", [])}


def test_compose_file_follows_the_compose_specification() -> None:
    jsonschema.Draft202012Validator(schema()).validate(COMPOSE)


def test_an_invalid_compose_file_is_rejected() -> None:
    """The schema check can fail: a wrong type for `ports`, an unknown key of a secret."""
    validator = jsonschema.Draft202012Validator(schema())
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"services": {"x": {"image": "y", "ports": "not-a-list"}}})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"services": {"x": {"image": "y"}}, "secrets": {"s": {"path": "./s"}}})


def _strings(node: Any, where: str = "") -> list[tuple[str, str]]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in _strings(v, f"{where}.{k}")]
    if isinstance(node, list):
        return [s for i, v in enumerate(node) for s in _strings(v, f"{where}[{i}]")]
    return [(where, str(node))]


def test_no_secret_in_the_compose_file() -> None:
    """Passwords are compose secrets (files), never values: no *PASSWORD*/*SECRET*/*TOKEN*
    variable that is not a *_FILE path, no URL with a password, ports on the host's loopback."""
    for name, svc in COMPOSE["services"].items():
        for var, value in (svc.get("environment") or {}).items():
            if re.search(r"PASSWORD|SECRET|TOKEN|DSN", var) and not var.endswith("_FILE"):
                pytest.fail(f"services.{name}.environment.{var} holds a secret: use a compose secret")
            if var.endswith("_FILE"):
                secret = Path(str(value)).name
                assert secret in (svc.get("secrets") or []), f"{name}: {var} names a secret it does not mount"
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond the host's loopback"
    for where, text in _strings(COMPOSE):
        assert not re.search(r"://[^/@\s]*:[^/@\s]+@", text), f"{where}: a URL with a password"
    for name, secret in COMPOSE["secrets"].items():
        assert secret["file"] == f"./secrets/{name}", name
    text = (REPO / "docker-compose.yml").read_text()
    assert "PRIVATE KEY" not in text and "BEGIN CERTIFICATE" not in text
    assert not re.search(r"password\s*=\s*\\?\"[^$\\]", text), "a JAAS line with a literal password"
    assert "/secrets/" in (REPO / ".gitignore").read_text().splitlines()


def make_secrets(tmp_path: Path) -> Path:
    out = tmp_path / "secrets"
    done = subprocess.run(
        [REPO / "scripts/compose-secrets.sh", out], capture_output=True, text=True, timeout=60, check=True
    )
    for f in out.iterdir():
        assert f.read_text().strip() not in done.stdout + done.stderr  # never printed
    return out


KEYS = {"ca.key", "kafka.key", "kafka.pem", "opensearch.key"}  # owner-only


def test_compose_secrets_script_writes_every_secret_once(tmp_path: Path) -> None:
    out = make_secrets(tmp_path)
    assert {f.name for f in out.iterdir()} == set(COMPOSE["secrets"]) | {
        "redis_password",
        "ca.key",
        "kafka.crt",
        "kafka.key",
    }
    assert oct(out.stat().st_mode & 0o777) == "0o700"
    for f in out.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == (0o600 if f.name in KEYS else 0o644), f.name
    before = {f.name: f.read_text() for f in out.iterdir()}
    make_secrets(tmp_path)  # again: kept as they are
    assert before == {f.name: f.read_text() for f in out.iterdir()}
    pg = urlparse(before["cdc_pg_dsn"].strip())
    assert pg.password == before["cdc_pg_password"].strip() and pg.username == "cdc"
    redis = urlparse(before["cdc_redis_url"].strip())
    assert f"requirepass {redis.password}\n" in before["redis.conf"]


def test_the_example_pipeline_reads_the_compose_secrets_and_services(tmp_path: Path, monkeypatch) -> None:
    """With the cdc service's environment (its *_FILE paths pointing at the written secrets), the
    example pipeline's addresses are the compose services', the DSN is the least-privilege role's."""
    out = make_secrets(tmp_path)
    cdc = COMPOSE["services"]["cdc"]
    for var in [v for v in os.environ if v in ("PG_DSN", "REDIS_URL", "KAFKA_BOOTSTRAP", "OPENSEARCH_URL")]:
        monkeypatch.delenv(var)
    for var in [v for v in os.environ if v.startswith(("KAFKA_", "OPENSEARCH_"))]:
        monkeypatch.delenv(var)
    for var, value in cdc["environment"].items():
        value = str(value)
        monkeypatch.setenv(var, str(out / Path(value).name) if var.endswith("_FILE") else value)
    monkeypatch.setenv("CDC_STATE_DIR", str(tmp_path / "state"))
    assert cdc["command"][:2] == ["run", "pipelines/examples/shop.yml"] and "build" in cdc
    pipe = load_pipeline(EXAMPLE)
    pg = urlparse(pipe.source.postgres.dsn)
    assert pg.hostname == "postgres" and pg.port in _ports("postgres") and pg.path == "/shop"
    assert pg.password == (out / "cdc_pg_password").read_text().strip()
    env = COMPOSE["services"]["postgres"]["environment"]
    assert env["POSTGRES_DB"] == "shop" and env["CDC_PG_PASSWORD_FILE"] == "/run/secrets/cdc_pg_password"
    kafka = pipe.log_config.kafka
    host, port = kafka.bootstrap_servers.split(":")
    assert host == "kafka" and int(port) in _ports("kafka")
    assert _kafka_listeners()[f"{host}:{port}"] == "SASL_SSL"  # the advertised address the pipeline reaches
    assert kafka.security_protocol == "SASL_SSL" and kafka.sasl_mechanism == "SCRAM-SHA-512"
    assert (
        kafka.sasl_username == "cdc" and kafka.sasl_password == (out / "kafka_password").read_text().strip()
    )
    assert Path(kafka.ssl_cafile) == out / "ca.crt"
    sinks = {s.name: s for s in pipe.sinks}
    search_sink = sinks["search"].search
    search = urlparse(search_sink.hosts[0])
    assert (
        search.scheme == "https" and search.hostname == "opensearch" and search.port in _ports("opensearch")
    )
    assert search_sink.username == "admin"
    assert search_sink.password == (out / "opensearch_admin_password").read_text().strip()
    assert Path(search_sink.ca_file) == out / "ca.crt"
    cache = urlparse(sinks["cache"].redis.url)
    assert cache.hostname == "redis" and cache.port in _ports("redis")
    assert pipe.metrics.host == "0.0.0.0" and f"127.0.0.1:9187:{cdc['command'][-1]}" in cdc["ports"]


def test_compose_postgres_has_logical_decoding_the_schema_and_the_role() -> None:
    pg = COMPOSE["services"]["postgres"]
    assert "wal_level=logical" in pg["command"]
    mounted = " ".join(pg["volumes"])
    assert "pipelines/examples/shop.sql" in mounted and "pipelines/examples/cdc-role.sh" in mounted
    assert (REPO / "pipelines/examples/cdc-role.sh").stat().st_mode & 0o111


def test_debezium_worker_is_optional() -> None:
    assert COMPOSE["services"]["debezium"]["profiles"] == ["debezium"]


def _kafka_listeners() -> dict[str, str]:
    """Advertised host:port -> security protocol of the Kafka service."""
    env = COMPOSE["services"]["kafka"]["environment"]
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    return {
        addr: protocols[name]
        for name, addr in (a.split("://") for a in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    }


def _mounted(service: str) -> dict[str, str]:
    """Secret name -> the path it is mounted at in `service`."""
    out = {}
    for s in COMPOSE["services"][service].get("secrets", []):
        if isinstance(s, str):
            out[s] = f"/run/secrets/{s}"
        else:
            out[s["source"]] = s.get("target") or f"/run/secrets/{s['source']}"
    return out


def test_kafka_clients_listener_is_sasl_ssl_with_scram_sha_512() -> None:
    """Every listener reachable beyond the container's loopback is SASL_SSL (SCRAM-SHA-512 only),
    its keystore and truststore are the mounted secrets, its JAAS line holds no password; the
    broker's own traffic (inter-broker, controller) stays on the container's loopback."""
    kafka = COMPOSE["services"]["kafka"]
    env = kafka["environment"]
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    for listener in env["KAFKA_LISTENERS"].split(","):
        name, addr = listener.split("://")
        if protocols[name] != "SASL_SSL":
            assert addr.startswith("127.0.0.1:"), (
                f"{listener} is {protocols[name]} beyond the container's loopback"
            )
    assert {a: p for a, p in _kafka_listeners().items() if not a.startswith("127.0.0.1:")} == {
        "kafka:9092": "SASL_SSL"
    }
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].endswith("@127.0.0.1:9093")
    assert (
        env["KAFKA_SASL_ENABLED_MECHANISMS"]
        == env["KAFKA_LISTENER_NAME_CLIENT_SASL_ENABLED_MECHANISMS"]
        == "SCRAM-SHA-512"
    )
    jaas = env["KAFKA_LISTENER_NAME_CLIENT_SCRAM___SHA___512_SASL_JAAS_CONFIG"]
    assert jaas == "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    mounted = _mounted("kafka")
    assert env["KAFKA_LISTENER_NAME_CLIENT_SSL_KEYSTORE_TYPE"] == "PEM"
    assert env["KAFKA_LISTENER_NAME_CLIENT_SSL_KEYSTORE_LOCATION"] == mounted["kafka.pem"]
    assert env["KAFKA_LISTENER_NAME_CLIENT_SSL_TRUSTSTORE_LOCATION"] == mounted["ca.crt"]
    assert "kafka_password" in mounted
    entry = kafka["entrypoint"]
    assert entry[0] == "/bin/bash" and f"./scripts/compose-kafka.sh:{entry[1]}:ro" in kafka["volumes"]
    # Debezium's worker reaches the same listener with SASL_SSL, its password from the secret
    dbz = COMPOSE["services"]["debezium"]
    script = dbz["entrypoint"][-1]
    assert dbz["environment"]["BOOTSTRAP_SERVERS"] == "kafka:9092" and "kafka_password" in dbz["secrets"]
    assert "SECURITY_PROTOCOL=SASL_SSL" in script and "SASL_MECHANISM=SCRAM-SHA-512" in script
    assert "< /run/secrets/kafka_password" in script and "/run/secrets/ca.crt" in script


def test_opensearch_has_the_security_plugin_and_tls_on_http() -> None:
    os_ = COMPOSE["services"]["opensearch"]
    env = os_["environment"]
    assert "DISABLE_SECURITY_PLUGIN" not in env and env["DISABLE_INSTALL_DEMO_CONFIG"] == "true"
    assert env["plugins.security.ssl.http.enabled"] == "true"
    config = "/usr/share/opensearch/config/"
    mounted = _mounted("opensearch")
    for layer in ("http", "transport"):
        for key, secret in (
            ("pemcert", "opensearch.crt"),
            ("pemkey", "opensearch.key"),
            ("pemtrustedcas", "ca.crt"),
        ):
            assert config + env[f"plugins.security.ssl.{layer}.{key}_filepath"] == mounted[secret], (
                layer,
                key,
            )
    assert env["plugins.security.nodes_dn"] == "CN=opensearch"  # the subject compose-secrets.sh gives it
    assert "opensearch_admin_password" in mounted
    entry = os_["entrypoint"]
    assert entry[0] == "/bin/bash" and f"./scripts/compose-opensearch.sh:{entry[1]}:ro" in os_["volumes"]
    script = (REPO / "scripts/compose-opensearch.sh").read_text()
    assert "/run/secrets/opensearch_admin_password" in script and 'hash.sh" -env ' in script
    assert 'exec "$home/opensearch-docker-entrypoint.sh"' in script


def test_compose_entry_point_scripts_are_valid_bash() -> None:
    for name in ("compose-secrets.sh", "compose-kafka.sh", "compose-opensearch.sh"):
        subprocess.run(["bash", "-n", REPO / "scripts" / name], check=True, timeout=30)


def test_compose_certificates_verify_against_the_stack_ca(tmp_path: Path) -> None:
    """Each server certificate is signed by ca.crt, names the compose service it serves, and
    goes with its key; kafka.pem is that key then that certificate (Kafka's PEM keystore)."""
    out = make_secrets(tmp_path)
    for name, host in (("kafka", "kafka"), ("opensearch", "opensearch"), ("opensearch", "localhost")):
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(out / f"{name}.crt", out / f"{name}.key")  # the key matches the certificate
        done = subprocess.run(
            ["openssl", "verify", "-CAfile", out / "ca.crt", "-verify_hostname", host, "-purpose", "sslserver", out / f"{name}.crt"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0 and done.stdout.strip().endswith("OK"), (
            name,
            host,
            done.stdout,
            done.stderr,
        )
    other = subprocess.run(
        ["openssl", "verify", "-CAfile", out / "ca.crt", "-verify_hostname", "opensearch", out / "kafka.crt"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert other.returncode != 0  # the Kafka certificate does not name OpenSearch
    subject = subprocess.run(
        ["openssl", "x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in", out / "opensearch.crt"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    assert (
        subject.strip()
        == "subject=" + COMPOSE["services"]["opensearch"]["environment"]["plugins.security.nodes_dn"]
    )
    pem = (out / "kafka.pem").read_text()
    assert pem == (out / "kafka.key").read_text() + (out / "kafka.crt").read_text()
    assert pem.startswith(
        "-----BEGIN PRIVATE KEY-----"
    )  # unencrypted PKCS#8: what Kafka's PEM keystore reads
    for key in KEYS - {"kafka.pem"}:
        assert (out / key).read_text().startswith("-----BEGIN PRIVATE KEY-----"), key
    ca = subprocess.run(["openssl", "x509", "-noout", "-ext", "basicConstraints", "-in", out / "ca.crt"],
                        capture_output=True, text=True, check=True, timeout=30).stdout  # fmt: skip
    assert "CA:TRUE" in ca


def test_compose_kafka_entry_point_formats_the_storage_with_the_scram_user(tmp_path: Path) -> None:
    """scripts/compose-kafka.sh with the kafka service's environment renders its KAFKA_*
    variables into properties and formats a storage with them through Kafka 4.3.1's own storage
    tool, adding the SCRAM-SHA-512 user from the password file, without printing the password;
    then it hands over to the image's start. Run again: the formatted storage is kept."""
    from pipelines.devservices.jvm import java_bin

    jars = REPO / ".jars/kafka"
    if not any(jars.glob("kafka_2.13-4.3.1.jar")):
        pytest.skip("no Kafka 4.3.1 jars in .jars/kafka: scripts/setup.sh resolves them")
    out = make_secrets(tmp_path)
    seen = tmp_path / "seen"
    storage = tmp_path / "kafka-storage.sh"  # the image's kafka-storage.sh, from the jars
    storage.write_text(
        "#!/bin/sh\n"
        f'cp "$6" {seen}.properties; printf "%s\\n" "$@" > {seen}.args\n'
        f"exec {java_bin()} -cp '{jars}/*' kafka.tools.StorageTool \"$@\"\n"
    )
    run = tmp_path / "run"
    run.write_text(f"#!/bin/sh\necho started > {seen}.run\n")
    for f in (storage, run):
        f.chmod(0o755)
    env = {k: str(v) for k, v in COMPOSE["services"]["kafka"]["environment"].items()}
    data = tmp_path / "data"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env |= {"KAFKA_LOG_DIRS": str(data), "PATH": os.environ["PATH"], "TMPDIR": str(tmp), "PGCDC_SECRETS_DIR": str(out),
            "PGCDC_KAFKA_STORAGE": str(storage), "PGCDC_KAFKA_RUN": str(run)}  # fmt: skip
    password = (out / "kafka_password").read_text().strip()
    for _ in range(2):
        done = subprocess.run(
            ["bash", REPO / "scripts/compose-kafka.sh"], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert password not in done.stdout + done.stderr
        assert (tmp_path / "seen.run").read_text() == "started\n"
    props = dict(
        line.split("=", 1) for line in (tmp_path / "seen.properties").read_text().splitlines() if "=" in line
    )
    assert (
        props["listener.security.protocol.map"] == "CLIENT:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
    )
    assert (
        props["listener.name.client.scram-sha-512.sasl.jaas.config"]
        == env["KAFKA_LISTENER_NAME_CLIENT_SCRAM___SHA___512_SASL_JAAS_CONFIG"]
    )
    assert props["listener.name.client.ssl.keystore.location"] == "/run/secrets/kafka.pem"
    assert props["node.id"] == "1" and props["log.dirs"] == str(data)
    args = (tmp_path / "seen.args").read_text().splitlines()
    assert args[args.index("--add-scram") + 1] == f"SCRAM-SHA-512=[name=cdc,password={password}]"
    meta = (data / "meta.properties").read_text()
    assert f"cluster.id={env['CLUSTER_ID']}" in meta and "node.id=1" in meta
    assert not list(tmp.iterdir())  # its properties file (it names the keystore) is removed
    # the SCRAM user is in the bootstrap metadata format wrote, its password only as a salted hash
    checkpoint = (data / "bootstrap.checkpoint").read_bytes()
    assert b"cdc" in checkpoint and password.encode() not in checkpoint
