"""What runs in Spark executors: one Redis connection per partition, rows sent in pipelined
EVALSHA calls of the compare-and-set script (sinks/cache/scripts.py).

A partition's rows (RDD mapPartitions over the net changes: pyspark's Arrow maps need pandas,
which the project does not install) are tuples k (row key), t (tombstone key), op, lsn, seq,
v (the value JSON, null for deletes), u (unchanged-TOAST member indexes); it answers with one
tuple of counts. Redis failures are raised as a RuntimeError
whose text carries a tagged one-line message, which the driver finds in Spark's wrapped
exception (see `tagged_message`) and turns into a SinkError.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

from cdc.ground.executor_secrets import ExecutorSecretMissing, SecretRef, with_password

ROWS_PER_CALL = 200  # rows per script call
CALLS_PER_TRIP = 10  # script calls per network round trip
_TAG = "cdc-redis-error"
_TAGGED = re.compile(rf"\[{_TAG}\](.*?)\[/{_TAG}\]", re.S)


def tag(message: str) -> str:
    return f"[{_TAG}]{message}[/{_TAG}]"


def tagged_message(text: str) -> str | None:
    """The tagged message an executor raised, out of a Spark exception's text."""
    found = _TAGGED.search(text)
    return found.group(1) if found else None


Counts = tuple[int, int, int, int]  # inserted, updated, deleted, ignored (write_partition's)


def add_counts(a: Counts, b: Counts) -> Counts:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def connect(url: str, password: SecretRef | None = None) -> Any:
    """A client for `url`; `password` (by reference, docs/cluster.md, secrets on the executors) goes back
    into a URL the sink stripped of it."""
    import redis
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        with_password(url, password.get()) if password is not None else url,
        socket_connect_timeout=5,
        socket_timeout=120,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.1), 2),
    )


def describe(exc: BaseException) -> str:
    """One line for a redis-py exception."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


class _Sender:
    """Pipelined EVALSHA calls on one connection, packed here (redis-py's generic packer costs
    more CPU than Redis spends running the script). Every reply of a round trip is read, so the
    connection stays in step; a lost connection is retried twice (the script is idempotent), an
    empty script cache (the server restarted) is refilled once."""

    def __init__(self, client: Any, script: str, sha: str):
        self.client, self.script, self.sha = client, script, sha.encode()

    def call(self, keys: list[bytes], args: list[bytes], nkeys: int) -> bytes:
        """One packed EVALSHA with `nkeys` pre-packed keys and 5-per-row pre-packed args."""
        count = 3 + nkeys + 2 + (len(args) - 1) * 5  # header args + keys + ttl args + row args
        return (
            b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$%d\r\n%d\r\n"
            % (
                count,
                len(self.sha),
                self.sha,
                len(b"%d" % nkeys),
                nkeys,
            )
            + b"".join(keys)
            + b"".join(args)
        )

    def send(self, payloads: list[bytes]) -> list[Any]:
        from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

        pool = self.client.connection_pool
        for attempt in range(3):
            conn = None
            try:
                conn = pool.get_connection()
                conn.send_packed_command(payloads, check_health=False)
                replies, error = [], None
                for _ in payloads:
                    try:
                        replies.append(conn.read_response())
                    except ResponseError as exc:
                        error = error or exc
                if error is None:
                    return replies
                if isinstance(error, NoScriptError) and attempt == 0:
                    self.client.script_load(self.script)
                    continue
                raise error
            except (ConnectionError, TimeoutError):
                if conn is not None:
                    conn.disconnect()
                if attempt == 2:
                    raise
                time.sleep(0.2 * (attempt + 1))
            finally:
                if conn is not None:
                    pool.release(conn)
        raise AssertionError("unreachable")


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def write_partition(
    rows: Iterator[Any],
    *,
    url: str,
    script: str,
    sha: str,
    truncate_key: str,
    ttl: int,
    tomb_ttl: int,
    password: SecretRef | None = None,
) -> Iterator[tuple[int, int, int, int]]:
    """Write one partition's rows (k, t, op, lsn, seq, v, u); yield (inserted, updated, deleted, ignored).
    `url` has no password: it is `password`, read from this executor's environment."""
    from redis.exceptions import RedisError

    totals = [0, 0, 0, 0]
    try:
        client = connect(url, password)
    except ExecutorSecretMissing as exc:
        raise RuntimeError(tag(str(exc))) from None
    sender = _Sender(client, script, sha)
    first_key = _bulk(truncate_key.encode())
    first_args = _bulk(b"%d" % ttl) + _bulk(b"%d" % tomb_ttl)
    trip: list[bytes] = []

    def flush() -> None:
        for counts in sender.send(trip):
            for i in range(4):
                totals[i] += int(counts[i])
        trip.clear()

    try:
        client.script_load(script)
        keys, args = [first_key], [first_args]
        for k, t, op, lsn, seq, v, u in rows:
            kb, tb = k.encode(), t.encode()
            vb, ub = (v or "").encode(), (u or "").encode()
            lb, sb = b"%d" % lsn, b"%d" % seq
            keys.append(b"$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(kb), kb, len(tb), tb))
            args.append(
                b"$1\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
                % (op.encode(), len(lb), lb, len(sb), sb, len(vb), vb, len(ub), ub)
            )
            if len(args) > ROWS_PER_CALL:
                trip.append(sender.call(keys, args, 1 + 2 * (len(keys) - 1)))
                keys, args = [first_key], [first_args]
                if len(trip) >= CALLS_PER_TRIP:
                    flush()
        if len(keys) > 1:
            trip.append(sender.call(keys, args, 1 + 2 * (len(keys) - 1)))
        if trip:
            flush()
    except RedisError as exc:
        raise RuntimeError(tag(describe(exc))) from None
    finally:
        client.close()
    yield (totals[0], totals[1], totals[2], totals[3])
