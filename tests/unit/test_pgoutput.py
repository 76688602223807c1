"""cdc.pgoutput against byte strings built by hand from the documented wire format.

The expected bytes are written out with struct.pack here (not produced by the encoder) so the
decoder and the encoder are both checked against the protocol documentation, not each other.
"""

from __future__ import annotations

import contextlib
import copy
import pickle
import random
import struct

import pytest

from cdc import pgoutput
from cdc.pgoutput import (
    CHANGE_TUPLE_OFFSET,
    UNCHANGED,
    Begin,
    BinaryValue,
    ColumnValue,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputError,
    PgOutputMessage,
    Relation,
    RelationColumn,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Unchanged,
    Update,
    begin_fields,
    commit_fields,
    decode,
    decode_change_header,
    decode_tuple,
    raw_delete,
    raw_insert,
    raw_update,
    tuple_end,
    tuple_prefix,
)
from cdc.pgoutput_encode import encode, encode_tuple

pytestmark = pytest.mark.unit

LSN = 0x16_B374D848  # 16/B374D848
TS = 785_000_000_123_456  # µs since 2000-01-01 (a day in 2024)
XID = 0xFFFF_FFF0  # high bit set: xids are unsigned


# -- hand-built wire pieces -----------------------------------------------------------------------
def s(text: str) -> bytes:
    """A wire String: UTF-8 bytes plus the NUL terminator."""
    return text.encode() + b"\x00"


def t(value: bytes) -> bytes:
    return b"t" + struct.pack("!i", len(value)) + value


def b(value: bytes) -> bytes:
    return b"b" + struct.pack("!i", len(value)) + value


def tup(*cols: bytes) -> bytes:
    """TupleData from already-encoded columns (b'n', b'u', t(...), b(...))."""
    return struct.pack("!H", len(cols)) + b"".join(cols)


# (wire bytes, in_stream, expected message): the table every generic test below walks through.
RELATION_BYTES = (
    b"R"
    + struct.pack("!I", 16384)
    + s("Schéma ünï")
    + s('My "Quoted" Table')
    + b"f"
    + struct.pack("!H", 4)
    + b"\x01"
    + s("id")
    + struct.pack("!Ii", 23, -1)
    + b"\x01"
    + s("second key")
    + struct.pack("!Ii", 1043, 24)
    + b"\x00"
    + s("prix €")
    + struct.pack("!Ii", 1700, (10 << 16 | 2) + 4)
    + b"\x00"
    + s("")
    + struct.pack("!Ii", 0xFFFF_FFFE, -1)
)
RELATION = Relation(
    16384,
    "Schéma ünï",
    'My "Quoted" Table',
    "f",
    (
        RelationColumn(1, "id", 23, -1),
        RelationColumn(1, "second key", 1043, 24),
        RelationColumn(0, "prix €", 1700, 655366),
        RelationColumn(0, "", 0xFFFF_FFFE, -1),
    ),
)

