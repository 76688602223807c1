"""I/O-free decoder for PostgreSQL's pgoutput logical replication protocol (bytes in, messages out).

Covers the message kinds of protocol versions 1 and 2 as PostgreSQL 15 sends them
("Logical Replication Message Formats" in the PostgreSQL docs). Two-phase-commit kinds
(protocol v3) are not decoded and are reported as unknown.

Conventions:

* Integers keep their wire meaning: LSNs are unsigned 64-bit ints, timestamps are signed
  microseconds since 2000-01-01 00:00 UTC, xids and OIDs are unsigned 32-bit ints, typmods are
  signed (-1 = none).
* Column values are left undecoded: ``'t'`` (text format) -> ``bytes``, ``'b'`` (binary format) ->
  `BinaryValue`, ``'n'`` -> ``None``, ``'u'`` (unchanged TOAST value) -> `UNCHANGED`. Turning them
  into Python values is another module's job, since it needs the column types.
* Every malformed input (truncated, unknown kind byte, bad flag, trailing bytes) raises
  `PgOutputError` naming what was wrong and the byte offset; never ``IndexError`` or
  ``struct.error``.

In protocol v2, messages sent inside a streamed transaction (between Stream Start and Stream
Stop) carry the xid right after the kind byte for the kinds that have one (Relation, Type,
Insert, Update, Delete, Truncate, Message). The wire format does not say whether the field is
there, so the caller passes ``in_stream=True`` while it is between those two messages.

Two ways in: `decode` builds a message object with every value decoded; the stream reader's hot path
(cdc/stream/loop.py) takes `raw_insert`, `raw_update`, `raw_delete`, `begin_fields` and
`commit_fields`, which split a message without decoding its values, and `decode` is built on them,
so there is one parser. It stays one module (over 450 lines) for that reason: both ways share the
low-level readers and the TupleData loops.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

__all__ = [
    "BEGIN",
    "CHANGE_TUPLE_OFFSET",
    "COMMIT",
    "DELETE",
    "INSERT",
    "MESSAGE",
    "RELATION",
    "TRUNCATE",
    "UNCHANGED",
    "UPDATE",
    "Begin",
    "BinaryValue",
    "ColumnValue",
    "Commit",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "PgOutputError",
    "PgOutputMessage",
    "Relation",
    "RelationColumn",
    "StreamAbort",
    "StreamCommit",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "Type",
    "Unchanged",
    "Update",
    "begin_fields",
    "commit_fields",
    "decode",
    "decode_change_header",
    "decode_tuple",
    "raw_delete",
    "raw_insert",
    "raw_update",
    "tuple_end",
    "tuple_prefix",
]


class PgOutputError(ValueError):
    """The bytes are not a well-formed pgoutput message (truncated, unknown kind, bad field)."""


class Unchanged(enum.Enum):
    """Type of `UNCHANGED`. An enum so the marker stays a singleton across pickling and copying."""

    UNCHANGED = "UNCHANGED"

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = Unchanged.UNCHANGED
"""A TOASTed value the change did not touch (column kind ``'u'``): the server did not send it."""


@dataclass(frozen=True, slots=True)
class BinaryValue:
    """A column value in the type's binary send format (column kind ``'b'``).

    Kept apart from plain ``bytes`` (text format) because the two need different conversion.
    """

    data: bytes


ColumnValue: TypeAlias = bytes | BinaryValue | Literal[Unchanged.UNCHANGED] | None


# -- messages -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_ts: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class Origin:
    origin_lsn: int
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    flags: int
    name: str
    type_oid: int
    typmod: int

    @property
    def is_key(self) -> bool:
        """Part of the replica identity (primary key or the chosen index; all columns for FULL)."""
        return bool(self.flags & 1)


@dataclass(frozen=True, slots=True)
class Relation:
    relation_id: int
    namespace: str  # "" for pg_catalog, as the server sends it
    name: str
    replica_identity: str  # 'd' default, 'n' nothing, 'f' full, 'i' index
    columns: tuple[RelationColumn, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Type:
    type_oid: int
    namespace: str  # "" for pg_catalog
    name: str
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Insert:
    relation_id: int
    new: tuple[ColumnValue, ...]
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    relation_id: int
    new: tuple[ColumnValue, ...]
    old: tuple[ColumnValue, ...] | None  # None when the key did not change and identity is not FULL
    old_kind: str | None  # 'K' key columns only (others None), 'O' whole old row, None with old=None
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    relation_id: int
    old: tuple[ColumnValue, ...]
    old_kind: str  # 'K' key columns only (others None), 'O' whole old row
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    relation_ids: tuple[int, ...]
    cascade: bool
    restart_identity: bool
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """A pg_logical_emit_message() record."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_ts: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    xid: int
    subxid: int  # equals xid when the whole streamed transaction is aborted


