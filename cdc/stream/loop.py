"""The receive loop of `cdc stream`: pgoutput messages from the replication connection into the log.

Per change the loop does only what the log needs: find the table, number the event inside its
transaction, cut out the key and keep the raw tuple bytes (cdc/pgoutput.py splits the message, the
values stay undecoded). Decoding values is left to readers of the log, which keeps this loop as fast
as the walsender. Batches end only at a transaction boundary, with one durable commit of the log and
then the acknowledgement to PostgreSQL (cdc/stream/__init__.py).
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cdc.keys import key_from_values
from cdc.log.base import ChangeRow
from cdc.log.local import LocalLog
from cdc.pgoutput import (
    BEGIN,
    COMMIT,
    DELETE,
    INSERT,
    MESSAGE,
    RELATION,
    TRUNCATE,
    UPDATE,
    Message,
    Relation,
    Truncate,
    begin_fields,
    commit_fields,
    decode,
    raw_delete,
    raw_insert,
    raw_update,
    tuple_prefix,
)

PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in µs since the Unix epoch
_FLUSH_ROWS = 5000  # rows buffered per table before they go to the (still open) log batch
DDL_CHECK_S = 30.0  # how often an idle stream looks whether the DDL trigger is still there
_UPDATE_OR_DELETE = frozenset((UPDATE, DELETE))

if TYPE_CHECKING:
    from cdc.stream.relations import Rel


class ReceiveLoop:
    """The stream reader's hot loop (a part of `StreamReader`)."""

    log: LocalLog
    stats: Any
    cfg: Any
    metrics: Any
    progress_every_s: float
    check_publisher: Callable[[], None] | None
    _rels: dict
    _beat: Any
    _watch: Any
    _rewrites: Any
    _conn: Any
    _stop: bool
    _acked: int
    _durable_counts: tuple[int, int]
    _ddl_prefix: str
    _ddl_checked: float
    _idle_checked: float

    if TYPE_CHECKING:  # given by StreamReader and its other parts (changes.py, relations.py)

        def _ack(self, cur: Any, durable: int) -> None: ...
        def _report(self, final: bool = False) -> None: ...
        def _relation(self, conn: Any, msg: Relation, lsn: int, replay: bool = False) -> None: ...
        def _check_ddl(self, conn: Any, start: bool = False) -> None: ...
        def _ddl_message(
            self, conn: Any, content: bytes, commit_lsn: int, flush: Callable[[], None]
        ) -> None: ...
        def _idle_schema_check(self, conn: Any, flushed: int) -> bool: ...
        def _change_rows(
            self,
            rel: Rel,
            old_kind: str | None,
            old: bytes | None,
            new: bytes | None,
            rows: list[ChangeRow],
            commit_lsn: int,
            seq: int,
            xid: int,
            ts: int,
            elsn: int,
        ) -> int: ...

    def _loop(self, conn, cur, skip_upto: int) -> None:  # one flat loop on purpose: it is the hot path
        stats = self.stats
        log = self.log
        rels = self._rels
        read = cur.read_message
        buffers: dict[int, list[ChangeRow]] = {}
        max_events, max_seconds = self.cfg.batch_max_events, self.cfg.batch_max_seconds
        target = stats.target_lsn
        beat = self._beat.beat
        # bound once, not looked up per message
        insert_parts, update_parts, delete_parts = raw_insert, raw_update, raw_delete
        key_prefix, key_bytes, change_rows = tuple_prefix, key_from_values, self._change_rows

        in_txn = skip = False
        commit_lsn = xid = ts = seq = 0
        batch_events = 0
        batch_started = 0.0
        last_txn: tuple[int, int] | None = None  # (commit_lsn, end_lsn) written but not yet durable
        flushed = 0
        last_cut_time = 0.0
        next_report = time.monotonic() + self.progress_every_s

        def flush_buffers() -> None:
            for table_id, rows in buffers.items():
                if rows:
                    log.append(table_id, rows)
            buffers.clear()

        cut_lsn = 0

        def commit_batch() -> None:
            nonlocal batch_events, last_txn, flushed, cut_lsn
            flush_buffers()
            assert last_txn is not None  # called with a transaction written
            log.commit(last_txn[1], last_txn)
            flushed = cut_lsn = last_txn[1]
            stats.flushed_lsn = flushed
            self._ack(cur, flushed)
            self._watch.poll(self._conn, flushed)  # tables gone from the source: marked once passed
            stats.batches += 1
            events, txns = self._durable_counts
            self.metrics.committed(stats.events - events, stats.transactions - txns, flushed)
            beat()
            self._durable_counts = (stats.events, stats.transactions)  # what a reconnect keeps
            batch_events = 0
            last_txn = None

        while True:
            msg = read()
            if msg is None:
                if not in_txn and last_txn is not None:
                    commit_batch()
                if self._stop and not in_txn:
                    break
                if self._stop and in_txn:
                    break  # abandon the open transaction; it is resent after restart
                if not in_txn and last_txn is None:
                    wal_end = cur.wal_end
                    if wal_end > flushed:
                        # Nothing in flight: everything before the server's position is in the log.
                        flushed = wal_end
                        stats.flushed_lsn = flushed
                    now = time.monotonic()
                    if flushed > cut_lsn and now - last_cut_time >= 1.0:
                        log.commit(
                            flushed, None
                        )  # a cut at the new position (no events): followers see progress
                        cut_lsn, last_cut_time = flushed, now
                    self._ack(cur, flushed)
                    self.metrics.progress(flushed)  # idle but healthy: the position is confirmed
                    beat()
                    self._watch.poll(self._conn, flushed)
                    if time.monotonic() - self._ddl_checked >= DDL_CHECK_S:
                        self._check_ddl(self._conn)
                    reached = target is not None and self._acked >= target
                    due = reached or time.monotonic() - self._idle_checked >= DDL_CHECK_S
                    if due and self._idle_schema_check(self._conn, flushed):
                        log.commit(flushed, None)  # a cut, so followers apply the versions
                        cut_lsn, last_cut_time = flushed, time.monotonic()
                    if self._rewrites.suspects:
                        self._rewrites.due(flushed)
                    if self.check_publisher is not None:
                        self.check_publisher()
                    if target is not None:
                        if self._acked >= target:
                            break
                        cur.send_feedback(reply=True)  # ask for a keepalive carrying the server's position
                now = time.monotonic()
                if now >= next_report:
                    next_report = now + self.progress_every_s
                    self._report()
                select.select([cur], [], [], 0.2 if target is not None else 1.0)
                continue

            p = msg.payload
            kind = p[0]
            if kind == INSERT:
                if skip:
                    continue
                relid, new = insert_parts(p)
                rel = rels.get(relid)
                if rel is None:
                    continue
                seq += 1
                vals = key_prefix(new, 0, rel.key_len)
                rows = buffers.get(rel.table_id)
                if rows is None:
                    rows = buffers[rel.table_id] = []
                rows.append(
                    (
                        commit_lsn,
                        seq,
                        "c",
                        b"%d\t%d" % (commit_lsn, seq) if rel.positional else key_bytes(vals, rel.key_idx),
                        new,
                        None,
                        None,
                        rel.schema_version,
                        xid,
                        ts,
                        msg.data_start,
                    )
                )
                if len(rows) >= _FLUSH_ROWS:
                    log.append(rel.table_id, rows)
                    buffers[rel.table_id] = []
                    beat()  # a huge transaction is progress too
                batch_events += 1
            elif kind in _UPDATE_OR_DELETE:
                if skip:
                    continue
                if kind == UPDATE:
                    relid, old_kind, old, new = update_parts(p)
                else:
                    (relid, old_kind, old), new = delete_parts(p), None
                rel = rels.get(relid)
                if rel is None:
                    continue
                rows = buffers.get(rel.table_id)
                if rows is None:
                    rows = buffers[rel.table_id] = []
                before = seq
                seq = change_rows(rel, old_kind, old, new, rows, commit_lsn, seq, xid, ts, msg.data_start)
                batch_events += seq - before
                if len(rows) >= _FLUSH_ROWS:
                    log.append(rel.table_id, rows)
                    buffers[rel.table_id] = []
                    beat()  # a huge transaction is progress too
            elif kind == BEGIN:
                commit_lsn, ts, xid = begin_fields(p)
                ts += PG_EPOCH_US
                seq = 0
                in_txn = True
                skip = commit_lsn <= skip_upto
                if not skip and last_txn is None and batch_events == 0:
                    batch_started = time.monotonic()
            elif kind == COMMIT:
                _flags, c_lsn, end_lsn, _ts = commit_fields(p)
                in_txn = False
                if skip:
                    stats.skipped_transactions += 1
                    skip = False
                    continue
                if seq:
                    stats.transactions += 1  # transactions without captured changes are not counted
                stats.events += seq
                last_txn = (c_lsn, end_lsn)
                if self._rewrites.suspects:
                    self._rewrites.due(end_lsn)  # storage changes no TRUNCATE explained: rewrites
                reached = target is not None and end_lsn >= target
                if reached or batch_events >= max_events or time.monotonic() - batch_started >= max_seconds:
                    commit_batch()
                    batch_started = time.monotonic()
                if reached and self._acked >= target:
                    if self._idle_schema_check(self._conn, flushed):  # `--until`: idle tables too
                        log.commit(flushed, None)
                    break
                if self._stop:
                    if last_txn is not None:
                        commit_batch()
                    break
            elif kind == RELATION:
                msg_rel = decode(p)
                assert isinstance(msg_rel, Relation)
                flush_buffers()  # rows already buffered keep their old schema version
                self._relation(conn, msg_rel, commit_lsn, skip)  # skip: a transaction the log has already
            elif kind == TRUNCATE:
                if skip:
                    continue
                trunc = decode(p)
                assert isinstance(trunc, Truncate)
                for relid in trunc.relation_ids:
                    rel = rels.get(relid)
                    if rel is None:
                        continue
                    seq += 1
                    self._rewrites.truncate(rel.table_id)  # explains the table's new relfilenode
                    buffers.setdefault(rel.table_id, []).append(
                        (
                            commit_lsn,
                            seq,
                            "t",
                            None,
                            None,
                            None,
                            None,
                            rel.schema_version,
                            xid,
                            ts,
                            msg.data_start,
                        )
                    )
                    batch_events += 1
            elif kind == MESSAGE:
                # a logical message: the DDL trigger's (cdc/ddl.py); watermarks and others pass
                if skip or not in_txn:
                    continue
                message = decode(p)
                assert isinstance(message, Message)
                if message.transactional and message.prefix == self._ddl_prefix:
                    self._ddl_message(conn, message.content, commit_lsn, flush_buffers)
            # 'Y' type, 'O' origin: nothing to log (types are resolved from the catalog).
            # Memory stays flat in huge transactions: per-table buffers go to the open batch every _FLUSH_ROWS.

        if last_txn is not None and not in_txn:
            commit_batch()
        self._report(final=True)