CASES: list[tuple[str, bytes, bool, PgOutputMessage]] = [
    ("begin", b"B" + struct.pack("!QqI", LSN, TS, XID), False, Begin(LSN, TS, XID)),
    ("begin-negative-ts", b"B" + struct.pack("!QqI", 0, -1, 0), False, Begin(0, -1, 0)),
    (
        "commit",
        b"C" + struct.pack("!BQQq", 0, LSN, LSN + 0x48, TS),
        False,
        Commit(0, LSN, LSN + 0x48, TS),
    ),
    ("origin", b"O" + struct.pack("!Q", LSN) + s("node ☃ 1"), False, Origin(LSN, "node ☃ 1")),
    ("origin-empty-name", b"O" + struct.pack("!Q", 0) + s(""), False, Origin(0, "")),
    ("relation", RELATION_BYTES, False, RELATION),
    (
        "relation-no-columns-pg-catalog",
        b"R" + struct.pack("!I", 1) + s("") + s("t") + b"n" + struct.pack("!H", 0),
        False,
        Relation(1, "", "t", "n", ()),
    ),
    (
        "relation-index-identity",
        b"R"
        + struct.pack("!I", 7)
        + s("public")
        + s("x y")
        + b"i"
        + struct.pack("!H", 1)
        + b"\x01"
        + s("k")
        + struct.pack("!Ii", 25, -1),
        False,
        Relation(7, "public", "x y", "i", (RelationColumn(1, "k", 25, -1),)),
    ),
    (
        "relation-default-identity",
        b"R" + struct.pack("!I", 8) + s("public") + s("d") + b"d" + struct.pack("!H", 0),
        False,
        Relation(8, "public", "d", "d", ()),
    ),
    ("type", b"Y" + struct.pack("!I", 16390) + s("public") + s("mood"), False, Type(16390, "public", "mood")),
    ("type-pg-catalog", b"Y" + struct.pack("!I", 16) + s("") + s("bool"), False, Type(16, "", "bool")),
    (
        "insert-all-column-kinds",
        b"I"
        + struct.pack("!I", 16384)
        + b"N"
        + tup(t(b"42"), b"n", b"u", t(b""), b(b"\x00\x01\xff"), t("ünï\tcode".encode())),
        False,
        Insert(16384, (b"42", None, UNCHANGED, b"", BinaryValue(b"\x00\x01\xff"), "ünï\tcode".encode())),
    ),
    ("insert-zero-columns", b"I" + struct.pack("!I", 5) + b"N" + tup(), False, Insert(5, ())),
    (
        "insert-embedded-nul-in-value",
        b"I" + struct.pack("!I", 5) + b"N" + tup(t(b"a\x00b")),
        False,
        Insert(5, (b"a\x00b",)),
    ),
    (
        "update-no-old",
        b"U" + struct.pack("!I", 16384) + b"N" + tup(t(b"1"), t(b"new"), b"u"),
        False,
        Update(16384, (b"1", b"new", UNCHANGED), None, None),
    ),
    (
        "update-old-key",
        b"U"
        + struct.pack("!I", 16384)
        + b"K"
        + tup(t(b"1"), b"n", b"n")
        + b"N"
        + tup(t(b"2"), t(b"v"), b"n"),
        False,
        Update(16384, (b"2", b"v", None), (b"1", None, None), "K"),
    ),
    (
        "update-old-full-row",
        b"U" + struct.pack("!I", 16384) + b"O" + tup(t(b"1"), t(b"old")) + b"N" + tup(t(b"1"), t(b"new")),
        False,
        Update(16384, (b"1", b"new"), (b"1", b"old"), "O"),
    ),
    (
        "delete-key",
        b"D" + struct.pack("!I", 16384) + b"K" + tup(t(b"7"), b"n"),
        False,
        Delete(16384, (b"7", None), "K"),
    ),
    (
        "delete-full-row",
        b"D" + struct.pack("!I", 16384) + b"O" + tup(t(b"7"), t(b"x"), b(b"\x01")),
        False,
        Delete(16384, (b"7", b"x", BinaryValue(b"\x01")), "O"),
    ),
    (
        "truncate-plain",
        b"T" + struct.pack("!IB", 1, 0) + struct.pack("!I", 16384),
        False,
        Truncate((16384,), False, False),
    ),
    (
        "truncate-cascade",
        b"T" + struct.pack("!IB", 2, 1) + struct.pack("!II", 16384, 16390),
        False,
        Truncate((16384, 16390), True, False),
    ),
    (
        "truncate-restart-identity",
        b"T" + struct.pack("!IB", 3, 2) + struct.pack("!III", 3, 1, 2),
        False,
        Truncate((3, 1, 2), False, True),
    ),
    (
        "truncate-both",
        b"T" + struct.pack("!IB", 2, 3) + struct.pack("!II", 0xFFFF_FFFF, 1),
        False,
        Truncate((0xFFFF_FFFF, 1), True, True),
    ),
    ("truncate-no-relations", b"T" + struct.pack("!IB", 0, 0), False, Truncate((), False, False)),
    (
        "message-transactional",
        b"M" + struct.pack("!BQ", 1, LSN) + s("prefix") + struct.pack("!i", 7) + b"content",
        False,
        Message(True, LSN, "prefix", b"content"),
    ),
    (
        "message-not-transactional-binary",
        b"M" + struct.pack("!BQ", 0, LSN) + s("bin ✓") + struct.pack("!i", 4) + b"\x00\xff\x00\n",
        False,
        Message(False, LSN, "bin ✓", b"\x00\xff\x00\n"),
    ),
    (
        "message-empty",
        b"M" + struct.pack("!BQ", 0, 0) + s("") + struct.pack("!i", 0),
        False,
        Message(False, 0, "", b""),
    ),
    ("stream-start-first", b"S" + struct.pack("!IB", XID, 1), False, StreamStart(XID, True)),
    ("stream-start-next", b"S" + struct.pack("!IB", 731, 0), False, StreamStart(731, False)),
    ("stream-stop", b"E", False, StreamStop()),
    (
        "stream-commit",
        b"c" + struct.pack("!IBQQq", 731, 0, LSN, LSN + 0x30, TS),
        False,
        StreamCommit(731, 0, LSN, LSN + 0x30, TS),
    ),
    ("stream-abort-top", b"A" + struct.pack("!II", 731, 731), False, StreamAbort(731, 731)),
    ("stream-abort-sub", b"A" + struct.pack("!II", 731, 735), False, StreamAbort(731, 735)),
    # Inside a streamed transaction (v2): the xid follows the kind byte.
    (
        "stream-relation",
        b"R"
        + struct.pack("!II", 731, 16384)
        + s("public")
        + s("t")
        + b"d"
        + struct.pack("!H", 1)
        + b"\x01"
        + s("id")
        + struct.pack("!Ii", 20, -1),
        True,
        Relation(16384, "public", "t", "d", (RelationColumn(1, "id", 20, -1),), xid=731),
    ),
    (
        "stream-type",
        b"Y" + struct.pack("!II", 731, 16390) + s("public") + s("mood"),
        True,
        Type(16390, "public", "mood", xid=731),
    ),
    (
        "stream-insert",
        b"I" + struct.pack("!II", 731, 16384) + b"N" + tup(t(b"1"), b"n"),
        True,
        Insert(16384, (b"1", None), xid=731),
    ),
    (
        "stream-update",
        b"U" + struct.pack("!II", XID, 16384) + b"K" + tup(t(b"1")) + b"N" + tup(t(b"2")),
        True,
        Update(16384, (b"2",), (b"1",), "K", xid=XID),
    ),
    (
        "stream-update-no-old",
        b"U" + struct.pack("!II", 736, 16384) + b"N" + tup(b"u"),
        True,
        Update(16384, (UNCHANGED,), None, None, xid=736),
    ),
    (
        "stream-delete",
        b"D" + struct.pack("!II", 731, 16384) + b"O" + tup(t(b"1"), t(b"a")),
        True,
        Delete(16384, (b"1", b"a"), "O", xid=731),
    ),
    (
        "stream-truncate",
        b"T" + struct.pack("!IIB", 731, 2, 3) + struct.pack("!II", 16384, 16390),
        True,
        Truncate((16384, 16390), True, True, xid=731),
    ),
    (
        "stream-message",
        b"M" + struct.pack("!IBQ", 731, 1, LSN) + s("p") + struct.pack("!i", 1) + b"x",
        True,
        Message(True, LSN, "p", b"x", xid=731),
    ),
    # Kinds without an xid field read the same inside a stream.
    ("stream-flag-ignored-by-stream-stop", b"E", True, StreamStop()),
    (
        "stream-flag-ignored-by-stream-commit",
        b"c" + struct.pack("!IBQQq", 731, 0, LSN, LSN + 0x30, TS),
        True,
        StreamCommit(731, 0, LSN, LSN + 0x30, TS),
    ),
    ("stream-flag-ignored-by-origin", b"O" + struct.pack("!Q", 1) + s("o"), True, Origin(1, "o")),
]
CASE_IDS = [c[0] for c in CASES]