PgOutputMessage: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | Message
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)


# -- low-level readers ----------------------------------------------------------------------------
_U16 = struct.Struct("!H")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")
_BEGIN = struct.Struct("!QqI")  # final lsn, commit ts, xid
_COMMIT = struct.Struct("!BQQq")  # flags, commit lsn, end lsn, commit ts
_REL_TAIL = struct.Struct("!BH")  # replica identity, number of columns
_COL_TAIL = struct.Struct("!Ii")  # type oid, typmod
_TRUNC = struct.Struct("!IB")  # number of relations, options
_MSG_HEAD = struct.Struct("!BQ")  # flags, lsn
_STREAM_START = struct.Struct("!IB")  # xid, first segment
_STREAM_COMMIT = struct.Struct("!IBQQq")  # xid, flags, commit lsn, end lsn, commit ts
_STREAM_ABORT = struct.Struct("!II")  # xid, subxid
_CHANGE_HEAD = struct.Struct("!IB")  # relation id, first tuple marker (Insert, Update, Delete)
_unpack_change_head = _CHANGE_HEAD.unpack_from
_unpack_i32 = _I32.unpack_from  # bound once: the TupleData loops call them per column
_unpack_u16 = _U16.unpack_from


CHANGE_TUPLE_OFFSET: Final = 6
"""Offset of the first TupleData in a v1 (not streamed) Insert, Update or Delete.

Layout: kind byte, Int32 relation id, then 'N' (Insert: the new tuple), 'K'/'O' (Delete: the old
tuple; Update: the old tuple, the new one follows) or 'N' (Update without old tuple). Inside a
streamed transaction the xid shifts it by 4 bytes.
"""

# Message kind bytes as ints (indexing bytes yields ints): a payload's first byte says its kind.
BEGIN: Final = 66  # b"B"
COMMIT: Final = 67  # b"C"
RELATION: Final = 82  # b"R"
INSERT: Final = 73  # b"I"
UPDATE: Final = 85  # b"U"
DELETE: Final = 68  # b"D"
TRUNCATE: Final = 84  # b"T"
MESSAGE: Final = 77  # b"M"

# Tuple markers inside Insert, Update and Delete
_NEW_TUPLE: Final = 78  # b"N"
_KEY_TUPLE: Final = 75  # b"K": the old row's replica identity columns only
_OLD_TUPLE: Final = 79  # b"O": the whole old row (REPLICA IDENTITY FULL)

_TRUNCATE_CASCADE: Final = 1
_TRUNCATE_RESTART_IDENTITY: Final = 2
_MESSAGE_TRANSACTIONAL: Final = 1
_REPLICA_IDENTITIES: Final = frozenset("dnfi")
_CHANGE_KINDS: Final = {ord("I"): "I", ord("U"): "U", ord("D"): "D"}
_XID_KINDS: Final = frozenset(b"RYIUDTM")  # kinds that carry an xid inside a streamed transaction

# The TupleData loops below compare column kind bytes as int literals (116 't', 98 'b', 110 'n',
# 117 'u'): indexing bytes yields ints, and a literal is cheaper than a global in the hot loop.


def _as_bytes(buf: bytes | bytearray | memoryview) -> bytes:
    """Column values must be independent ``bytes``, not views that pin (or alias) the caller's buffer."""
    return buf if type(buf) is bytes else bytes(buf)


def _unpack(st: struct.Struct, buf: bytes, off: int, what: str) -> tuple:
    try:
        return st.unpack_from(buf, off)
    except struct.error:
        raise PgOutputError(
            f"truncated {what}: needs {st.size} bytes at offset {off}, only {max(len(buf) - off, 0)} left"
        ) from None


def _string(buf: bytes, off: int, what: str) -> tuple[str, int]:
    """A NUL-terminated UTF-8 string at off -> (text, offset after the NUL)."""
    end = buf.find(b"\x00", off)
    if end < 0:
        raise PgOutputError(f"truncated {what}: string at offset {off} has no terminating NUL")
    try:
        return buf[off:end].decode("utf-8"), end + 1
    except UnicodeDecodeError as e:
        raise PgOutputError(f"{what}: string at offset {off} is not valid UTF-8 ({e.reason})") from None


