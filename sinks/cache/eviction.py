"""Redis eviction and the cache follower: a Redis whose `maxmemory-policy` may evict keys drops
follower rows, tombstones and markers without a word (the follower is then silently incomplete).
`cdc validate` and every `cdc apply` check the policy: refused (exit 3) unless the sink says
`allow_eviction: true` (a cache whose rows may go missing, accepted as such)."""

from __future__ import annotations

from typing import Any

NO_EVICTION = "noeviction"


def eviction_problem(client: Any, ttl: int | None) -> str | None:
    """Why Redis may evict this follower's keys (None: it cannot). `volatile-*` policies only evict
    keys with a TTL, which the follower's keys have only with the sink's `ttl`; without a
    `maxmemory` limit nothing is evicted whatever the policy."""
    info = client.info("memory")
    policy = str(info.get("maxmemory_policy", NO_EVICTION))
    maxmemory = int(info.get("maxmemory", 0) or 0)
    if policy == NO_EVICTION or maxmemory == 0:
        return None
    if policy.startswith("volatile") and not ttl:
        return None
    which = "any key" if policy.startswith("allkeys") else "keys with a TTL (this sink's rows, `ttl`)"
    return f"maxmemory-policy is {policy} with maxmemory {maxmemory:,} bytes: Redis may evict {which}, so rows go missing from the follower without a word"


EVICTION_FIX = (
    "run `CONFIG SET maxmemory-policy noeviction` on that Redis (and set it in redis.conf so a restart keeps it), "
    "or set `allow_eviction: true` on the sink if it is a cache whose rows may go missing"
)