# -- decoding -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "wire", "in_stream", "expected"), CASES, ids=CASE_IDS)
def test_decode_hand_built(name: str, wire: bytes, in_stream: bool, expected: PgOutputMessage) -> None:
    assert decode(wire, in_stream=in_stream) == expected


@pytest.mark.parametrize(("name", "wire", "in_stream", "expected"), CASES, ids=CASE_IDS)
def test_decode_accepts_memoryview_and_bytearray(
    name: str, wire: bytes, in_stream: bool, expected: PgOutputMessage
) -> None:
    padded = memoryview(b"junk" + wire + b"junk")[4:-4]
    got = decode(padded, in_stream=in_stream)
    assert got == expected
    assert decode(bytearray(wire), in_stream=in_stream) == expected
    for value in _values(got):
        # Values must be real bytes, not views into the caller's buffer.
        assert type(value) in (bytes, BinaryValue, type(None), Unchanged)
        if isinstance(value, BinaryValue):
            assert type(value.data) is bytes


def _values(msg: PgOutputMessage) -> list[ColumnValue]:
    out: list[ColumnValue] = []
    for attr in ("new", "old"):
        out.extend(getattr(msg, attr, None) or ())
    return out


def test_field_types_and_properties() -> None:
    assert RELATION.columns[0].is_key and RELATION.columns[1].is_key
    assert not RELATION.columns[2].is_key
    assert RelationColumn(3, "x", 1, -1).is_key  # other flag bits do not matter
    assert decode(RELATION_BYTES).columns[3].typmod == -1
    msg = decode(CASES[0][1])
    assert isinstance(msg, Begin) and msg.xid == XID
    with pytest.raises(AttributeError):
        msg.xid = 1  # type: ignore[misc]  # frozen
    with pytest.raises((AttributeError, TypeError)):
        msg.extra = 1  # type: ignore[attr-defined]  # slots