def _byte(buf: bytes, off: int, what: str) -> int:
    if off >= len(buf):
        raise PgOutputError(f"truncated {what}: needs 1 byte at offset {off}, only 0 left")
    return buf[off]


def _xid(buf: bytes, off: int, in_stream: bool) -> tuple[int | None, int]:
    if not in_stream:
        return None, off
    return _unpack(_U32, buf, off, "streamed transaction xid")[0], off + 4


# -- TupleData ------------------------------------------------------------------------------------
def _read_tuple(buf: bytes, offset: int, count: int) -> tuple[list[ColumnValue], int]:
    """The first `count` columns (-1: all) of the TupleData at offset -> (values, end of the last).

    The stream reader's hot path: the common 't' kind tested first, one slice per value, no
    per-column bounds bookkeeping beyond one comparison; error details are worked out only once
    something is wrong.
    """
    try:
        (ncols,) = _unpack_u16(buf, offset)
    except struct.error:
        raise PgOutputError(f"truncated TupleData: column count at offset {offset} is cut off") from None
    if count < 0:
        count = ncols
    elif count > ncols:
        raise PgOutputError(f"TupleData at offset {offset} has {ncols} columns, {count} requested")
    n = len(buf)
    off = offset + 2
    values: list[ColumnValue] = []
    append = values.append
    col = 0
    try:
        for col in range(count):
            kind = buf[off]
            if kind == 116:  # 't'
                (length,) = _unpack_i32(buf, off + 1)
                end = off + 5 + length
                if length < 0 or end > n:
                    break
                append(buf[off + 5 : end])
                off = end
            elif kind == 110:  # 'n'
                append(None)
                off += 1
            elif kind == 117:  # 'u'
                append(UNCHANGED)
                off += 1
            elif kind == 98:  # 'b'
                (length,) = _unpack_i32(buf, off + 1)
                end = off + 5 + length
                if length < 0 or end > n:
                    break
                append(BinaryValue(buf[off + 5 : end]))
                off = end
            else:
                raise _kind_error(off, col, kind)
        else:
            return values, off
    except (IndexError, struct.error):
        pass
    # Only reached when something is cut off or a length is negative: work out which, and where.
    raise _column_error(buf, off, col)


def _kind_error(off: int, col: int, kind: int) -> PgOutputError:
    return PgOutputError(
        f"TupleData column {col} at offset {off}: unknown column kind {bytes([kind])!r} "
        "(expected b'n', b'u', b't' or b'b')"
    )


def _column_error(buf: bytes | bytearray | memoryview, off: int, col: int) -> PgOutputError:
    n = len(buf)
    if off >= n:
        return PgOutputError(f"truncated TupleData: column {col} kind byte at offset {off} is missing")
    if off + 5 > n:
        return PgOutputError(f"truncated TupleData: column {col} length at offset {off + 1} is cut off")
    (length,) = _I32.unpack_from(buf, off + 1)
    if length < 0:
        return PgOutputError(f"TupleData column {col} at offset {off}: negative value length {length}")
    return PgOutputError(
        f"truncated TupleData: column {col} value at offset {off + 5} needs {length} bytes, "
        f"only {n - off - 5} left"
    )


def decode_tuple(buf: bytes | bytearray | memoryview, offset: int) -> tuple[tuple[ColumnValue, ...], int]:
    """Decode the TupleData at offset -> (column values, offset just after it)."""
    values, end = _read_tuple(buf if type(buf) is bytes else bytes(buf), offset, -1)
    return tuple(values), end


def tuple_prefix(buf: bytes | bytearray | memoryview, offset: int, count: int) -> list[ColumnValue]:
    """Decode only the first `count` columns of the TupleData at offset (e.g. up to the last key column).

    Raises `PgOutputError` if the tuple has fewer than `count` columns.
    """
    return _read_tuple(buf if type(buf) is bytes else bytes(buf), offset, count)[0]


def tuple_end(buf: bytes | bytearray | memoryview, offset: int) -> int:
    """Skip the TupleData at offset without decoding it; return the offset just after it."""
    try:
        (ncols,) = _unpack_u16(buf, offset)
    except struct.error:
        raise PgOutputError(f"truncated TupleData: column count at offset {offset} is cut off") from None
    n = len(buf)
    off = offset + 2
    col = 0
    try:
        for col in range(ncols):
            kind = buf[off]
            if kind in (116, 98):  # 't', 'b'
                (length,) = _unpack_i32(buf, off + 1)
                end = off + 5 + length
                if length < 0 or end > n:
                    break
                off = end
            elif kind in (110, 117):  # 'n', 'u'
                off += 1
            else:
                raise _kind_error(off, col, kind)
        else:
            return off
    except (IndexError, struct.error):
        pass
    raise _column_error(buf, off, col)


