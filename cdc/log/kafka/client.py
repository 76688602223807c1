"""kafka-python clients configured for the log: bounded timeouts, an idempotent batch producer
with acks=all (no loss, no reordering), topic creation and cleanup-policy checks, clear errors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError, TopicAlreadyExistsError

from cdc.ground.errors import LogError, UsageError
from cdc.log.kafka.batch_producer import BatchProducer

if TYPE_CHECKING:
    from cdc.ground.config import Pipeline
    from cdc.ground.log_config import KafkaLog

TIMEOUT_MS = 15_000


def kafka_log(pipeline: Pipeline) -> tuple[KafkaLog, str]:
    """The pipeline's `log: kafka:` settings and its topics' prefix (the pipeline's name unless set)."""
    cfg = pipeline.log_config.kafka
    assert cfg is not None, "a Kafka log's code runs only for a pipeline whose log is kafka"
    return cfg, cfg.topic_prefix or pipeline.name


def servers(bootstrap: str | list[str]) -> list[str]:
    return [s.strip() for s in bootstrap.split(",")] if isinstance(bootstrap, str) else list(bootstrap)


def _bootstrap(target: KafkaLog | str | list[str]) -> str | list[str]:
    return target if isinstance(target, (str, list)) else target.bootstrap_servers


def security(target: KafkaLog | str | list[str]) -> dict[str, Any]:
    """kafka-python settings of `log: kafka`'s security keys (docs/security.md), for every client."""
    if isinstance(target, (str, list)) or target.security_protocol == "PLAINTEXT":
        return {}
    out: dict[str, Any] = {"security_protocol": target.security_protocol}
    if target.security_protocol.startswith("SASL_"):
        out |= {
            "sasl_mechanism": target.sasl_mechanism,
            "sasl_plain_username": target.sasl_username,
            "sasl_plain_password": target.sasl_password,
        }
    if target.security_protocol.endswith("SSL"):
        out |= {
            "ssl_cafile": target.ssl_cafile,
            "ssl_certfile": target.ssl_certfile,
            "ssl_keyfile": target.ssl_keyfile,
            "ssl_check_hostname": target.ssl_check_hostname,
        }
    return out


def _unreachable(bootstrap: KafkaLog | str | list[str], exc: Exception) -> LogError:
    return LogError(
        f"cannot reach the Kafka broker at {','.join(servers(_bootstrap(bootstrap)))}: {type(exc).__name__}: {exc}",
        "check log.kafka.bootstrap_servers and that the broker runs (`cdc dev up kafka` starts a local one)",
    )


@contextlib.contextmanager
def connecting(target: KafkaLog | str | list[str]) -> Iterator[None]:
    """Make a client. kafka-python retries a refused login or TLS handshake until its bootstrap
    timeout and then only says it could not bootstrap; with security on, a probe then tells which
    setting is at fault (EngineSettingError, exit 3); anything else is LogError. Never a secret."""
    try:
        yield
    except (KafkaError, OSError) as exc:
        if not isinstance(target, (str, list)) and target.security_protocol != "PLAINTEXT":
            _explain(target)
        raise _unreachable(target, exc) from None


def _tls_probe(target: KafkaLog, host: str, port: int) -> str | None:
    """A TLS handshake as the clients make it: None if it succeeds, 'verify: why' if the broker's
    certificate is refused, 'tls: why' for another TLS failure; OSError if nothing answers."""
    import socket
    import ssl

    ctx = ssl.create_default_context(cafile=target.ssl_cafile)
    ctx.check_hostname = target.ssl_check_hostname
    if target.ssl_certfile and target.ssl_keyfile:
        ctx.load_cert_chain(target.ssl_certfile, target.ssl_keyfile)
    with socket.create_connection((host, port), timeout=10) as sock:
        try:
            with ctx.wrap_socket(sock, server_hostname=host):
                return None
        except ssl.SSLCertVerificationError as exc:
            return f"verify: {exc.verify_message}"
        except ssl.SSLError as exc:
            return f"tls: {exc.reason or exc}"


def _explain(target: KafkaLog) -> None:
    """After a failed bootstrap with security on: EngineSettingError naming the setting at fault,
    found by probing the first broker that accepts a connection (nothing found: return)."""
    from cdc.ground.errors import EngineSettingError

    for server in servers(target.bootstrap_servers):
        host, _, port = server.rpartition(":")
        host = host.strip("[]")
        try:
            tls = _tls_probe(target, host, int(port)) if target.security_protocol.endswith("SSL") else None
        except (OSError, ValueError):
            continue  # this one is unreachable: try the next
        if tls is not None and tls.startswith("verify: "):
            why = tls.removeprefix("verify: ")
            mismatch = "mismatch" in why or "match" in why
            raise EngineSettingError(
                f"Kafka at {server}: the broker's TLS certificate was refused ({why}); log.kafka.ssl_cafile is "
                f"{target.ssl_cafile or 'not set (the system CAs)'}",
                "set log.kafka.ssl_cafile to the CA that signed the brokers' certificates"
                + (", or log.kafka.ssl_check_hostname: false if they name another host" if mismatch else ""),
            ) from None
        if tls is not None:
            raise EngineSettingError(
                f"Kafka at {server}: the TLS handshake failed ({tls})",
                "check log.kafka.security_protocol and the log.kafka.ssl_* settings against the broker's listener",
            ) from None
        if target.security_protocol.startswith("SASL_"):
            raise EngineSettingError(
                f"Kafka at {server} refused the login of log.kafka.sasl_username {target.sasl_username!r} "
                f"({target.sasl_mechanism}): wrong log.kafka.sasl_password, no such user, or a mechanism the broker "
                "does not enable",
                "check log.kafka.sasl_username, log.kafka.sasl_password (its ${ENV} variable) and log.kafka.sasl_mechanism",
            ) from None
        return


def admin(target: KafkaLog | str | list[str]) -> KafkaAdminClient:
    with connecting(target):
        return KafkaAdminClient(
            bootstrap_servers=servers(_bootstrap(target)),
            request_timeout_ms=TIMEOUT_MS,
            client_id="cdc-admin",
            bootstrap_timeout_ms=TIMEOUT_MS,
            **security(target),
        )


def producer(target: KafkaLog | str | list[str]) -> BatchProducer:
    """Idempotent, acks=all, one request in flight (cdc.log.kafka.batch_producer). Needs the
    `crc32c` package (requirements): without it kafka-python computes every record batch's CRC
    in pure Python, which costs more than everything else per record."""
    with connecting(target):
        return BatchProducer(
            servers(_bootstrap(target)),
            client_id="cdc-publisher",
            request_timeout_ms=TIMEOUT_MS,
            **security(target),
        )


def consumer(target: KafkaLog | str | list[str], **settings: Any) -> KafkaConsumer:
    with connecting(target):
        return KafkaConsumer(
            **{
                "bootstrap_servers": servers(_bootstrap(target)),
                "client_id": "cdc-reader",
                "enable_auto_commit": False,
                "auto_offset_reset": "earliest",
                "request_timeout_ms": TIMEOUT_MS + 5000,
                "consumer_timeout_ms": 2000,
                "bootstrap_timeout_ms": TIMEOUT_MS,
                **settings,
                **security(target),
            }
        )


def spark_options(target: KafkaLog | str | list[str]) -> dict[str, str]:
    """The same settings for Spark's Kafka source (`kafka.`-prefixed consumer configs): the CA as
    a PEM truststore, a client certificate as a PEM keystore, SASL as a JAAS line."""
    out = {"kafka.bootstrap.servers": ",".join(servers(_bootstrap(target)))}
    if isinstance(target, (str, list)) or target.security_protocol == "PLAINTEXT":
        return out
    out["kafka.security.protocol"] = target.security_protocol
    if target.security_protocol.startswith("SASL_"):
        module = "plain.PlainLoginModule" if target.sasl_mechanism == "PLAIN" else "scram.ScramLoginModule"

        def quoted(v: str | None) -> str:
            return '"' + (v or "").replace("\\", "\\\\").replace('"', '\\"') + '"'

        out["kafka.sasl.mechanism"] = str(target.sasl_mechanism)
        out["kafka.sasl.jaas.config"] = (
            f"org.apache.kafka.common.security.{module} required "
            f"username={quoted(target.sasl_username)} password={quoted(target.sasl_password)};"
        )
    if target.security_protocol.endswith("SSL"):
        if target.ssl_cafile:
            out |= {"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": target.ssl_cafile}
        if target.ssl_certfile and target.ssl_keyfile:
            from pathlib import Path

            out |= {
                "kafka.ssl.keystore.type": "PEM",
                "kafka.ssl.keystore.certificate.chain": Path(target.ssl_certfile).read_text(),
                "kafka.ssl.keystore.key": Path(target.ssl_keyfile).read_text(),
            }
        out["kafka.ssl.endpoint.identification.algorithm"] = "https" if target.ssl_check_hostname else ""
    return out


def ensure_topics(
    client: KafkaAdminClient, wanted: Mapping[str, Mapping[str, str]], fix_policy: bool, replication: int
) -> None:
    """Create missing topics (1 partition each: one table's events keep their order) and refuse
    existing ones that would delete data by time (cleanup.policy=delete), unless asked to fix them."""
    existing = set(client.list_topics())
    missing = {t: c for t, c in wanted.items() if t not in existing}
    if missing:
        with contextlib.suppress(TopicAlreadyExistsError):  # created concurrently by another process
            client.create_topics(
                {
                    t: {"num_partitions": 1, "replication_factor": replication, "configs": dict(c)}
                    for t, c in missing.items()
                },
                timeout_ms=TIMEOUT_MS,
            )
        client.wait_for_topics(list(missing), timeout_ms=TIMEOUT_MS)
    present = [t for t in wanted if t in existing]
    if not present:
        return
    # describe takes the config names with no values; the stubs want str values
    blank: dict[str, Any] = {"cleanup.policy": None}
    resources = [ConfigResource(ConfigResourceType.TOPIC, t, blank) for t in present]
    for topic, policy in _cleanup_policies(client, resources).items():
        if "compact" in policy:
            continue
        if not fix_policy:
            raise UsageError(
                f"Kafka topic {topic} exists with cleanup.policy={policy}: old events would be deleted by age, "
                "and followers bootstrapping from the log would miss rows",
                "let us change it to compact with `log: {kafka: {fix_cleanup_policy: true}}`, or delete the topic",
            )
        client.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": "compact"})])


def _cleanup_policies(client: KafkaAdminClient, resources: list[ConfigResource]) -> dict[str, str]:
    """topic -> cleanup.policy; kafka-python 3 answers {"topic": {name: {key: {"value": ...}}}}."""
    result: Any = client.describe_configs(resources, config_filter="all")
    found: dict[str, str] = {}
    for name, configs in (result or {}).get("topic", {}).items():
        entry = configs.get("cleanup.policy")
        if entry is not None:
            found[name] = str(entry.get("value") if isinstance(entry, dict) else entry)
    return found


def end_offsets(client: KafkaConsumer, topics: list[str]) -> dict[str, int]:
    """Next offset to be written per topic (partition 0)."""
    parts = [TopicPartition(t, 0) for t in topics]
    return {tp.topic: off for tp, off in client.end_offsets(parts).items()}
