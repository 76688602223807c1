"""Secrets from files (README "Secrets from files"): `${VAR}` in the pipeline file takes the
content of the file `$VAR_FILE` names (as container orchestrators mount secrets), its trailing
newline stripped; both set, or a file that cannot be read, is exit 2 naming the variable and the
path, never the secret. Through parse_pipeline and through the real `cdc validate`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from cdc.ground.errors import PipelineFileError
from sinks.registry import parse_pipeline
from tests.harness import cdc

pytestmark = pytest.mark.unit

SECRET = "s3cret-from-a-file"


def _doc() -> dict:
    return {
        "name": "shop",
        "source": {"postgres": {"dsn": "postgresql://u@127.0.0.1:1/db", "tables": ["public.t"]}},
        "log": {
            "kafka": {
                "bootstrap_servers": "127.0.0.1:1",
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_username": "cdc",
                "sasl_password": "${KAFKA_PASSWORD}",
            }
        },
    }


def test_value_from_the_file_without_its_trailing_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAFKA_PASSWORD", raising=False)
    secret = tmp_path / "kafka-password"
    secret.write_text(SECRET + "\n")
    monkeypatch.setenv("KAFKA_PASSWORD_FILE", str(secret))
    kafka = parse_pipeline(_doc()).log.kafka
    assert kafka is not None and kafka.sasl_password == SECRET
    secret.write_text(SECRET + "\r\n")  # written on Windows
    assert parse_pipeline(_doc()).log.kafka.sasl_password == SECRET
    secret.write_text(SECRET)  # as Kubernetes mounts it: no newline
    assert parse_pipeline(_doc()).log.kafka.sasl_password == SECRET


def test_the_environment_still_works_and_a_default_yields_to_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAFKA_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("KAFKA_PASSWORD", "from-env")
    assert parse_pipeline(_doc()).log.kafka.sasl_password == "from-env"
    doc = _doc()
    doc["log"]["kafka"]["sasl_password"] = "${KAFKA_PASSWORD:-the-default}"
    monkeypatch.delenv("KAFKA_PASSWORD")
    assert parse_pipeline(doc).log.kafka.sasl_password == "the-default"
    secret = tmp_path / "pw"
    secret.write_text(SECRET + "\n")
    monkeypatch.setenv("KAFKA_PASSWORD_FILE", str(secret))
    assert parse_pipeline(doc).log.kafka.sasl_password == SECRET


def test_both_set_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "pw"
    secret.write_text(SECRET)
    monkeypatch.setenv("KAFKA_PASSWORD", "from-env")
    monkeypatch.setenv("KAFKA_PASSWORD_FILE", str(secret))
    with pytest.raises(PipelineFileError) as caught:
        parse_pipeline(_doc())
    assert "both KAFKA_PASSWORD and KAFKA_PASSWORD_FILE are set" in caught.value.problem
    assert SECRET not in str(caught.value) and "from-env" not in str(caught.value)


@pytest.mark.parametrize("case", ["missing", "unreadable", "directory"])
def test_a_file_that_cannot_be_read_is_exit_2_through_the_cli(tmp_path: Path, case: str) -> None:
    if case == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads a 0000 file")  # root ignores file modes
    secret = tmp_path / "kafka-password"
    if case == "unreadable":
        secret.write_text(SECRET)
        secret.chmod(0)
    elif case == "directory":
        secret.mkdir()
    why = {
        "missing": "No such file or directory",
        "unreadable": "Permission denied",
        "directory": "Is a directory",
    }[case]
    pipe = tmp_path / "shop.yml"
    pipe.write_text(yaml.safe_dump(_doc()))
    run = cdc("validate", pipe, env={"KAFKA_PASSWORD_FILE": str(secret)})
    assert run.code == 2, run
    assert (
        f"log.kafka.sasl_password: ${{KAFKA_PASSWORD}} is read from KAFKA_PASSWORD_FILE={secret}, "
        f"which cannot be read ({why})" in run.err
    ), run.err
    assert "fix: put the secret in that file" in run.err, run.err
    assert "Traceback" not in run.err and SECRET not in run.out + run.err