def decode_change_header(
    payload: bytes | bytearray | memoryview, *, in_stream: bool = False
) -> tuple[str, int]:
    """('I'|'U'|'D', relation id) of a change message, without decoding its tuples.

    With ``in_stream=True`` the xid after the kind byte is skipped (v2 streamed transaction).
    """
    if not payload:
        raise PgOutputError("empty payload: expected an Insert, Update or Delete message")
    kind = _CHANGE_KINDS.get(payload[0])
    if kind is None:
        raise PgOutputError(
            f"offset 0: {bytes(payload[:1])!r} is not a change message kind (expected b'I', b'U' or b'D')"
        )
    off = 5 if in_stream else 1
    try:
        return kind, _U32.unpack_from(payload, off)[0]
    except struct.error:
        raise PgOutputError(f"truncated {kind} message: relation id at offset {off} is cut off") from None


# -- changes without decoding their values (the stream reader's hot path) ---------------------------
# The stream keeps each row's TupleData as the raw bytes the server sent and decodes only the key
# columns: these split a change into its parts with one header unpack and at most one tuple skip.
def _head_error(buf: bytes, off: int, what: str, allowed: bytes, marker: str) -> PgOutputError:
    """What is wrong with a change's relation id and first tuple marker at off (a struct.error there)."""
    if len(buf) < off + 4:
        return PgOutputError(
            f"truncated {what} relation id: needs 4 bytes at offset {off}, only {max(len(buf) - off, 0)} left"
        )
    return _marker_error(buf, off + 4, allowed, marker)


def _marker_error(buf: bytes, off: int, allowed: bytes, what: str) -> PgOutputError:
    if off >= len(buf):
        return PgOutputError(f"truncated {what}: needs 1 byte at offset {off}, only 0 left")
    expected = ", ".join(repr(bytes([a])) for a in allowed)
    return PgOutputError(f"offset {off}: expected {what} ({expected}), got {buf[off : off + 1]!r}")


# One unpack, one slice, one frame per change: these run once per captured row.
def raw_insert(buf: bytes, in_stream: bool = False) -> tuple[int, bytes]:
    """(relation id, new TupleData bytes) of an Insert; the values stay undecoded (`tuple_prefix`)."""
    off = 5 if in_stream else 1
    try:
        relid, marker = _unpack_change_head(buf, off)
    except struct.error:
        raise _head_error(buf, off, "Insert", b"N", "new tuple marker") from None
    if marker != _NEW_TUPLE:
        raise _marker_error(buf, off + 4, b"N", "new tuple marker")
    return relid, buf[off + 5 :]


def raw_update(buf: bytes, in_stream: bool = False) -> tuple[int, str | None, bytes | None, bytes]:
    """(relation id, old kind, old TupleData bytes, new TupleData bytes) of an Update.

    Old kind 'K' (key columns only, others null), 'O' (whole old row) or None (no old tuple: the key
    did not change and the identity is not FULL), with the old bytes None.
    """
    off = 5 if in_stream else 1
    try:
        relid, marker = _unpack_change_head(buf, off)
    except struct.error:
        raise _head_error(buf, off, "Update", b"KON", "tuple marker") from None
    if marker == _NEW_TUPLE:
        return relid, None, None, buf[off + 5 :]
    if marker != _KEY_TUPLE and marker != _OLD_TUPLE:
        raise _marker_error(buf, off + 4, b"KON", "tuple marker")
    end = tuple_end(buf, off + 5)
    if buf[end : end + 1] != b"N":
        raise _marker_error(buf, end, b"N", "new tuple marker")
    return relid, "K" if marker == _KEY_TUPLE else "O", buf[off + 5 : end], buf[end + 1 :]


def raw_delete(buf: bytes, in_stream: bool = False) -> tuple[int, str, bytes]:
    """(relation id, old kind 'K' or 'O', old TupleData bytes) of a Delete."""
    off = 5 if in_stream else 1
    try:
        relid, marker = _unpack_change_head(buf, off)
    except struct.error:
        raise _head_error(buf, off, "Delete", b"KO", "old tuple marker") from None
    if marker != _KEY_TUPLE and marker != _OLD_TUPLE:
        raise _marker_error(buf, off + 4, b"KO", "old tuple marker")
    return relid, "K" if marker == _KEY_TUPLE else "O", buf[off + 5 : tuple_end(buf, off + 5)]


