"""Spark security settings (README "Running on a cluster"): spark.secret from ${ENV} turns on
authentication and encryption, secrets stay off the JVM's command line, and `cdc dev up spark
--secure` takes its secret from the environment only (exit 2 without it, never printed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pipelines.cli import cli
from pipelines.spark import SECRET_CONF, security_conf
from sinks.registry import load_pipeline

pytestmark = pytest.mark.unit


def pipeline(tmp_path: Path, spark: str) -> Path:
    path = tmp_path / "p.yml"
    path.write_text(
        "name: p\nsource: {postgres: {dsn: 'postgresql://u@127.0.0.1/d', tables: [public.t]}}\n" + spark
    )
    return path


def test_secret_from_env_sets_authentication_and_encryption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_SECRET", "from-the-env-123")
    p = load_pipeline(pipeline(tmp_path, "spark: {master: 'spark://h:7077', secret: '${SPARK_SECRET}'}\n"))
    assert security_conf(p) == {
        "spark.authenticate": "true",
        "spark.authenticate.secret": "from-the-env-123",
        "spark.network.crypto.enabled": "true",
        "spark.io.encryption.enabled": "true",
    }
    assert "from-the-env-123" not in repr(p.spark)
    plain = load_pipeline(pipeline(tmp_path, "spark: {secret: '${SPARK_SECRET}', encrypt: false}\n"))
    assert security_conf(plain) == {
        "spark.authenticate": "true",
        "spark.authenticate.secret": "from-the-env-123",
    }
    assert security_conf(load_pipeline(pipeline(tmp_path, ""))) == {}


def test_secret_keys_stay_off_the_command_line() -> None:
    kept_off = [
        "spark.authenticate.secret",
        "spark.ssl.keyPassword",
        "spark.kafka.token",
        "spark.redis.password",
    ]
    assert all(SECRET_CONF.search(k) for k in kept_off)
    assert not any(SECRET_CONF.search(k) for k in ["spark.master", "spark.jars", "spark.authenticate"])


def test_dev_up_secure_needs_the_secret_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_SECRET", raising=False)
    run = CliRunner().invoke(cli, ["dev", "up", "spark", "--secure", "--dir", str(tmp_path)])
    assert run.exit_code == 2, run.output
    assert "$SPARK_SECRET" in run.output and "fix: export SPARK_SECRET=" in run.output, run.output
    run = CliRunner().invoke(cli, ["dev", "up", "redis", "--secure", "--dir", str(tmp_path)])
    assert run.exit_code == 2 and "--secure is for kafka and spark" in run.output, run.output
    assert not (tmp_path / "spark").exists()  # nothing started