def test_unchanged_marker_is_a_singleton() -> None:
    assert repr(UNCHANGED) == "UNCHANGED"
    assert pickle.loads(pickle.dumps(UNCHANGED)) is UNCHANGED
    assert copy.deepcopy(UNCHANGED) is UNCHANGED
    assert UNCHANGED != b"" and UNCHANGED is not None
    ins = decode(b"I" + struct.pack("!I", 1) + b"N" + tup(b"u", b"n"))
    assert isinstance(ins, Insert)
    assert ins.new[0] is UNCHANGED and ins.new[1] is None
    assert pickle.loads(pickle.dumps(ins)) == ins


def test_text_values_stay_raw_bytes() -> None:
    raw = "é".encode("latin-1")  # not UTF-8: values are never decoded here
    ins = decode(b"I" + struct.pack("!I", 1) + b"N" + tup(t(raw)))
    assert isinstance(ins, Insert) and ins.new == (raw,)


# -- tuple helpers --------------------------------------------------------------------------------
TUPLES: list[bytes] = [
    tup(),
    tup(b"n"),
    tup(b"u"),
    tup(t(b"")),
    tup(t(b"1"), t(b"hello"), b"n", b"u", b(b"\x00\x00"), t(b"x" * 3000)),
    tup(b"n", b"n", t(b"k")),
    tup(*(t(str(i).encode()) for i in range(10))),
]


@pytest.mark.parametrize("wire", TUPLES)
def test_tuple_helpers_agree_with_decode_tuple(wire: bytes) -> None:
    head, tail = b"I\x00\x00\x00\x01N", b"trailing"
    buf = head + wire + tail
    values, end = decode_tuple(buf, len(head))
    assert end == len(head) + len(wire)
    assert tuple_end(buf, len(head)) == end
    assert tuple_end(memoryview(buf), len(head)) == end
    for count in range(len(values) + 1):
        assert tuple_prefix(buf, len(head), count) == list(values[:count])
        assert tuple_prefix(memoryview(buf), len(head), count) == list(values[:count])
    with pytest.raises(PgOutputError, match="columns"):
        tuple_prefix(buf, len(head), len(values) + 1)
    assert encode_tuple(values) == wire


