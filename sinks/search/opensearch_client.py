"""The OpenSearch clients of a search sink (docs/security.md): one picklable ClientSettings built
on the driver from the sink's settings, turned into an opensearch-py client wherever it is needed
(the driver's index management, `cdc verify`/`status`/`reset`, and the Spark executors' bulk
writes and scroll reads), so every client signs in and checks TLS the same way.

* HTTP basic auth: `username`/`password` (the password comes from `${ENV}` in the pipeline file
  and is never printed; credentials inside a host URL keep working too). Passwords are held as
  SecretRef: a task pickled for the executors carries the variable's name, not the value.
* TLS: `https://` hosts; `ca_file` (else the system's CAs), `client_cert`/`client_key` for mTLS,
  `verify_certs: false` to skip the certificate and host name checks (test clusters only).
* `aws_sigv4`: every request signed with opensearch-py's Urllib3AWSV4SignerAuth; credentials
  come from boto3's standard chain (AWS_ACCESS_KEY_ID/..., a profile, an instance role),
  resolved where the client is made, so executors use their own environment. boto3 is optional:
  without it such a sink stops with exit 3 saying to install it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc.ground.errors import EngineSettingError
from cdc.ground.executor_secrets import SecretRef, env_name, split_host_password, with_password

if TYPE_CHECKING:
    from opensearchpy import OpenSearch

    from sinks.search.settings import SearchSettings


@dataclass(frozen=True)
class ClientSettings:
    hosts: tuple[str, ...]  # without passwords (docs/cluster.md, secrets on the executors)
    timeout: float
    username: str | None = None
    # By reference: pickled into executor tasks as the variable's name only (cdc/ground/executor_secrets.py)
    password: SecretRef | None = field(default=None, repr=False)
    host_passwords: tuple[SecretRef | None, ...] = field(default=(), repr=False)  # of a host URL, per host
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    verify_certs: bool = True
    sigv4_region: str | None = None
    sigv4_service: str = "es"
    where: str = "the search sink"  # how errors name the settings, e.g. "sinks[s].search"

    @classmethod
    def of(cls, settings: SearchSettings, sink_name: str) -> ClientSettings:
        sigv4 = settings.aws_sigv4
        hosts, host_passwords = [], []
        for i, host in enumerate(settings.hosts or []):
            bare, secret = split_host_password(host)
            hosts.append(bare)
            var = env_name(sink_name, f"host{i}_password")
            host_passwords.append(SecretRef(var, secret) if secret else None)
        password = settings.password
        return cls(
            hosts=tuple(hosts),
            timeout=settings.timeout_s,
            username=settings.username,
            password=SecretRef(env_name(sink_name, "password"), password) if password is not None else None,
            host_passwords=tuple(host_passwords),
            ca_file=settings.ca_file,
            client_cert=settings.client_cert,
            client_key=settings.client_key,
            verify_certs=settings.verify_certs,
            sigv4_region=sigv4.region if sigv4 else None,
            sigv4_service=sigv4.service if sigv4 else "es",
            where=f"sinks[{sink_name}].search",
        )

    @property
    def secrets(self) -> list[str]:
        """The values known here, to mask in messages (never raises on an executor)."""
        refs = [self.password, *self.host_passwords]
        return [v for v in (r.peek() for r in refs if r is not None) if v]

    @property
    def refs(self) -> list[SecretRef]:
        return [r for r in (self.password, *self.host_passwords) if r is not None]

    def host_urls(self) -> list[str]:
        """The hosts with their passwords back in (read from the environment on an executor)."""
        return [
            with_password(host, ref.get()) if ref is not None else host
            for host, ref in zip(self.hosts, self.host_passwords or (None,) * len(self.hosts), strict=True)
        ]


def _sigv4_auth(cs: ClientSettings) -> Any:
    try:
        import boto3
    except ImportError:
        raise EngineSettingError(
            f"{cs.where}.aws_sigv4 needs the boto3 package (AWS credentials for the SigV4 signer), which is not installed",
            "install it into the tool's Python environment (`pip install boto3`), on the Spark executors too",
        ) from None
    from opensearchpy import Urllib3AWSV4SignerAuth

    credentials = boto3.Session().get_credentials()
    if credentials is None:
        raise EngineSettingError(
            f"{cs.where}.aws_sigv4: no AWS credentials found (environment, shared profile or instance role)",
            "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), AWS_PROFILE, or run with a role",
        )
    return Urllib3AWSV4SignerAuth(credentials, cs.sigv4_region, cs.sigv4_service)


def make_client(cs: ClientSettings) -> OpenSearch:
    from opensearchpy import OpenSearch

    kwargs: dict[str, Any] = {
        "hosts": cs.host_urls(),
        "timeout": cs.timeout,
        "max_retries": 2,
        "retry_on_timeout": False,
        "verify_certs": cs.verify_certs,
    }
    if not cs.verify_certs:
        kwargs |= {
            "ssl_assert_hostname": False,
            "ssl_show_warn": False,
        }  # docs/security.md: test clusters only
    if cs.ca_file:
        kwargs["ca_certs"] = cs.ca_file
    if cs.client_cert:
        kwargs |= {"client_cert": cs.client_cert, "client_key": cs.client_key}
    if cs.username is not None:
        kwargs["http_auth"] = (cs.username, cs.password.get() if cs.password is not None else "")
    elif cs.sigv4_region:
        kwargs["http_auth"] = _sigv4_auth(cs)
    return OpenSearch(**kwargs)