def begin_fields(buf: bytes) -> tuple[int, int, int]:
    """(final LSN, commit timestamp, xid) of a Begin, without building a `Begin`."""
    return _unpack(_BEGIN, buf, 1, "Begin")


def commit_fields(buf: bytes) -> tuple[int, int, int, int]:
    """(flags, commit LSN, end LSN, commit timestamp) of a Commit, without building a `Commit`."""
    return _unpack(_COMMIT, buf, 1, "Commit")


# -- messages -------------------------------------------------------------------------------------
_Decoded = tuple[PgOutputMessage, int]


def _begin(buf: bytes, in_stream: bool) -> _Decoded:
    return Begin(*begin_fields(buf)), 1 + _BEGIN.size


def _commit(buf: bytes, in_stream: bool) -> _Decoded:
    return Commit(*commit_fields(buf)), 1 + _COMMIT.size


def _origin(buf: bytes, in_stream: bool) -> _Decoded:
    (origin_lsn,) = _unpack(_U64, buf, 1, "Origin LSN")
    name, off = _string(buf, 9, "Origin name")
    return Origin(origin_lsn, name), off


def _relation(buf: bytes, in_stream: bool) -> _Decoded:
    xid, off = _xid(buf, 1, in_stream)
    (relid,) = _unpack(_U32, buf, off, "Relation id")
    namespace, off = _string(buf, off + 4, "Relation namespace")
    name, off = _string(buf, off, "Relation name")
    ident, ncols = _unpack(_REL_TAIL, buf, off, "Relation replica identity and column count")
    replica_identity = chr(ident)
    if replica_identity not in _REPLICA_IDENTITIES:
        raise PgOutputError(
            f"offset {off}: unknown replica identity {bytes([ident])!r} (expected b'd', b'n', b'f' or b'i')"
        )
    off += _REL_TAIL.size
    columns = []
    for i in range(ncols):
        flags = _byte(buf, off, f"Relation column {i} flags")
        col_name, off = _string(buf, off + 1, f"Relation column {i} name")
        type_oid, typmod = _unpack(_COL_TAIL, buf, off, f"Relation column {i} type")
        off += _COL_TAIL.size
        columns.append(RelationColumn(flags, col_name, type_oid, typmod))
    return Relation(relid, namespace, name, replica_identity, tuple(columns), xid), off


def _type(buf: bytes, in_stream: bool) -> _Decoded:
    xid, off = _xid(buf, 1, in_stream)
    (type_oid,) = _unpack(_U32, buf, off, "Type OID")
    namespace, off = _string(buf, off + 4, "Type namespace")
    name, off = _string(buf, off, "Type name")
    return Type(type_oid, namespace, name, xid), off


def _insert(buf: bytes, in_stream: bool) -> _Decoded:
    relid, new = raw_insert(buf, in_stream)
    values, end = decode_tuple(buf, len(buf) - len(new))
    return Insert(relid, values, _xid(buf, 1, in_stream)[0]), end


def _update(buf: bytes, in_stream: bool) -> _Decoded:
    relid, old_kind, old, new = raw_update(buf, in_stream)
    new_start = len(buf) - len(new)
    old_values = None if old is None else decode_tuple(buf, new_start - 1 - len(old))[0]
    values, end = decode_tuple(buf, new_start)
    return Update(relid, values, old_values, old_kind, _xid(buf, 1, in_stream)[0]), end


def _delete(buf: bytes, in_stream: bool) -> _Decoded:
    relid, old_kind, old = raw_delete(buf, in_stream)
    values, end = decode_tuple(buf, len(buf) - len(old))
    return Delete(relid, values, old_kind, _xid(buf, 1, in_stream)[0]), end