def test_change_header_and_tuple_offset() -> None:
    ins = b"I" + struct.pack("!I", 16384) + b"N" + tup(t(b"10"), t(b"a"), b"n")
    assert decode_change_header(ins) == ("I", 16384)
    assert tuple_prefix(ins, CHANGE_TUPLE_OFFSET, 1) == [b"10"]
    assert tuple_end(ins, CHANGE_TUPLE_OFFSET) == len(ins)
    upd = b"U" + struct.pack("!I", 0xFFFF_FFFF) + b"K" + tup(t(b"1"), b"n") + b"N" + tup(t(b"2"), t(b"b"))
    assert decode_change_header(upd) == ("U", 0xFFFF_FFFF)
    # For Update/Delete the first tuple is at the same offset, after the 'K'/'O'/'N' byte.
    old_end = tuple_end(upd, CHANGE_TUPLE_OFFSET)
    assert tuple_prefix(upd, CHANGE_TUPLE_OFFSET, 1) == [b"1"]
    assert upd[old_end : old_end + 1] == b"N"
    assert decode_tuple(upd, old_end + 1) == ((b"2", b"b"), len(upd))
    dele = b"D" + struct.pack("!I", 3) + b"O" + tup(t(b"9"), t(b"z"))
    assert decode_change_header(memoryview(dele)) == ("D", 3)
    assert tuple_prefix(dele, CHANGE_TUPLE_OFFSET, 2) == [b"9", b"z"]
    streamed = b"I" + struct.pack("!II", 731, 16384) + b"N" + tup(t(b"5"))
    assert decode_change_header(streamed, in_stream=True) == ("I", 16384)
    assert tuple_prefix(streamed, CHANGE_TUPLE_OFFSET + 4, 1) == [b"5"]


def test_raw_changes_split_without_decoding() -> None:
    """The stream reader's split: relation id, old kind and the raw TupleData bytes, as sent."""
    new, old = tup(t(b"10"), t(b"a"), b"n"), tup(t(b"1"), b"n")
    assert raw_insert(b"I" + struct.pack("!I", 16384) + b"N" + new) == (16384, new)
    assert raw_update(b"U" + struct.pack("!I", 7) + b"N" + new) == (7, None, None, new)
    assert raw_update(b"U" + struct.pack("!I", 7) + b"K" + old + b"N" + new) == (7, "K", old, new)
    assert raw_delete(b"D" + struct.pack("!I", 3) + b"O" + old) == (3, "O", old)
    assert raw_insert(b"I" + struct.pack("!II", 731, 16384) + b"N" + new, in_stream=True) == (16384, new)
    assert begin_fields(b"B" + struct.pack("!QqI", LSN, TS, XID)) == (LSN, TS, XID)
    assert commit_fields(b"C" + struct.pack("!BQQq", 0, LSN, LSN + 8, TS)) == (0, LSN, LSN + 8, TS)
    kinds = [
        pgoutput.BEGIN,
        pgoutput.COMMIT,
        pgoutput.RELATION,
        pgoutput.INSERT,
        pgoutput.UPDATE,
        pgoutput.DELETE,
    ]
    assert list(b"BCRIUD") == kinds
    assert list(b"TM") == [pgoutput.TRUNCATE, pgoutput.MESSAGE]
    with pytest.raises(PgOutputError, match="expected new tuple marker"):
        raw_insert(b"I" + struct.pack("!I", 1) + b"K" + new)
    with pytest.raises(PgOutputError, match="truncated Delete relation id"):
        raw_delete(b"D\x00")


@pytest.mark.parametrize("in_stream", [False, True])
def test_raw_changes_agree_with_decode(in_stream: bool) -> None:
    rng = random.Random(11 + in_stream)
    for _ in range(300):
        for msg in _random_messages(rng, in_stream):
            wire = encode(msg, in_stream=in_stream)
            if isinstance(msg, Insert):
                relid, new = raw_insert(wire, in_stream)
                assert (relid, decode_tuple(new, 0)) == (msg.relation_id, (msg.new, len(new)))
            elif isinstance(msg, Update):
                relid, old_kind, old, new = raw_update(wire, in_stream)
                assert (relid, old_kind, decode_tuple(new, 0)[0]) == (msg.relation_id, msg.old_kind, msg.new)
                assert (None if old is None else decode_tuple(old, 0)) == (
                    None if msg.old is None else (msg.old, len(old))
                )
            elif isinstance(msg, Delete):
                relid, old_kind, old = raw_delete(wire, in_stream)
                assert (relid, old_kind, decode_tuple(old, 0)) == (
                    msg.relation_id,
                    msg.old_kind,
                    (msg.old, len(old)),
                )


