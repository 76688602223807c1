"""cdc.pgoutput against what a real PostgreSQL 15 pgoutput sends.

The changes are read with pg_logical_slot_get_binary_changes() over a normal connection: the
same bytes a walsender would put into XLogData, without the replication protocol around them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg2
import pytest
from psycopg2.extensions import cursor as Cursor

from cdc.ground.lsn import parse_lsn
from cdc.pgoutput import (
    CHANGE_TUPLE_OFFSET,
    UNCHANGED,
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    decode,
    decode_change_header,
    decode_tuple,
    raw_delete,
    raw_insert,
    raw_update,
    tuple_end,
    tuple_prefix,
)
from cdc.pgoutput_encode import encode

pytestmark = pytest.mark.integration

PG_EPOCH_UNIX = 946_684_800  # 2000-01-01 00:00 UTC in Unix seconds

# 200 chained md5 hex digests: 6400 bytes, well over the ~2 kB TOAST threshold, and pglz finds
# no repeats in them, so the value really is stored out of line (not compressed inline).
BIG_TEXT_SQL = "(SELECT string_agg(md5('seed' || g), '' ORDER BY g) FROM generate_series(1, 200) g)"


def _kinds(msgs: list[PgOutputMessage]) -> list[str]:
    return [type(m).__name__ for m in msgs]


def _create_slot(cur: Cursor) -> None:
    # Its own statement: a multi-statement string runs as one transaction, and a slot cannot be
    # created in a transaction that has written.
    cur.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")


def _read_slot(cur: Cursor, options: dict[str, str]) -> list[tuple[int, bytes]]:
    args = ", ".join(f"'{k}', '{v}'" for k, v in options.items())
    cur.execute(f"SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes('s', NULL, NULL, {args})")
    return [(parse_lsn(lsn), bytes(data)) for lsn, data in cur.fetchall()]


def _decode_all(rows: list[tuple[int, bytes]]) -> list[PgOutputMessage]:
    """Decode rows in order, tracking Stream Start/Stop like the stream reader must."""
    msgs: list[PgOutputMessage] = []
    in_stream = False
    for _lsn, data in rows:
        msg = decode(data, in_stream=in_stream)
        # Exact inverse on real data, not only on the encoder's own output.
        assert encode(msg, in_stream=in_stream) == data
        if isinstance(msg, Insert | Update | Delete):
            off = CHANGE_TUPLE_OFFSET + (4 if in_stream else 0)  # the xid comes first in a stream
            assert decode_change_header(data, in_stream=in_stream) == (data[:1].decode(), msg.relation_id)
            first = msg.new if isinstance(msg, Insert) else (msg.old if msg.old is not None else msg.new)
            assert tuple_prefix(data, off, len(first)) == list(first)
            end = tuple_end(data, off)
            assert end == len(data) or data[end : end + 1] == b"N"
            # the stream reader's split (raw TupleData bytes) holds what decode() gives
            if isinstance(msg, Insert):
                raw = raw_insert(data, in_stream)
                parts = (raw[0], decode_tuple(raw[1], 0)[0])
                assert parts == (msg.relation_id, msg.new)
            elif isinstance(msg, Update):
                relid, kind, old, new = raw_update(data, in_stream)
                parts = (relid, kind, old and decode_tuple(old, 0)[0], decode_tuple(new, 0)[0])
                assert parts == (msg.relation_id, msg.old_kind, msg.old, msg.new)
            else:
                relid, kind, old = raw_delete(data, in_stream)
                assert (relid, kind, decode_tuple(old, 0)[0]) == (msg.relation_id, msg.old_kind, msg.old)
        if isinstance(msg, StreamStart):
            in_stream = True
        elif isinstance(msg, StreamStop):
            in_stream = False
        msgs.append(msg)
    return msgs


@pytest.fixture
def conns(pg_db: str) -> Iterator[tuple[Cursor, Cursor]]:
    """(reader cursor, writer cursor), both autocommit; the writer flushes WAL at every commit.

    The test cluster runs with synchronous_commit=off, and the slot SQL functions only decode up to
    the flushed WAL position, so an unflushed commit would be silently missing from the output.
    """
    reader = psycopg2.connect(pg_db)
    writer = psycopg2.connect(pg_db)
    reader.autocommit = writer.autocommit = True
    try:
        with reader.cursor() as rcur, writer.cursor() as wcur:
            wcur.execute("SET synchronous_commit = on")
            yield rcur, wcur
    finally:
        reader.close()
        writer.close()


def test_pgoutput_v1_against_server(pg_db: str, conns: tuple[Cursor, Cursor]) -> None:
    rcur, wcur = conns
    wcur.execute(
        """
        CREATE TABLE toasty (id int PRIMARY KEY, n int NOT NULL, big text);
        CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
        CREATE TABLE "crème brûlée" ("Id" int PRIMARY KEY, "the mood" mood, price numeric(10, 2));
        CREATE TABLE fulltab (id int, v varchar(20));
        ALTER TABLE fulltab REPLICA IDENTITY FULL;
        CREATE TABLE keyed (id int PRIMARY KEY, v text);
        CREATE TABLE unpublished (id int);
        CREATE PUBLICATION pub FOR TABLE toasty, "crème brûlée", fulltab, keyed;
        """
    )
    _create_slot(wcur)
    wcur.execute(f"SELECT {BIG_TEXT_SQL}")
    (big,) = wcur.fetchone()
    wcur.execute(
        """SELECT c.relname, c.oid FROM pg_class c
           WHERE c.relname IN ('toasty', 'crème brûlée', 'fulltab', 'keyed') AND c.relkind = 'r'"""
    )
    oid = dict(wcur.fetchall())
    wcur.execute("SELECT 'mood'::regtype::oid")
    (mood_oid,) = wcur.fetchone()

    # 1: TOASTed insert. 2: update that leaves the TOASTed column alone -> 'u'.
    wcur.execute(f"INSERT INTO toasty VALUES (1, 0, {BIG_TEXT_SQL})")
    wcur.execute("UPDATE toasty SET n = n + 1 WHERE id = 1")
    # 3: enum column -> Type message before the Relation.
    wcur.execute("""INSERT INTO "crème brûlée" VALUES (1, 'happy', 12.50)""")
    # 4: REPLICA IDENTITY FULL: updates and deletes carry the whole old row ('O').
    wcur.execute(
        "BEGIN; INSERT INTO fulltab VALUES (1, 'a'), (2, NULL);"
        " UPDATE fulltab SET v = 'b' WHERE id = 1; DELETE FROM fulltab WHERE id = 2; COMMIT"
    )
    # 5, 6, 7: primary key changed -> old key ('K'); key unchanged -> no old tuple; delete -> 'K'.
    wcur.execute("INSERT INTO keyed VALUES (1, 'x')")
    wcur.execute("BEGIN; UPDATE keyed SET id = 2 WHERE id = 1; UPDATE keyed SET v = 'y' WHERE id = 2; COMMIT")
    wcur.execute("DELETE FROM keyed WHERE id = 2")
    # 8, 9: truncates, one with several relations, with both option flags.
    wcur.execute("TRUNCATE keyed, fulltab RESTART IDENTITY")
    wcur.execute("TRUNCATE toasty CASCADE")
    # 10: transactional message (its own transaction); 11: non-transactional (no Begin/Commit).
    wcur.execute("SELECT pg_logical_emit_message(true, 'prefix', 'content')::text")
    tx_msg_lsn = parse_lsn(wcur.fetchone()[0])
    wcur.execute(r"SELECT pg_logical_emit_message(false, 'bin', '\x00ff0a'::bytea)::text")
    nt_msg_lsn = parse_lsn(wcur.fetchone()[0])
    # A non-transactional message is not flushed by itself; this commit (of an unpublished table,
    # so PG15 sends nothing for it) flushes the WAL up to here.
    wcur.execute("INSERT INTO unpublished VALUES (1)")

    rows = _read_slot(rcur, {"proto_version": "1", "publication_names": "pub", "messages": "true"})
    msgs = _decode_all(rows)
    assert _kinds(msgs) == [
        *["Begin", "Relation", "Insert", "Commit"],  # 1
        *["Begin", "Update", "Commit"],  # 2
        *["Begin", "Type", "Relation", "Insert", "Commit"],  # 3
        *["Begin", "Relation", "Insert", "Insert", "Update", "Delete", "Commit"],  # 4
        *["Begin", "Relation", "Insert", "Commit"],  # 5
        *["Begin", "Update", "Update", "Commit"],  # 6
        *["Begin", "Delete", "Commit"],  # 7
        # TRUNCATE gives the tables new files; the relcache invalidation that comes with it makes
        # pgoutput send their Relation messages again before the Truncate.
        *["Begin", "Relation", "Relation", "Truncate", "Commit"],  # 8
        *["Begin", "Relation", "Truncate", "Commit"],  # 9
        *["Begin", "Message", "Commit"],  # 10
        "Message",  # 11
    ]

    # Every transaction: Begin.final_lsn == Commit.commit_lsn, same timestamp, plausible clock.
    now_pg_us = (time.time() - PG_EPOCH_UNIX) * 1_000_000
    begins = [m for m in msgs if isinstance(m, Begin)]
    commits = [m for m in msgs if isinstance(m, Commit)]
    assert len(begins) == len(commits) == 10
    for b, c in zip(begins, commits, strict=True):
        assert b.final_lsn == c.commit_lsn < c.end_lsn
        assert b.commit_ts == c.commit_ts
        assert abs(c.commit_ts - now_pg_us) < 3600 * 1_000_000
        assert c.flags == 0
    assert len({b.xid for b in begins}) == 10
    assert [c.commit_lsn for c in commits] == sorted(c.commit_lsn for c in commits)

    rel = {m.name: m for m in msgs if isinstance(m, Relation)}
    assert set(rel) == {"toasty", "crème brûlée", "fulltab", "keyed"}
    toasty = rel["toasty"]
    assert (toasty.relation_id, toasty.namespace, toasty.replica_identity) == (oid["toasty"], "public", "d")
    assert [(c.name, c.type_oid, c.typmod, c.is_key) for c in toasty.columns] == [
        ("id", 23, -1, True),
        ("n", 23, -1, False),
        ("big", 25, -1, False),
    ]
    creme = rel["crème brûlée"]
    assert [(c.name, c.type_oid, c.typmod, c.is_key) for c in creme.columns] == [
        ("Id", 23, -1, True),
        ("the mood", mood_oid, -1, False),
        ("price", 1700, (10 << 16 | 2) + 4, False),
    ]
    full = rel["fulltab"]
    assert full.replica_identity == "f"
    assert [(c.name, c.typmod, c.is_key) for c in full.columns] == [("id", -1, True), ("v", 24, True)]
    assert rel["keyed"].replica_identity == "d"
    (mood_type,) = [m for m in msgs if isinstance(m, Type)]
    assert mood_type == Type(mood_oid, "public", "mood")

    changes = [m for m in msgs if isinstance(m, Insert | Update | Delete | Truncate | Message)]
    assert changes[0] == Insert(oid["toasty"], (b"1", b"0", big.encode()))
    assert len(big) == 6400
    assert changes[1] == Update(oid["toasty"], (b"1", b"1", UNCHANGED), None, None)
    assert changes[2] == Insert(oid["crème brûlée"], (b"1", b"happy", b"12.50"))
    f = oid["fulltab"]
    assert changes[3:7] == [
        Insert(f, (b"1", b"a")),
        Insert(f, (b"2", None)),
        Update(f, (b"1", b"b"), (b"1", b"a"), "O"),
        Delete(f, (b"2", None), "O"),
    ]
    k = oid["keyed"]
    assert changes[7:11] == [
        Insert(k, (b"1", b"x")),
        Update(k, (b"2", b"x"), (b"1", None), "K"),
        Update(k, (b"2", b"y"), None, None),
        Delete(k, (b"2", None), "K"),
    ]
    trunc1, trunc2 = changes[11:13]
    assert isinstance(trunc1, Truncate) and isinstance(trunc2, Truncate)
    assert sorted(trunc1.relation_ids) == sorted([k, f])
    assert (trunc1.cascade, trunc1.restart_identity) == (False, True)
    assert trunc2 == Truncate((oid["toasty"],), True, False)
    tx_msg, nt_msg = changes[13:15]
    assert isinstance(tx_msg, Message) and isinstance(nt_msg, Message)
    assert (tx_msg.transactional, tx_msg.prefix, tx_msg.content) == (True, "prefix", b"content")
    assert (nt_msg.transactional, nt_msg.prefix, nt_msg.content) == (False, "bin", b"\x00\xff\n")
    # Message.lsn is the end of the message's WAL record, which is what pg_logical_emit_message()
    # returns; the transactional one's commit record follows right after it.
    assert (tx_msg.lsn, nt_msg.lsn) == (tx_msg_lsn, nt_msg_lsn)
    assert commits[-2].end_lsn <= tx_msg.lsn <= begins[-1].final_lsn
    assert nt_msg.lsn == rows[-1][0]  # the slot row of a non-transactional message is at its LSN


def test_pgoutput_origin_message(pg_db: str, conns: tuple[Cursor, Cursor]) -> None:
    """A transaction replayed under a replication origin gets an Origin message after Begin."""
    rcur, wcur = conns
    origin = "cdc_test_" + uuid.uuid4().hex[:10]  # origins are cluster-wide, not per database
    wcur.execute(
        """CREATE TABLE t (id int PRIMARY KEY);
           CREATE PUBLICATION pub FOR TABLE t;"""
    )
    _create_slot(wcur)
    wcur.execute("SELECT pg_replication_origin_create(%s)", (origin,))
    try:
        wcur.execute("SELECT pg_replication_origin_session_setup(%s)", (origin,))
        wcur.execute(
            "BEGIN;"
            " SELECT pg_replication_origin_xact_setup('0/ABCDEF', '2001-01-01 00:00:00+00');"
            " INSERT INTO t VALUES (1);"
            " COMMIT"
        )
        wcur.execute("SELECT pg_replication_origin_session_reset()")
        wcur.execute("INSERT INTO t VALUES (2)")  # no origin any more
    finally:
        wcur.execute("ROLLBACK")  # in case the block above failed half-way (only a warning otherwise)
        wcur.execute(
            "SELECT pg_replication_origin_session_reset() WHERE pg_replication_origin_session_is_setup()"
        )
        wcur.execute("SELECT pg_replication_origin_drop(%s)", (origin,))

    msgs = _decode_all(_read_slot(rcur, {"proto_version": "1", "publication_names": "pub"}))
    assert _kinds(msgs) == [
        *["Begin", "Origin", "Relation", "Insert", "Commit"],
        *["Begin", "Insert", "Commit"],
    ]
    begin, origin_msg = msgs[0], msgs[1]
    assert origin_msg == Origin(parse_lsn("0/ABCDEF"), origin)
    # The decoded commit time of an origin transaction is the origin's timestamp (366 days: 2000 was a leap year).
    assert isinstance(begin, Begin) and begin.commit_ts == 366 * 86400 * 1_000_000
    assert msgs[3] == Insert(msgs[2].relation_id, (b"1",))  # type: ignore[union-attr]


def test_pgoutput_v2_streaming(pg_db: str, conns: tuple[Cursor, Cursor]) -> None:
    """Protocol v2 with streaming=on: a transaction bigger than logical_decoding_work_mem is sent in
    Stream Start/Stop blocks before it commits, its changes carrying the xid."""
    rcur, wcur = conns
    # logical_decoding_work_mem has context 'user' (PostgreSQL 13+), and with the SQL functions the
    # decoding runs in the calling backend, so a session SET is enough: no ALTER SYSTEM, nothing to
    # restore on a server other tests share.
    rcur.execute("SELECT context FROM pg_settings WHERE name = 'logical_decoding_work_mem'")
    assert rcur.fetchone() == ("user",)
    rcur.execute("SET logical_decoding_work_mem = '64kB'")
    wcur.execute(
        """CREATE TABLE big (id int PRIMARY KEY, t text);
           CREATE TABLE small (id int PRIMARY KEY);
           CREATE PUBLICATION pub FOR TABLE big, small;"""
    )
    _create_slot(wcur)
    n_rows = 3000
    # A: committed big transaction with a transactional message inside.
    wcur.execute(
        "BEGIN;"
        f" INSERT INTO big SELECT g, repeat('x', 100) FROM generate_series(1, {n_rows}) g;"
        " SELECT pg_logical_emit_message(true, 'in-stream', 'hello');"
        " UPDATE big SET t = 'y' WHERE id = 1;"
        " DELETE FROM big WHERE id = 2;"
        " TRUNCATE small;"
        " COMMIT"
    )
    # B: a big subtransaction rolled back inside a committed big transaction -> Stream Abort(xid, subxid).
    wcur.execute(
        "BEGIN;"
        f" INSERT INTO big SELECT g, 'a' FROM generate_series({n_rows + 1}, {2 * n_rows}) g;"
        " SAVEPOINT sp;"
        f" INSERT INTO big SELECT g, repeat('z', 100) FROM generate_series({2 * n_rows + 1}, {3 * n_rows}) g;"
        " ROLLBACK TO SAVEPOINT sp;"
        " COMMIT"
    )
    # C: a big transaction rolled back entirely -> Stream Abort(xid, xid).
    wcur.execute(
        f"BEGIN; INSERT INTO big SELECT g, repeat('r', 100) FROM generate_series(-{n_rows}, -1) g; ROLLBACK"
    )
    # D: a small transaction is not streamed: plain Begin/Commit (also flushes C's abort record).
    wcur.execute("INSERT INTO small VALUES (1)")

    rows = _read_slot(
        rcur,
        {"proto_version": "2", "publication_names": "pub", "messages": "true", "streaming": "on"},
    )
    msgs = _decode_all(rows)
    kinds = _kinds(msgs)
    assert "StreamStart" in kinds, "the big transaction was not streamed"

    # Group into the streamed transactions by xid, in order of first appearance.
    starts = [m for m in msgs if isinstance(m, StreamStart)]
    xids = list(dict.fromkeys(m.xid for m in starts))
    assert len(xids) == 3
    xa, xb, xc = xids
    for xid in xids:
        segments = [m for m in starts if m.xid == xid]
        assert segments[0].first_segment and not any(m.first_segment for m in segments[1:])
        assert len(segments) >= 2  # 300+ kB of changes with a 64 kB budget
    # Inside stream blocks every change carries the xid of the enclosing block; outside none does.
    current: int | None = None
    for m in msgs:
        if isinstance(m, StreamStart):
            assert current is None
            current = m.xid
        elif isinstance(m, StreamStop):
            assert current is not None
            current = None
        elif isinstance(m, Relation | Type | Insert | Update | Delete | Truncate) or (
            isinstance(m, Message) and m.transactional
        ):
            # Changes of a subtransaction carry the top-level xid in the block header but their
            # own (sub)xid in the message, so only check presence for B.
            assert (m.xid is not None) == (current is not None)
            if current in (xa, xc):
                assert m.xid == current

    in_a = [m for m in msgs if getattr(m, "xid", None) == xa and isinstance(m, Insert | Update | Delete)]
    assert sum(isinstance(m, Insert) for m in in_a) == n_rows
    assert Update(in_a[-2].relation_id, (b"1", b"y"), None, None, xid=xa) == in_a[-2]
    assert Delete(in_a[-1].relation_id, (b"2", None), "K", xid=xa) == in_a[-1]
    (msg_a,) = [m for m in msgs if isinstance(m, Message)]
    assert (msg_a.prefix, msg_a.content, msg_a.xid, msg_a.transactional) == ("in-stream", b"hello", xa, True)
    (trunc_a,) = [m for m in msgs if isinstance(m, Truncate)]
    assert trunc_a.xid == xa and len(trunc_a.relation_ids) == 1

    commits = [m for m in msgs if isinstance(m, StreamCommit)]
    assert [c.xid for c in commits] == [xa, xb]
    aborts = [m for m in msgs if isinstance(m, StreamAbort)]
    assert len(aborts) == 2
    sub_abort, top_abort = aborts
    assert sub_abort.xid == xb and sub_abort.subxid != xb
    assert top_abort == StreamAbort(xc, xc)
    # Streamed changes carry the xid of the (sub)transaction that made them.
    inserts_b = [m for m in msgs if isinstance(m, Insert) and m.xid in (xb, sub_abort.subxid)]
    assert sum(m.xid == xb for m in inserts_b) == n_rows
    # Of a rolled-back (sub)transaction only the part streamed before its abort was sent.
    assert 0 < sum(m.xid == sub_abort.subxid for m in inserts_b) <= n_rows
    assert 0 < sum(isinstance(m, Insert) and m.xid == xc for m in msgs) <= n_rows
    # The Stream Commit/Abort come outside any stream block, after the last block of their xid.
    for end_msg in [*commits, *aborts]:
        i = msgs.index(end_msg)
        last_start = max(j for j, m in enumerate(msgs) if isinstance(m, StreamStart) and m.xid == end_msg.xid)
        assert i > last_start and isinstance(msgs[i - 1], StreamStop | StreamCommit | StreamAbort)
    for c in commits:
        assert c.commit_lsn < c.end_lsn and c.flags == 0

    # D: not streamed (Relation again: TRUNCATE small in A invalidated it).
    assert kinds[-4:] == ["Begin", "Relation", "Insert", "Commit"]
    assert "StreamStart" not in kinds[kinds.index("Begin") :]
    assert msgs[-2] == Insert(msgs[-2].relation_id, (b"1",))  # type: ignore[union-attr]
