"""A secured throwaway Kafka broker: `cdc dev up kafka --secure`, and the tests' secured broker.

LocalKafka (pipelines/devservices/kafka.py) with every listener on TLS, certificates made at first
start by pipelines/devservices/certs.py under `<base_dir>/certs`:

  SASL_SSL  (`port`, the bootstrap)  SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN logins
  SSL       (`mtls_port`)            mTLS: a client certificate is required; also the broker's own
                                     inter-broker listener
  CONTROLLER (`controller_port`)     KRaft controller traffic, mTLS too

A certificate's principal is its CN (`ssl.principal.mapping.rules`), so `certs/client.crt`
(CN=<user>) signs in as the same user as the SCRAM login. With `authorize` (the default) the broker
runs Kafka's StandardAuthorizer: `user` and the broker itself are super users, any other user
(`users`: more SCRAM logins, e.g. for least-privilege tests) has only the ACLs it is given.

Passwords never reach a command line: SCRAM credentials are upserted after start through the
broker's own certificate over mTLS; PLAIN's user list is in server.properties, which, like the
password file `<base_dir>/password` and the keys, is 0600 in a 0700 directory.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc.ground.errors import ServiceError
from cdc.ground.private import private_dir, private_open
from pipelines.devservices.base import LOOPBACK, free_port
from pipelines.devservices.certs import BROKER_CN, issue, make_certs
from pipelines.devservices.kafka import LocalKafka

MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


@dataclass
class SecureKafka(LocalKafka):
    user: str = "cdc"
    users: Mapping[str, str] | None = None  # more SCRAM/PLAIN users: name -> password
    authorize: bool = True
    mtls_port: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.certs_dir = self.base_dir / "certs"
        self.password_file = self.base_dir / "password"
        self.secure_file = self.base_dir / "secure.json"  # marks the directory as a secured broker's
        if self.secure_file.exists():
            try:
                saved = json.loads(self.secure_file.read_text())
                self.mtls_port = int(saved["mtls"])
                self.user = str(saved.get("user", self.user))
            except (OSError, ValueError, KeyError):
                pass

    # -- what clients use --------------------------------------------------------------------
    @property
    def ca_file(self) -> Path:
        return self.certs_dir / "ca.crt"

    @property
    def client_cert(self) -> Path:
        return self.certs_dir / "client.crt"

    @property
    def client_key(self) -> Path:
        return self.certs_dir / "client.key"

    @property
    def mtls_bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.mtls_port}"

    @property
    def password(self) -> str:
        try:
            return self.password_file.read_text().strip()
        except OSError:
            raise ServiceError(
                f"the secured Kafka in {self.base_dir} has no password file {self.password_file}",
                "start it with `cdc dev up kafka --secure` (it writes one)",
            ) from None

    def env(self) -> dict[str, str]:
        """Shell exports for a pipeline file (docs/security.md, dev services); the password as a file, so no
        secret is printed: `sasl_password: ${KAFKA_PASSWORD}` reads $KAFKA_PASSWORD_FILE."""
        return {
            "KAFKA_BOOTSTRAP": self.bootstrap,
            "KAFKA_USER": self.user,
            "KAFKA_PASSWORD_FILE": str(self.password_file),
            "KAFKA_CA_FILE": str(self.ca_file),
            "KAFKA_MTLS_BOOTSTRAP": self.mtls_bootstrap,
            "KAFKA_CERT_FILE": str(self.client_cert),
            "KAFKA_KEY_FILE": str(self.client_key),
        }

    def start(self) -> dict[str, str]:
        if self.running():
            return self.env()
        private_dir(self.base_dir)
        if not self.password_file.exists():
            with private_open(self.password_file, "w") as out:
                out.write(secrets.token_urlsafe(24) + "\n")
        if not (self.certs_dir / "broker.pem").exists():
            private_dir(self.certs_dir)
            make_certs(self.certs_dir)  # ca.crt, broker.pem (CN=BROKER_CN, 127.0.0.1 and localhost)
            issue(self.certs_dir, "client", f"/CN={self.user}")
        env = super().start()
        self._upsert_scram()
        return env

    # -- the broker's own admin identity: its certificate over mTLS ------------------------------
    @property
    def admin_bootstrap(self) -> str:
        return self.mtls_bootstrap

    def admin_security(self) -> dict[str, Any]:
        return {
            "security_protocol": "SSL",
            "ssl_cafile": str(self.ca_file),
            "ssl_certfile": str(self.certs_dir / "broker.crt"),
            "ssl_keyfile": str(self.certs_dir / "broker.key"),
        }

    def admin(self) -> Any:
        """A kafka-python admin client signed in as the broker (a super user): for ACLs in tests."""
        from kafka import KafkaAdminClient

        return KafkaAdminClient(
            bootstrap_servers=[self.admin_bootstrap], client_id="cdc-dev-admin", **self.admin_security()
        )

    def _all_users(self) -> dict[str, str]:
        return {self.user: self.password, **dict(self.users or {})}

    def _upsert_scram(self) -> None:
        from kafka.admin import UserScramCredentialUpsertion

        client = self.admin()
        failed: dict[str, str] = {}
        try:
            for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):  # one credential per user and request
                alterations = [
                    UserScramCredentialUpsertion(u, mechanism, p) for u, p in self._all_users().items()
                ]
                failed |= {u: e for u, e in client.alter_user_scram_credentials(alterations).items() if e}
        finally:
            client.close()
        if failed:
            self.stop()
            raise ServiceError(f"Kafka refused to add SCRAM users: {failed}", f"see {self.log_file}")

    # -- configuration ---------------------------------------------------------------------------
    def _choose_ports(self) -> None:
        super()._choose_ports()
        while not self.mtls_port or self.mtls_port in (self.port, self.controller_port):
            self.mtls_port = free_port()
        self.secure_file.write_text(json.dumps({"mtls": self.mtls_port, "user": self.user}) + "\n")

    def _tls(self, listener: str, client_auth: bool) -> dict[str, str]:
        prefix = f"listener.name.{listener}.ssl."
        out = {
            prefix + "keystore.type": "PEM",
            prefix + "keystore.location": str(self.certs_dir / "broker.pem"),
            prefix + "truststore.type": "PEM",
            prefix + "truststore.location": str(self.ca_file),
        }
        if client_auth:
            out[prefix + "client.auth"] = "required"
        return out

    def _properties(self) -> dict[str, str]:
        props = super()._properties()
        sasl, mtls, ctl = (f"{LOOPBACK}:{p}" for p in (self.port, self.mtls_port, self.controller_port))
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        plain_users = " ".join(f'user_{u}="{p}"' for u, p in self._all_users().items())
        props |= {
            "listeners": f"SASL_SSL://{sasl},SSL://{mtls},CONTROLLER://{ctl}",
            "advertised.listeners": f"SASL_SSL://{sasl},SSL://{mtls}",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:SSL",
            "inter.broker.listener.name": "SSL",
            "sasl.enabled.mechanisms": ",".join(MECHANISMS),
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram,
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": scram,
            "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
            ),
            # a certificate signs in as its CN: certs/client.crt (CN=<user>) is that user
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
            **self._tls("sasl_ssl", client_auth=False),
            **self._tls("ssl", client_auth=True),
            **self._tls("controller", client_auth=True),
        }
        if self.authorize:
            props |= {
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": f"User:{BROKER_CN};User:{self.user}",
                "allow.everyone.if.no.acl.found": "false",
            }
        return props

    def _write_config(self) -> None:
        super()._write_config()
        self.config_file.chmod(0o600)  # PLAIN's users and passwords