@pytest.mark.parametrize("wire", [b"", b"B" + bytes(20), b"M", b"Ix", b"I\x00\x00\x00", b"E"])
def test_change_header_rejects_non_changes_and_short_input(wire: bytes) -> None:
    with pytest.raises(PgOutputError):
        decode_change_header(wire)


def test_change_header_with_xid_needs_eight_bytes() -> None:
    with pytest.raises(PgOutputError, match="offset 5"):
        decode_change_header(b"I" + struct.pack("!I", 731) + b"\x00\x00", in_stream=True)


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "wire", "in_stream", "expected"), CASES, ids=CASE_IDS)
def test_every_prefix_raises_pgoutput_error(
    name: str, wire: bytes, in_stream: bool, expected: PgOutputMessage
) -> None:
    for cut in range(len(wire)):
        with pytest.raises(PgOutputError):
            decode(wire[:cut], in_stream=in_stream)


@pytest.mark.parametrize("wire", TUPLES, ids=range(len(TUPLES)))
def test_every_tuple_prefix_raises_pgoutput_error(wire: bytes) -> None:
    (ncols,) = struct.unpack_from("!H", wire)
    for cut in range(len(wire)):
        part = wire[:cut]
        with pytest.raises(PgOutputError):
            decode_tuple(part, 0)
        with pytest.raises(PgOutputError):
            tuple_end(part, 0)
        with pytest.raises(PgOutputError):
            tuple_prefix(part, 0, ncols)


