"""A random workload on two tables, reproducible from its seed, that survives server restarts.

Every kind of change the capture path has special cases for: small inserts, updates that leave a
TOASTed value unchanged, deletes, primary-key changes, big transactions (over the log's batch
size), tiny transactions, truncates, and columns added (with a default) and dropped. What the
source holds at the end is the truth the followers are compared with, so the workload keeps no
model of its own; it only counts what it did.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import psycopg2

from cdc.session import libpq_options

TABLES = ("public.acct", "public.item")
BIG = "repeat(md5(random()::text), 400)"  # ~12.8 kB: stored out of line (TOAST)

SCHEMA = (
    "CREATE TABLE acct (id bigint PRIMARY KEY, v text, n int NOT NULL DEFAULT 0, big text)",
    "ALTER TABLE acct ALTER COLUMN big SET STORAGE EXTERNAL",
    "CREATE TABLE item (id bigint PRIMARY KEY, name text, qty int)",
    f"INSERT INTO acct SELECT g, 'a' || g, 0, CASE WHEN g % 10 = 0 THEN {BIG} END FROM generate_series(1, 2000) g",
    "INSERT INTO item SELECT g, 'i' || g, g % 7 FROM generate_series(1, 2000) g",
)

# (kind, weight): big transactions, truncates and DDL are rare, as in real life.
KINDS = (
    ("insert", 30),
    ("update", 30),
    ("update_toast_unchanged", 12),
    ("delete", 10),
    ("pk_change", 6),
    ("tiny_burst", 8),
    ("big_txn", 0.3),
    ("truncate", 0.4),
    ("add_column", 0.6),
    ("drop_column", 0.6),
)


class RandomWorkload(threading.Thread):
    def __init__(self, dsn: str, seed: int, pause_s: float = 0.05):
        super().__init__(daemon=True, name=f"workload-{seed}")
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.pause_s = pause_s
        self.halt = threading.Event()
        self.done = Counter()  # committed transactions by kind
        self.failed = Counter()  # transactions lost to a fault (rolled back; the source never had them)
        self.next_id = 10_000_000
        self.added: list[str] = []  # columns this workload added to acct and has not dropped
        self.error: BaseException | None = None

    def run(self) -> None:
        conn = None
        try:
            while not self.halt.is_set():
                if conn is None or conn.closed:
                    conn = self._connect()
                    if conn is None:
                        continue
                kind = self.rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
                try:
                    with conn.cursor() as cur:
                        getattr(self, f"op_{kind}")(cur)
                    conn.commit()
                    self.done[kind] += 1
                except psycopg2.Error:  # the server restarted under us, or a deadlock: not committed
                    self.failed[kind] += 1
                    try:
                        conn.rollback()
                    except psycopg2.Error:
                        conn.close()
                time.sleep(self.pause_s)
        except BaseException as exc:
            self.error = exc
        finally:
            if conn is not None and not conn.closed:
                conn.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=120)
        if self.error is not None:
            raise RuntimeError(f"the workload failed: {self.error!r}") from self.error

    def _connect(self):
        try:
            return psycopg2.connect(self.dsn, options=libpq_options(), connect_timeout=5)
        except psycopg2.OperationalError:
            self.halt.wait(0.5)  # the server is down (a fault): try again
            return None

    # -- the changes ---------------------------------------------------------------------------------
    def _ids(self, n: int) -> list[int]:
        """Ids that may exist (most do): the seeded range and recent inserts."""
        return [
            self.rng.choice((self.rng.randint(1, 2000), self.rng.randint(10_000_000, self.next_id)))
            for _ in range(n)
        ]

    def _new_ids(self, n: int) -> list[int]:
        start = self.next_id
        self.next_id += n
        return list(range(start, start + n))

    def _table(self) -> str:
        return self.rng.choice(("acct", "item"))

    def op_insert(self, cur) -> None:
        ids = self._new_ids(self.rng.randint(1, 20))
        if self._table() == "acct":
            big = BIG if self.rng.random() < 0.2 else "NULL"
            cur.execute(
                f"INSERT INTO acct(id, v, big) SELECT g, 'new' || g, {big} FROM unnest(%s::bigint[]) g",
                (ids,),
            )
        else:
            cur.execute("INSERT INTO item SELECT g, 'new' || g, 1 FROM unnest(%s::bigint[]) g", (ids,))

    def op_update(self, cur) -> None:
        table = self._table()
        column = "v" if table == "acct" else "name"
        cur.execute(
            f"UPDATE {table} SET {column} = 'u' || %s WHERE id = ANY(%s)",
            (self.rng.randint(0, 10**6), self._ids(5)),
        )

    def op_update_toast_unchanged(self, cur) -> None:
        # only n changes: pgoutput sends the TOASTed `big` as unchanged, the follower must keep it
        cur.execute("UPDATE acct SET n = n + 1 WHERE id = ANY(%s) AND big IS NOT NULL", (self._ids(8),))

    def op_delete(self, cur) -> None:
        cur.execute(f"DELETE FROM {self._table()} WHERE id = ANY(%s)", (self._ids(3),))

    def op_pk_change(self, cur) -> None:
        table = self._table()
        (old,) = self._ids(1)
        (new,) = self._new_ids(1)
        cur.execute(f"UPDATE {table} SET id = %s WHERE id = %s", (new, old))

    def op_tiny_burst(self, cur) -> None:
        # many one-row transactions in a row (this kind commits them itself)
        for _ in range(self.rng.randint(5, 40)):
            (new,) = self._new_ids(1)
            cur.execute("INSERT INTO item VALUES (%s, 'tiny', 0)", (new,))
            cur.connection.commit()

    def op_big_txn(self, cur) -> None:
        ids = self._new_ids(self.rng.randint(3_000, 12_000))
        cur.execute("INSERT INTO item SELECT g, 'bulk', 2 FROM unnest(%s::bigint[]) g", (ids,))
        cur.execute("UPDATE item SET qty = qty + 1 WHERE id = ANY(%s)", (ids[:500],))

    def op_truncate(self, cur) -> None:
        table = self._table()
        cur.execute(f"TRUNCATE {table}")
        cur.execute(
            f"INSERT INTO {table}(id) SELECT g FROM generate_series(1, 50) g"
        )  # the truncate and new rows in one transaction

    def op_add_column(self, cur) -> None:
        name = f"c{self.rng.randint(0, 10**6)}"
        cur.execute(f"ALTER TABLE acct ADD COLUMN {name} int DEFAULT {self.rng.randint(1, 99)}")
        self.added.append(name)

    def op_drop_column(self, cur) -> None:
        if self.added:
            cur.execute(f"ALTER TABLE acct DROP COLUMN IF EXISTS {self.added.pop(0)}")
