"""Executor-side secrets (issue 24 item 4; README "Secrets on the executors"): the Redis and
OpenSearch sinks' passwords travel to executors as the name of an environment variable,
CDC_SECRET_<SINK>_<FIELD>, never as the value; the driver sets spark.executorEnv.<VAR> for a
cluster (kept off the JVM's command line), nothing for `executor_secrets: workers`; an executor
without the variable fails with exit 3 naming it, no secret printed. The real applies are in
tests/integration/test_cache.py and test_search_secure.py."""

from __future__ import annotations

import functools
import pickle
from pathlib import Path

import pytest
from pyspark.serializers import CloudPickleSerializer

from cdc.ground.errors import EngineSettingError
from cdc.ground.executor_secrets import (
    SecretRef,
    executor_secrets,
    split_host_password,
    split_password,
    with_password,
)
from pipelines.spark import SECRET_CONF, executor_env_conf
from sinks.cache.writer import tagged_message, write_partition
from sinks.executor_env import missing_error
from sinks.registry import load_pipeline
from sinks.search.opensearch_client import ClientSettings, make_client

pytestmark = pytest.mark.unit

PW, OS_PW, HOST_PW = "red1s/pw@x", "open-search-pw", "in-the-host-pw"


def pipeline_file(tmp_path: Path, spark: str = "") -> Path:
    path = tmp_path / "p.yml"
    path.write_text(
        "name: p\nsource: {postgres: {dsn: 'postgresql://u@127.0.0.1/d', tables: [public.t]}}\n"
        "sinks:\n"
        "  - {name: cache, redis: {url: 'redis://:${T_REDIS_PW}@127.0.0.1:6379/0', tables: [public.t]}}\n"
        "  - name: search\n"
        "    search: {engine: opensearch, tables: [public.t], username: cdc, password: '${T_OS_PW}',\n"
        f"             hosts: ['https://a:{HOST_PW}@n1:9200', 'n2:9200']}}\n" + spark
    )
    return path


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T_REDIS_PW", PW.replace("/", "%2F").replace("@", "%40"))
    monkeypatch.setenv("T_OS_PW", OS_PW)


def test_urls_lose_their_password_and_get_it_back() -> None:
    assert split_password("redis://:p%40w@h:1/0") == ("redis://h:1/0", "p@w")
    assert split_password("rediss://u:pw@h/2?password=q&ssl_cert_reqs=none") == (
        "rediss://u@h/2?ssl_cert_reqs=none",
        "pw",
    )
    assert split_password("redis://h/0?password=q") == ("redis://h/0", "q")
    assert split_password("redis://h/0") == ("redis://h/0", None)
    assert split_host_password("u:pw@node:9200") == ("u@node:9200", "pw")
    assert with_password("redis://h:1/0", "p@w") == "redis://:p%40w@h:1/0"
    assert with_password("u@node:9200", "pw") == "u:pw@node:9200"


def test_a_pickled_ref_carries_the_name_only(monkeypatch: pytest.MonkeyPatch) -> None:
    ref = SecretRef("CDC_SECRET_X_PASSWORD", "the-value")
    shipped = CloudPickleSerializer().dumps(ref)
    assert b"the-value" not in shipped and b"CDC_SECRET_X_PASSWORD" in shipped
    there = pickle.loads(shipped)  # as an executor unpickles it
    monkeypatch.setenv("CDC_SECRET_X_PASSWORD", "from-the-executor-env")
    assert there.get() == "from-the-executor-env" and ref.get() == "the-value"


def test_task_functions_carry_no_secret(tmp_path: Path, env: None) -> None:
    """What the sinks hand to mapPartitions, pickled as pyspark ships it."""
    pipeline = load_pipeline(pipeline_file(tmp_path))
    from sinks.cache.sink import RedisSink

    cache = RedisSink(pipeline.sink("cache"), pipeline, None)
    assert cache.task_url == "redis://127.0.0.1:6379/0"
    writer = functools.partial(
        write_partition, url=cache.task_url, password=cache.password, script="", sha="", truncate_key="",
        ttl=0, tomb_ttl=0,
    )  # fmt: skip
    cs = ClientSettings.of(pipeline.sink("search").search, "search")
    for task in (writer, cs):
        shipped = CloudPickleSerializer().dumps(task)
        for secret in (PW, OS_PW, HOST_PW, "red1s%2Fpw%40x"):
            assert secret.encode() not in shipped, (task, secret)
    assert cs.hosts == ("https://a@n1:9200", "n2:9200")
    assert cs.host_urls() == [f"https://a:{HOST_PW}@n1:9200", "n2:9200"]  # on the driver: the values
    assert executor_secrets(pipeline) == {
        "CDC_SECRET_CACHE_PASSWORD": PW,
        "CDC_SECRET_SEARCH_PASSWORD": OS_PW,
        "CDC_SECRET_SEARCH_HOST0_PASSWORD": HOST_PW,
    }


def test_the_driver_sets_executor_env_on_a_cluster_only(tmp_path: Path, env: None) -> None:
    local = load_pipeline(pipeline_file(tmp_path))
    assert executor_env_conf(local, "local[2]") == {}
    conf = executor_env_conf(local, "spark://h:7077")
    assert conf == {
        "spark.executorEnv.CDC_SECRET_CACHE_PASSWORD": PW,
        "spark.executorEnv.CDC_SECRET_SEARCH_PASSWORD": OS_PW,
        "spark.executorEnv.CDC_SECRET_SEARCH_HOST0_PASSWORD": HOST_PW,
    }
    assert all(SECRET_CONF.search(k) for k in conf)  # over py4j, never on the JVM's command line
    workers = load_pipeline(pipeline_file(tmp_path, "spark: {executor_secrets: workers}\n"))
    assert executor_env_conf(workers, "spark://h:7077") == {}


def test_an_executor_without_the_variable_is_exit_3_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    var = "CDC_SECRET_CACHE_PASSWORD"
    monkeypatch.delenv(var, raising=False)
    unpickled = pickle.loads(pickle.dumps(SecretRef(var, PW)))
    with pytest.raises(RuntimeError) as failed:  # the Redis writer, run as an executor runs it
        list(write_partition(iter([]), url="redis://127.0.0.1:1/0", password=unpickled, script="",
                             sha="", truncate_key="", ttl=0, tomb_ttl=0))  # fmt: skip
    error = missing_error(tagged_message(str(failed.value)) or "", "cache")
    assert isinstance(error, EngineSettingError) and error.exit_code == 3
    assert f"sink cache: the Spark executors' environment has no {var}" in error.problem
    assert f"export {var}" in (error.fix or "") and f"spark.executorEnv.{var}" in (error.fix or "")
    assert PW not in str(error)
    cs = pickle.loads(
        pickle.dumps(ClientSettings(("https://n:9200",), 1.0, "u", SecretRef("CDC_SECRET_S_PASSWORD", OS_PW)))
    )
    assert cs.secrets == []  # masking on an executor without it does not raise
    with pytest.raises(RuntimeError, match="environment has no CDC_SECRET_S_PASSWORD"):
        make_client(cs)