def test_truncation_message_names_kind_and_offset() -> None:
    wire = b"B" + struct.pack("!QqI", LSN, TS, XID)
    with pytest.raises(PgOutputError, match=r"^Begin message: truncated Begin: needs 20 bytes at offset 1"):
        decode(wire[:10])
    value_cut = b"I" + struct.pack("!I", 1) + b"N" + tup(t(b"1"), t(b"hello"))[:-2]
    with pytest.raises(
        PgOutputError, match=r"Insert message: truncated TupleData: column 1 value at offset 19"
    ):
        decode(value_cut)
    with pytest.raises(PgOutputError, match="column 1 kind byte at offset 14"):
        decode(b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!H", 2) + t(b"1"))


@pytest.mark.parametrize("kind", [b"X", b"b", b"P", b"K", b"r", b"p", b"\x00", b"\xff"])
def test_unknown_kind_byte(kind: bytes) -> None:
    with pytest.raises(PgOutputError, match=r"offset 0: unknown pgoutput message kind"):
        decode(kind + bytes(40))


def test_empty_payload() -> None:
    with pytest.raises(PgOutputError, match="empty payload"):
        decode(b"")


@pytest.mark.parametrize("bad", [b"x", b"T", b"N", b"\x00", b"U"])
def test_bad_tuple_column_kind(bad: bytes) -> None:
    wire = b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!H", 2) + t(b"1") + bad + bytes(8)
    with pytest.raises(PgOutputError, match=r"column 1 at offset 14: unknown column kind"):
        decode(wire)
    tuple_at = CHANGE_TUPLE_OFFSET
    with pytest.raises(PgOutputError, match="unknown column kind"):
        tuple_end(wire, tuple_at)
    with pytest.raises(PgOutputError, match="unknown column kind"):
        tuple_prefix(wire, tuple_at, 2)
    assert tuple_prefix(wire, tuple_at, 1) == [b"1"]  # a prefix never looks past what it needs


def test_negative_value_length() -> None:
    wire = b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!H", 1) + b"t" + struct.pack("!i", -1)
    for fn in (lambda: decode(wire), lambda: tuple_end(wire, 6), lambda: tuple_prefix(wire, 6, 1)):
        with pytest.raises(PgOutputError, match="negative value length -1"):
            fn()


@pytest.mark.parametrize(
    ("wire", "match"),
    [
        (b"I" + struct.pack("!I", 1) + b"X" + tup(), r"offset 5: expected new tuple marker"),
        (b"U" + struct.pack("!I", 1) + b"X" + tup(), r"offset 5: expected tuple marker"),
        (b"U" + struct.pack("!I", 1) + b"K" + tup() + b"K" + tup(), r"offset 8: expected new tuple marker"),
        (b"D" + struct.pack("!I", 1) + b"N" + tup(), r"offset 5: expected old tuple marker"),
        (b"R" + struct.pack("!I", 1) + s("a") + s("b") + b"x" + struct.pack("!H", 0), "replica identity"),
        (b"T" + struct.pack("!IB", 0, 4), "unknown Truncate option bits 0x04"),
        (b"M" + struct.pack("!BQ", 2, 0) + s("") + struct.pack("!i", 0), "unknown Message flag bits 0x02"),
        (b"M" + struct.pack("!BQ", 0, 0) + s("") + struct.pack("!i", -5), "negative Message content length"),
        (b"S" + struct.pack("!IB", 1, 2), "first-segment flag"),
        (b"O" + struct.pack("!Q", 0) + b"\xff\xfe\x00", "not valid UTF-8"),
        (b"T" + struct.pack("!IB", 0x7FFF_FFFF, 0), "truncated Truncate"),
        (b"B" + bytes(20) + b"\x00", r"1 unexpected trailing bytes at offset 21$"),
        (b"E\x00", "trailing bytes at offset 1"),
    ],
)
def test_malformed_fields(wire: bytes, match: str) -> None:
    with pytest.raises(PgOutputError, match=match):
        decode(wire)


def test_in_stream_mismatch_is_detected() -> None:
    streamed = b"I" + struct.pack("!II", 731, 16384) + b"N" + tup(t(b"1"))
    with pytest.raises(PgOutputError):
        decode(streamed)  # the xid is read as the relation id, then 'N' is not where expected
    plain = b"T" + struct.pack("!IB", 1, 0) + struct.pack("!I", 16384)
    with pytest.raises(PgOutputError, match="wrong in_stream"):
        decode(plain + bytes(4))


def test_error_is_a_value_error() -> None:
    assert issubclass(PgOutputError, ValueError)


def test_random_corruption_only_raises_pgoutput_error() -> None:
    """Flipped, inserted and deleted bytes must never surface IndexError/struct.error/Unicode errors."""
    rng = random.Random(20240601)
    for _ in range(4000):
        _name, wire, in_stream, _expected = rng.choice(CASES)
        data = bytearray(wire)
        for _ in range(rng.randint(1, 3)):
            op = rng.randrange(3)
            pos = rng.randrange(len(data) + 1)
            if op == 0 and pos < len(data):
                data[pos] = rng.randrange(256)
            elif op == 1:
                data[pos:pos] = bytes([rng.randrange(256)])
            elif len(data) > 1 and pos < len(data):
                del data[pos]
        corrupt = bytes(data)
        with contextlib.suppress(PgOutputError):
            decode(corrupt, in_stream=in_stream)
        if corrupt[:1] in (b"I", b"U", b"D"):
            off = CHANGE_TUPLE_OFFSET + (4 if in_stream else 0)
            with contextlib.suppress(PgOutputError):
                tuple_end(corrupt, off)
            with contextlib.suppress(PgOutputError):
                tuple_prefix(corrupt, off, 1)
            with contextlib.suppress(PgOutputError):
                decode_change_header(corrupt, in_stream=in_stream)


# -- encoder --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "wire", "in_stream", "expected"), CASES, ids=CASE_IDS)
def test_encode_matches_hand_built_bytes(
    name: str, wire: bytes, in_stream: bool, expected: PgOutputMessage
) -> None:
    assert encode(expected, in_stream=in_stream) == wire


def _random_value(rng: random.Random) -> ColumnValue:
    r = rng.random()
    if r < 0.15:
        return None
    if r < 0.25:
        return UNCHANGED
    data = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 5, 40, 300])))
    return BinaryValue(data) if r < 0.35 else data