def _truncate(buf: bytes, in_stream: bool) -> _Decoded:
    xid, off = _xid(buf, 1, in_stream)
    nrels, options = _unpack(_TRUNC, buf, off, "Truncate header")
    if options & ~(_TRUNCATE_CASCADE | _TRUNCATE_RESTART_IDENTITY):
        raise PgOutputError(f"offset {off + 4}: unknown Truncate option bits {options:#04x}")
    off += _TRUNC.size
    end = off + 4 * nrels
    if end > len(buf):
        raise PgOutputError(
            f"truncated Truncate: {nrels} relation ids need {4 * nrels} bytes at offset {off}, "
            f"only {len(buf) - off} left"
        )
    relids = struct.unpack_from(f"!{nrels}I", buf, off)
    return (
        Truncate(relids, bool(options & _TRUNCATE_CASCADE), bool(options & _TRUNCATE_RESTART_IDENTITY), xid),
        end,
    )


def _message(buf: bytes, in_stream: bool) -> _Decoded:
    xid, off = _xid(buf, 1, in_stream)
    flags, lsn = _unpack(_MSG_HEAD, buf, off, "Message flags and LSN")
    if flags & ~_MESSAGE_TRANSACTIONAL:
        raise PgOutputError(f"offset {off}: unknown Message flag bits {flags:#04x}")
    prefix, off = _string(buf, off + _MSG_HEAD.size, "Message prefix")
    (length,) = _unpack(_I32, buf, off, "Message content length")
    start = off + 4
    end = start + length
    if length < 0:
        raise PgOutputError(f"offset {off}: negative Message content length {length}")
    if end > len(buf):
        raise PgOutputError(
            f"truncated Message: content at offset {start} needs {length} bytes, only {len(buf) - start} left"
        )
    return Message(bool(flags), lsn, prefix, buf[start:end], xid), end


def _stream_start(buf: bytes, in_stream: bool) -> _Decoded:
    xid, first = _unpack(_STREAM_START, buf, 1, "Stream Start")
    if first > 1:
        raise PgOutputError(f"offset 5: Stream Start first-segment flag must be 0 or 1, got {first}")
    return StreamStart(xid, bool(first)), 1 + _STREAM_START.size


def _stream_stop(buf: bytes, in_stream: bool) -> _Decoded:
    return StreamStop(), 1


def _stream_commit(buf: bytes, in_stream: bool) -> _Decoded:
    xid, flags, commit_lsn, end_lsn, commit_ts = _unpack(_STREAM_COMMIT, buf, 1, "Stream Commit")
    return StreamCommit(xid, flags, commit_lsn, end_lsn, commit_ts), 1 + _STREAM_COMMIT.size


def _stream_abort(buf: bytes, in_stream: bool) -> _Decoded:
    xid, subxid = _unpack(_STREAM_ABORT, buf, 1, "Stream Abort")
    return StreamAbort(xid, subxid), 1 + _STREAM_ABORT.size


_DECODERS: Final[dict[int, tuple[str, Callable[[bytes, bool], _Decoded]]]] = {
    ord("B"): ("Begin", _begin),
    ord("C"): ("Commit", _commit),
    ord("O"): ("Origin", _origin),
    ord("R"): ("Relation", _relation),
    ord("Y"): ("Type", _type),
    ord("I"): ("Insert", _insert),
    ord("U"): ("Update", _update),
    ord("D"): ("Delete", _delete),
    ord("T"): ("Truncate", _truncate),
    ord("M"): ("Message", _message),
    ord("S"): ("Stream Start", _stream_start),
    ord("E"): ("Stream Stop", _stream_stop),
    ord("c"): ("Stream Commit", _stream_commit),
    ord("A"): ("Stream Abort", _stream_abort),
}


def decode(payload: bytes | bytearray | memoryview, *, in_stream: bool = False) -> PgOutputMessage:
    """Decode one whole pgoutput message (the payload of one XLogData / one slot row).

    ``in_stream=True``: the caller is between Stream Start and Stream Stop (protocol v2), so the
    kinds that carry an xid there have one after the kind byte. The whole payload must be
    consumed: trailing bytes raise, because they mean a framing error or a wrong `in_stream`.
    """
    buf = _as_bytes(payload)
    if not buf:
        raise PgOutputError("empty payload: expected a pgoutput message")
    entry = _DECODERS.get(buf[0])
    if entry is None:
        raise PgOutputError(f"offset 0: unknown pgoutput message kind {buf[:1]!r}")
    name, decoder = entry
    try:
        msg, end = decoder(buf, in_stream)
    except PgOutputError as e:
        raise PgOutputError(f"{name} message: {e}") from None
    if end != len(buf):
        raise PgOutputError(
            f"{name} message: {len(buf) - end} unexpected trailing bytes at offset {end}"
            + (" (wrong in_stream?)" if buf[0] in _XID_KINDS else "")
        )
    return msg
