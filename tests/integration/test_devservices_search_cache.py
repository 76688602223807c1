"""The local Redis and OpenSearch dev services are real servers that behave as the followers need.

* Redis: answers, keeps AOF data across a SIGKILL and restart on the same port.
* OpenSearch: a genuine node; external versioning rejects stale writes (the search follower's
  guard), bulk requests work, documents are searchable.
* `cdc dev up|status|down` drives them from the command line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from opensearchpy import OpenSearch, helpers
from opensearchpy.exceptions import ConflictError

from pipelines.devservices.opensearch import LocalOpenSearch
from pipelines.devservices.redis import LocalRedis
from tests.harness import CdcRun, cdc

pytestmark = pytest.mark.integration


def dev(verb: str, service: str, base: Path) -> CdcRun:
    """`cdc dev VERB SERVICE --dir BASE` in a process of its own (as from a terminal)."""
    return cdc("dev", verb, service, "--dir", str(base), timeout=180)


def env_lines(stdout: str) -> dict[str, str]:
    """`export NAME=VALUE` lines of `cdc dev up` as {NAME: VALUE} (the values need no shell quoting here)."""
    return dict(line.removeprefix("export ").split("=", 1) for line in stdout.splitlines() if "=" in line)


# -- Redis ----------------------------------------------------------------------------------------
def test_redis_set_get(redis_server: LocalRedis) -> None:
    assert redis_server.running()
    assert redis_server.env() == {"REDIS_URL": redis_server.url}
    assert redis_server.url.startswith("redis://127.0.0.1:")
    client = redis.Redis.from_url(redis_server.url)
    client.set("devservices:k", "v1")
    assert client.get("devservices:k") == b"v1"
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    client.delete("devservices:k")
    client.close()


def test_redis_kill_and_restart_keeps_aof_data(tmp_path: Path) -> None:
    # appendfsync always: with everysec a SIGKILL may lose the last second (a slow disk in CI did)
    server = LocalRedis(tmp_path / "redis", appendfsync="always")
    try:
        server.start()
        # start() returns once the server answers (no duration asserted; it records how long it took)
        assert server.start_seconds is not None
        port, first_pid = server.port, server.pid()
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        client.set("k", "kept")
        client.hset("h", mapping={"a": "1", "b": "2"})
        client.close()

        server.kill()
        assert not server.running()
        assert server.pid() is None

        server.restart()
        assert server.running()
        assert server.port == port
        assert server.pid() != first_pid
        client = redis.Redis.from_url(server.url)
        assert client.get("k") == b"kept"
        assert client.hgetall("h") == {b"a": b"1", b"b": b"2"}
        client.close()

        # A second handle on the same dir (what `cdc dev down` does) sees and stops it.
        other = LocalRedis(tmp_path / "redis")
        assert other.running() and other.port == port
        other.stop()
        assert not other.running()
        assert not server.running()
    finally:
        server.stop()


def test_redis_without_appendonly_starts_empty_after_kill(tmp_path: Path) -> None:
    server = LocalRedis(tmp_path / "redis", appendonly=False)
    try:
        server.start()
        client = redis.Redis.from_url(server.url)
        client.set("k", "lost")
        client.close()
        server.kill()
        server.restart()
        client = redis.Redis.from_url(server.url)
        assert client.get("k") is None
        client.close()
    finally:
        server.stop()


# -- OpenSearch -----------------------------------------------------------------------------------
@pytest.fixture
def os_client(opensearch: LocalOpenSearch):
    client = OpenSearch(opensearch.url, timeout=30)
    yield client
    client.close()


def test_opensearch_is_a_real_node(opensearch: LocalOpenSearch, os_client: OpenSearch) -> None:
    assert opensearch.running()
    assert opensearch.env() == {"OPENSEARCH_URL": opensearch.url}
    info = os_client.info()
    assert info["version"]["distribution"] == "opensearch"
    assert info["version"]["number"].startswith("2.")
    assert os_client.cluster.health()["status"] in ("green", "yellow")
    plugins = os_client.cat.plugins(format="json")
    assert not any("security" in p["component"].lower() for p in plugins)


def test_opensearch_external_versioning_rejects_stale_writes(os_client: OpenSearch) -> None:
    index = "devservices_versions"
    os_client.indices.create(index=index, body={"settings": {"number_of_shards": 1, "number_of_replicas": 0}})
    try:
        done = os_client.index(
            index=index, id="1", body={"name": "new"}, params={"version": 5, "version_type": "external"}
        )
        assert done["_version"] == 5

        with pytest.raises(ConflictError) as stale:
            os_client.index(
                index=index, id="1", body={"name": "stale"}, params={"version": 4, "version_type": "external"}
            )
        assert stale.value.status_code == 409
        with pytest.raises(ConflictError):  # a replay of the same position is ignored too
            os_client.index(
                index=index,
                id="1",
                body={"name": "replay"},
                params={"version": 5, "version_type": "external"},
            )
        with pytest.raises(ConflictError):  # a delete from an older position as well
            os_client.delete(index=index, id="1", params={"version": 3, "version_type": "external"})

        os_client.indices.refresh(index=index)
        hits = os_client.search(index=index, body={"query": {"match": {"name": "new"}}})["hits"]["hits"]
        assert [(h["_id"], h["_source"]["name"]) for h in hits] == [("1", "new")]
        assert os_client.get(index=index, id="1")["_version"] == 5
    finally:
        os_client.indices.delete(index=index)


def test_opensearch_bulk_with_external_versions(os_client: OpenSearch) -> None:
    index = "devservices_bulk"
    os_client.indices.create(index=index, body={"settings": {"number_of_shards": 1, "number_of_replicas": 0}})
    try:
        first = [
            {
                "_op_type": "index",
                "_index": index,
                "_id": str(i),
                "_source": {"n": i, "text": f"row {i}"},
                "version": 10,
                "version_type": "external",
            }
            for i in range(500)
        ]
        ok, errors = helpers.bulk(os_client, first, raise_on_error=False, refresh=True)
        assert (ok, errors) == (500, [])

        # A mixed batch: newer writes apply, stale ones come back as per-item 409s, deletes apply.
        mixed = [
            {
                "_op_type": "index",
                "_index": index,
                "_id": "1",
                "_source": {"n": 1, "text": "newer"},
                "version": 11,
                "version_type": "external",
            },
            {
                "_op_type": "index",
                "_index": index,
                "_id": "2",
                "_source": {"n": 2, "text": "older"},
                "version": 9,
                "version_type": "external",
            },
            {"_op_type": "delete", "_index": index, "_id": "3", "version": 12, "version_type": "external"},
        ]
        ok, errors = helpers.bulk(os_client, mixed, raise_on_error=False, refresh=True)
        assert ok == 2
        assert [(e["index"]["_id"], e["index"]["status"]) for e in errors] == [("2", 409)]

        assert os_client.count(index=index)["count"] == 499
        assert os_client.get(index=index, id="1")["_source"]["text"] == "newer"
        assert os_client.get(index=index, id="2")["_source"]["text"] == "row 2"
        hits = os_client.search(index=index, body={"query": {"match": {"text": "newer"}}})["hits"]
        assert hits["total"]["value"] == 1 and hits["hits"][0]["_id"] == "1"
    finally:
        os_client.indices.delete(index=index)


# -- CLI ------------------------------------------------------------------------------------------
def test_cli_dev_up_status_down_redis(tmp_path: Path) -> None:
    base = tmp_path / "dev"
    try:
        up = dev("up", "redis", base)
        assert up.code == 0, up.err
        url = env_lines(up.out)["REDIS_URL"]
        assert url.startswith("redis://127.0.0.1:")
        client = redis.Redis.from_url(url)
        assert client.ping()
        client.close()

        again = dev("up", "redis", base)  # idempotent: same server, same address
        assert again.code == 0, again.err
        assert env_lines(again.out)["REDIS_URL"] == url

        status = dev("status", "redis", base)
        assert status.code == 0, status.err
        assert f"redis: running REDIS_URL={url}" in status.out

        down = dev("down", "redis", base)
        assert down.code == 0, down.err
        assert "redis: stopped" in down.out
        assert not LocalRedis(base / "redis").running()

        status = dev("status", "redis", base)
        assert "redis: stopped" in status.out
    finally:
        LocalRedis(base / "redis").stop()


def test_cli_dev_up_status_down_opensearch(tmp_path: Path) -> None:
    base = tmp_path / "dev"
    try:
        up = dev("up", "opensearch", base)
        assert up.code == 0, up.err
        url = env_lines(up.out)["OPENSEARCH_URL"]
        assert url.startswith("http://127.0.0.1:")
        client = OpenSearch(url)
        assert client.cluster.health()["status"] in ("green", "yellow")
        client.close()

        status = dev("status", "opensearch", base)
        assert f"opensearch: running OPENSEARCH_URL={url}" in status.out

        down = dev("down", "opensearch", base)
        assert down.code == 0, down.err
        assert "opensearch: stopped" in down.out
        assert not LocalOpenSearch(base / "opensearch").running()
    finally:
        LocalOpenSearch(base / "opensearch").stop()