def _random_messages(rng: random.Random, in_stream: bool) -> list[PgOutputMessage]:
    def vals(n: int) -> tuple[ColumnValue, ...]:
        return tuple(_random_value(rng) for _ in range(n))

    def xid() -> int | None:
        return rng.randrange(2**32) if in_stream else None

    def text() -> str:
        return "".join(rng.choice("abc XYZ_\"'é€☃\U0001f600") for _ in range(rng.randrange(12)))

    n = rng.randrange(0, 12)
    old = vals(n) if rng.random() < 0.6 else None
    return [
        Begin(rng.randrange(2**64), rng.randrange(-(2**63), 2**63), rng.randrange(2**32)),
        Commit(
            rng.randrange(256), rng.randrange(2**64), rng.randrange(2**64), rng.randrange(-(2**63), 2**63)
        ),
        Origin(rng.randrange(2**64), text()),
        Relation(
            rng.randrange(2**32),
            text(),
            text(),
            rng.choice("dnfi"),
            tuple(
                RelationColumn(rng.randrange(2), text(), rng.randrange(2**32), rng.randrange(-(2**31), 2**31))
                for _ in range(n)
            ),
            xid(),
        ),
        Type(rng.randrange(2**32), text(), text(), xid()),
        Insert(rng.randrange(2**32), vals(n), xid()),
        Update(rng.randrange(2**32), vals(n), old, None if old is None else rng.choice("KO"), xid()),
        Delete(rng.randrange(2**32), vals(n), rng.choice("KO"), xid()),
        Truncate(
            tuple(rng.randrange(2**32) for _ in range(n)), rng.random() < 0.5, rng.random() < 0.5, xid()
        ),
        Message(
            rng.random() < 0.5,
            rng.randrange(2**64),
            text(),
            bytes(rng.randrange(256) for _ in range(rng.randrange(50))),
            xid(),
        ),
        StreamStart(rng.randrange(2**32), rng.random() < 0.5),
        StreamStop(),
        StreamCommit(
            rng.randrange(2**32), 0, rng.randrange(2**64), rng.randrange(2**64), rng.randrange(2**63)
        ),
        StreamAbort(rng.randrange(2**32), rng.randrange(2**32)),
    ]


@pytest.mark.parametrize("in_stream", [False, True])
def test_round_trip_every_kind(in_stream: bool) -> None:
    rng = random.Random(7 + in_stream)
    seen: set[type] = set()
    for _ in range(300):
        for msg in _random_messages(rng, in_stream):
            wire = encode(msg, in_stream=in_stream)
            assert decode(wire, in_stream=in_stream) == msg
            assert encode(decode(wire, in_stream=in_stream), in_stream=in_stream) == wire
            seen.add(type(msg))
    assert len(seen) == 14


def test_encode_tuple_round_trip() -> None:
    values = (b"1", None, UNCHANGED, b"", BinaryValue(b"\x00"), b"x" * 70000)
    wire = encode_tuple(values)
    assert wire == tup(t(b"1"), b"n", b"u", t(b""), b(b"\x00"), t(b"x" * 70000))
    assert decode_tuple(wire, 0) == (values, len(wire))
    assert encode_tuple([]) == b"\x00\x00"
    assert encode_tuple(iter([b"a"])) == tup(t(b"a"))


@pytest.mark.parametrize(
    ("msg", "in_stream", "error"),
    [
        (Insert(1, (), xid=5), False, "only sent inside a stream"),
        (Insert(1, ()), True, "needs an xid"),
        (Message(True, 0, "p", b"", xid=None), True, "needs an xid"),
        (Origin(0, "a\x00b"), False, "contains NUL"),
        (Relation(1, "s", "t", "x", ()), False, "replica_identity"),
        (Relation(1, "s", "t", "dd", ()), False, "replica_identity"),
        (Update(1, (), (), None), False, "need both"),
        (Update(1, (), None, "K"), False, "need both"),
        (Delete(1, (), "N"), False, "expected 'K' or 'O'"),
        (Begin(-1, 0, 0), False, "cannot encode"),
        (Begin(0, 0, 2**32), False, "cannot encode"),
        (Relation(1, "s", "t", "d", (RelationColumn(256, "c", 1, -1),)), False, "cannot encode"),
    ],
)
def test_encode_rejects_unrepresentable(msg: PgOutputMessage, in_stream: bool, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        encode(msg, in_stream=in_stream)


def test_encode_rejects_wrong_types() -> None:
    with pytest.raises(TypeError, match="expected bytes"):
        encode_tuple(["text"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not a pgoutput message"):
        encode(object())  # type: ignore[arg-type]
