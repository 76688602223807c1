"""The cache follower's row-rewriting Lua scripts (sinks/cache/scripts.py) run by a real Redis:
BACKFILL adds a new column's member to cached rows that lack it, RENAME renames a member in
place; both keep the value, the member order and the TTL, and leave values that are not our
rows alone. The apply paths that use them are covered end to end by test_cache.py and
test_schema_changes.py; this pins the scripts' own semantics in a second."""

from __future__ import annotations

import pytest
import redis

from sinks.cache import scripts

pytestmark = pytest.mark.integration

HEAD = '{"_cdc_lsn":5,"_cdc_seq":0,'


def test_backfill_and_rename_rewrite_only_cached_rows(redis_db: str) -> None:
    client = redis.Redis.from_url(redis_db)
    client.set("t:1", HEAD + '"id":1,"a":2}', ex=1000)
    client.set("t:2", HEAD + '"id":2,"b":"x,}"}')
    client.set("t:3", HEAD + '"id":3,"x":0}')  # already has the member
    client.set("t:4", "not a row of ours")
    keys = ["t:1", "t:2", "t:3", "t:4", "t:missing"]

    backfill = client.register_script(scripts.BACKFILL)
    assert backfill(keys=keys, args=['"x":7', '"x"']) == 2
    assert backfill(keys=keys, args=['"x":7', '"x"']) == 0  # idempotent
    assert client.get("t:1") == (HEAD + '"id":1,"a":2,"x":7}').encode()
    assert client.get("t:2") == (HEAD + '"id":2,"b":"x,}","x":7}').encode()
    assert client.get("t:3") == (HEAD + '"id":3,"x":0}').encode()
    assert 0 < client.ttl("t:1") <= 1000 and client.ttl("t:2") == -1

    client.set("t:5", HEAD + '"id":5,"bb":1,"b":2}')  # holds the new name already: left alone
    rename = client.register_script(scripts.RENAME)
    # new name "bb", older names newest first: "b", then "a"
    assert rename(keys=[*keys, "t:5"], args=['"bb"', '"b"', '"a"']) == 2
    assert rename(keys=[*keys, "t:5"], args=['"bb"', '"b"', '"a"']) == 0
    assert client.get("t:1") == (HEAD + '"id":1,"bb":2,"x":7}').encode()
    assert client.get("t:2") == (HEAD + '"id":2,"bb":"x,}","x":7}').encode()
    assert client.get("t:5") == (HEAD + '"id":5,"bb":1,"b":2}').encode()
    assert client.get("t:4") == b"not a row of ours"
    assert 0 < client.ttl("t:1") <= 1000
    client.close()
