"""`cdc dev up|down|status`: the local services, each in <dir>/<name>, started from packages."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from cdc.ground.errors import UsageError


class DevService(Protocol):
    def start(self) -> dict[str, str]: ...
    def stop(self) -> None: ...
    def running(self) -> bool: ...
    def env(self) -> dict[str, str]: ...


def _postgres(base: Path, version: int | None = None) -> DevService:
    from pipelines.devservices.postgres import LocalPostgres

    return LocalPostgres(base / "postgres", version=version)


def _kafka(base: Path, secure: bool | None = None) -> DevService:
    """`secure`: SASL_SSL/mTLS with generated certificates (kafka_secure.py); None: as the
    directory was started (a secured broker leaves <dir>/kafka/secure.json)."""
    from pipelines.devservices.kafka import LocalKafka
    from pipelines.devservices.kafka_secure import SecureKafka

    folder = base / "kafka"
    was_secure = (folder / "secure.json").exists()
    if secure is None:
        secure = was_secure
    elif not secure and was_secure and not (folder / "data" / "meta.properties").exists():
        (folder / "secure.json").unlink()  # a secured start that never formatted: plain from now on
    elif secure != was_secure and (folder / "data" / "meta.properties").exists():
        # its data, users and ports belong to the other kind of broker
        now, then = ("secured", "plain") if secure else ("plain", "secured")
        raise UsageError(
            f"{folder} holds a {then} dev Kafka; it cannot be started {now}",
            f"cdc dev down kafka, then use another --dir (or remove {folder}), or run `cdc dev up kafka"
            f"{' --secure' if was_secure else ''}`",
        )
    return SecureKafka(folder) if secure else LocalKafka(folder)


def _redis(base: Path) -> DevService:
    from pipelines.devservices.redis import LocalRedis

    return LocalRedis(base / "redis")


def _opensearch(base: Path) -> DevService:
    from pipelines.devservices.opensearch import LocalOpenSearch

    return LocalOpenSearch(base / "opensearch")


def _debezium(base: Path) -> DevService:
    """A Debezium connector on the dev PostgreSQL and Kafka of the same --dir (start those first).
    Tables: $DEBEZIUM_TABLES (comma-separated, default public.*); topic prefix: $DEBEZIUM_TOPIC_PREFIX
    (default dbz); slot and publication dbz_dev."""
    import os

    from pipelines.devservices.debezium import LocalDebezium
    from pipelines.devservices.kafka import LocalKafka
    from pipelines.devservices.postgres import LocalPostgres

    pg = LocalPostgres(base / "postgres")
    dsn = pg.dsn() if pg.password_file.exists() else ""
    tables = [t.strip() for t in os.environ.get("DEBEZIUM_TABLES", "public.*").split(",") if t.strip()]
    prefix = os.environ.get("DEBEZIUM_TOPIC_PREFIX", "dbz")
    return LocalDebezium(
        base / "debezium", LocalKafka(base / "kafka").bootstrap, dsn, prefix, tables, "dbz_dev", "dbz_dev"
    )


def _spark(base: Path, secret: str | None = None) -> DevService:
    """A standalone master and two workers (1 core, 1g each); `secret`: authenticated, encrypted RPC."""
    from pipelines.devservices.spark import LocalSparkCluster

    return LocalSparkCluster(base / "spark", secret=secret)


FACTORIES = {
    "postgres": _postgres,
    "kafka": _kafka,
    "redis": _redis,
    "opensearch": _opensearch,
    "debezium": _debezium,
    "spark": _spark,
}
# Started only when named (`cdc dev up postgres kafka debezium`, `cdc dev up spark`): debezium needs
# the others running; spark's three JVMs are for trying the cluster path (docs/cluster.md).
OPTIONAL = {"debezium", "spark"}


def _chosen(services: Iterable[str], every: bool = False) -> list[str]:
    """The named services; none named: the default ones (`every`: the optional ones too)."""
    names = list(services) or [n for n in FACTORIES if every or n not in OPTIONAL]
    unknown = [n for n in names if n not in FACTORIES]
    if unknown:
        raise UsageError(f"unknown service(s): {', '.join(unknown)}", f"choose from: {', '.join(FACTORIES)}")
    return names


def up(
    base: Path, services: Iterable[str], pg_version: int | None = None, secure: bool = False
) -> dict[str, str]:
    """Start the services; `pg_version`: the PostgreSQL major (default: the newest Debian server);
    `secure`: spark with authentication and encryption, its secret from $SPARK_SECRET; kafka with
    SASL_SSL and mTLS only (its exports name the password file, CA and client certificate)."""
    names = _chosen(services)
    if pg_version is not None and "postgres" not in names:
        raise UsageError(
            "--version chooses the PostgreSQL major, but postgres is not started",
            "add postgres: cdc dev up postgres --version N",
        )
    if secure and not {"spark", "kafka"} & set(names):
        raise UsageError(
            "--secure is for kafka and spark, but neither is started",
            "cdc dev up kafka --secure (or spark --secure)",
        )
    secret = os.environ.get("SPARK_SECRET", "") if secure and "spark" in names else None
    if (
        secure and "spark" in names and not secret
    ):  # from the environment only: never on a command line or in output
        raise UsageError(
            "cdc dev up spark --secure takes the cluster's secret from $SPARK_SECRET, which is not set",
            'export SPARK_SECRET="$(openssl rand -hex 32)" and write spark.secret: ${SPARK_SECRET} in the pipeline file',
        )
    env: dict[str, str] = {}
    for name in names:
        if name == "postgres":
            svc = _postgres(base.resolve(), pg_version)
        elif name == "spark":
            svc = _spark(base.resolve(), secret)
        elif name == "kafka":
            svc = _kafka(base.resolve(), secure)
        elif name == "debezium" and (base.resolve() / "kafka" / "secure.json").exists():
            raise UsageError(
                "debezium runs on the plain dev Kafka, but this --dir's Kafka is the secured one",
                "use another --dir for Debezium: cdc dev up postgres kafka debezium --dir .cdc/dbz",
            )
        else:
            svc = FACTORIES[name](base.resolve())
        env |= svc.start()
    return env


def down(base: Path, services: Iterable[str]) -> list[str]:
    lines = []
    # No names: every service, Debezium's Kafka Connect included (started only when named, but a
    # bare `down` must not leave its JVM running); in reverse order, so it stops before Kafka.
    for name in reversed(_chosen(services, every=True)):
        svc = FACTORIES[name](base.resolve())
        if svc.running():
            svc.stop()
            lines.append(f"{name}: stopped")
        else:
            lines.append(f"{name}: not running")
    return lines


def status(base: Path, services: Iterable[str]) -> list[str]:
    lines = []
    for name in _chosen(services, every=True):
        svc = FACTORIES[name](base.resolve())
        if svc.running():
            lines.append(f"{name}: running " + " ".join(f"{k}={v}" for k, v in svc.env().items()))
        else:
            lines.append(f"{name}: stopped")
    return lines


# What `cdc dev up` tells about access (stderr, so `eval "$(cdc dev up)"` is unaffected).
OPEN_ON_LOOPBACK = {"kafka", "redis", "opensearch", "debezium"}


def access_notes(base: Path, services: Iterable[str]) -> list[str]:
    """One note per kind of access the started services allow: the dev PostgreSQL is owner-only,
    the others take any local connection (fine on a developer's machine, not on a shared one)."""
    names = _chosen(services)
    notes = []
    if "postgres" in names:
        notes.append(
            f"note: postgres listens on 127.0.0.1 and asks for the superuser's password over TCP (kept in "
            f"{base.resolve() / 'postgres' / 'password'}, mode 0600); its Unix socket is its own OS user's alone (0700)"
        )
    if "spark" in names:
        spark = base.resolve() / "spark"
        notes.append(
            "note: spark listens on 127.0.0.1; its master takes applications from any local user"
            if not (spark / "conf" / "spark-defaults.conf").exists()
            else f"note: spark listens on 127.0.0.1 and takes only applications with its secret (spark.authenticate, "
            f"RPC encryption; kept in {spark / 'conf' / 'spark-defaults.conf'}, mode 0600)"
        )
    kafka = base.resolve() / "kafka"
    if "kafka" in names and (kafka / "secure.json").exists():
        names = [n for n in names if n != "kafka"]
        notes.append(
            "note: kafka listens on 127.0.0.1 with TLS only: SASL_SSL (SCRAM-SHA-512/256, PLAIN) at KAFKA_BOOTSTRAP, "
            f"mTLS at KAFKA_MTLS_BOOTSTRAP; other users need ACLs (password in {kafka / 'password'}, keys in "
            f"{kafka / 'certs'}, owner-only)"
        )
    open_ones = [n for n in names if n in OPEN_ON_LOOPBACK]
    if open_ones:
        notes.append(
            "note: open to every local user of this machine (127.0.0.1 only, no authentication or TLS; "
            f"dev services, docs/security.md): {', '.join(open_ones)}"
        )
    return notes
