"""docker-compose.yml (README "Operations", "Running in containers"): valid per the Compose
Specification, no secret in the file, and in step with the example pipeline and the secrets
scripts/compose-secrets.sh writes.

No Docker engine runs here, so the file is validated against the Compose Specification's JSON
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
import subprocess
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml

from cdc.ground.config import load_pipeline

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
    assert "/secrets/" in (REPO / ".gitignore").read_text().splitlines()


def make_secrets(tmp_path: Path) -> Path:
    out = tmp_path / "secrets"
    done = subprocess.run(
        [REPO / "scripts/compose-secrets.sh", out], capture_output=True, text=True, timeout=60, check=True
    )
    for f in out.iterdir():
        assert f.read_text().strip() not in done.stdout + done.stderr  # never printed
    return out


def test_compose_secrets_script_writes_every_secret_once(tmp_path: Path) -> None:
    out = make_secrets(tmp_path)
    assert {f.name for f in out.iterdir()} == set(COMPOSE["secrets"]) | {"redis_password"}
    assert oct(out.stat().st_mode & 0o777) == "0o700"
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
    host, port = pipe.log_config.kafka.bootstrap_servers.split(":")
    assert host == "kafka" and int(port) in _ports("kafka")
    assert f"PLAINTEXT://{host}:{port}" in COMPOSE["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    sinks = {s.name: s for s in pipe.sinks}
    search = urlparse(sinks["search"].search.hosts[0])
    assert search.hostname == "opensearch" and search.port in _ports("opensearch")
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
