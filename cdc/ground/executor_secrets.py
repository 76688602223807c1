"""Secrets the Spark executors need, kept out of the tasks (docs/cluster.md,
"Secrets on the executors").

The Redis sink's password (in its `url`) and the OpenSearch sink's `password` (or a password
inside one of its `hosts`) are needed where the rows are written: in the executors. Their task
functions are pickled on the driver and shipped with every task, so instead of the value they
carry a `SecretRef`: the name of an environment variable, `CDC_SECRET_<SINK>_<FIELD>`, e.g.
`CDC_SECRET_CACHE_PASSWORD` for sink `cache`, `CDC_SECRET_SEARCH_HOST0_PASSWORD` for the
password in the first of sink `search`'s hosts. The executor's Python worker reads the value from
its own environment, which gets it:

* on a local master: from the driver (the workers are children of this process tree);
* on a cluster, `spark.executor_secrets: conf` (default): from `spark.executorEnv.<VAR>`, set by
  the driver when it builds its session, so each executor gets it once, at launch;
* on a cluster, `spark.executor_secrets: workers`: from the workers' own environment
  (`conf/spark-env.sh`); the driver sends nothing.

The variable names contain SECRET, which Spark's default `spark.redaction.regex` matches: the
UI's environment tab, its REST API and event logs show the key with a redacted value.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

if TYPE_CHECKING:
    from cdc.ground.config import Pipeline, SinkConfig

PREFIX = "CDC_SECRET_"
MISSING = "the Spark executors' environment has no "  # how the driver recognizes ExecutorSecretMissing


def env_name(sink: str, field: str) -> str:
    """The variable an executor reads a sink's secret from (sink names are [a-z][a-z0-9_]*)."""
    return f"{PREFIX}{sink.upper()}_{field.upper()}"


class ExecutorSecretMissing(RuntimeError):
    """Raised in an executor whose environment lacks a secret's variable. Not a CdcError: the
    driver turns the executor's failure into one (exit 3), naming the variable."""

    def __init__(self, var: str):
        super().__init__(f"{MISSING}{var} (a sink's secret)")
        self.var = var


class SecretRef:
    """A secret by the name of its variable. On the driver it also holds the value; pickled
    (into a Spark task) it is the name only, and the executor reads the value from its own
    environment."""

    __slots__ = ("_value", "var")

    def __init__(self, var: str, value: str | None = None):
        self.var = var
        self._value = value

    def __reduce__(self) -> tuple[type[SecretRef], tuple[str]]:
        return (SecretRef, (self.var,))  # the value stays behind

    def get(self) -> str:
        if self._value is not None:
            return self._value
        found = os.environ.get(self.var)
        if found is None:
            raise ExecutorSecretMissing(self.var)
        return found

    def peek(self) -> str | None:
        """The value if known here, else None (for masking messages: never raises)."""
        return self._value if self._value is not None else os.environ.get(self.var)

    def __repr__(self) -> str:
        return f"SecretRef({self.var})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretRef) and other.var == self.var

    def __hash__(self) -> int:
        return hash(self.var)


def split_password(url: str) -> tuple[str, str | None]:
    """(the URL without its password, the password decoded or None): the password of the
    userinfo (`scheme://user:pw@host`) or of a `password=` query argument (redis-py takes it)."""
    parts = urlsplit(url)
    password = unquote(parts.password) if parts.password else None
    netloc = parts.netloc
    if parts.password is not None:
        user = parts.username or ""
        host = netloc.rpartition("@")[2]
        netloc = f"{user}@{host}" if user else host
    query = parts.query
    if "password=" in query:
        pairs = parse_qsl(query, keep_blank_values=True)
        given = [v for k, v in pairs if k == "password"]
        if given and given[0]:
            password = password or given[0]
        query = urlencode([(k, v) for k, v in pairs if k != "password"])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment)), password


def split_host_password(host: str) -> tuple[str, str | None]:
    """split_password for an OpenSearch host, which may lack a scheme (`user:pw@node:9200`)."""
    if "://" in host:
        return split_password(host)
    bare, password = split_password("//" + host)
    return bare.removeprefix("//"), password


def with_password(url: str, password: str) -> str:
    """The URL with `password` put back into its userinfo (percent-encoded)."""
    bare = "://" not in url
    parts = urlsplit("//" + url if bare else url)
    user = quote(unquote(parts.username), safe="") if parts.username else ""
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{user}:{quote(password, safe='')}@{host}"
    joined = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return joined.removeprefix("//") if bare else joined


def sink_secrets(sink: SinkConfig) -> dict[str, str]:
    """Variable -> value: the secrets of one sink its executors need (its kind's settings say which)."""
    return sink.settings.executor_secrets(sink.name)


def executor_secrets(pipeline: Pipeline) -> dict[str, str]:
    """Variable -> value over every sink of the pipeline."""
    found: dict[str, str] = {}
    for sink in pipeline.sinks:
        found |= sink_secrets(sink)
    return found
