"""Encoder for pgoutput messages: the exact inverse of `cdc.pgoutput.decode`.

Used by tests to build wire bytes and by log compaction to re-encode tuples, so the output is
byte-for-byte what the server would send for the same message: ``decode(encode(m)) == m`` for
every message kind.

Values that cannot be represented on the wire (a string containing NUL, an integer out of its
field's range, an xid present outside a streamed transaction...) raise ``ValueError`` or
``TypeError`` instead of producing bytes the decoder would read differently.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Final

from cdc.pgoutput import (
    UNCHANGED,
    Begin,
    BinaryValue,
    ColumnValue,
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
)

__all__ = ["encode", "encode_tuple"]

_U8 = struct.Struct("!B")
_U16 = struct.Struct("!H")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_BEGIN = struct.Struct("!cQqI")
_COMMIT = struct.Struct("!cBQQq")
_ORIGIN = struct.Struct("!cQ")
_REL_TAIL = struct.Struct("!cH")
_COL_TAIL = struct.Struct("!Ii")
_TRUNC = struct.Struct("!IB")
_MSG_HEAD = struct.Struct("!BQ")
_STREAM_START = struct.Struct("!cIB")
_STREAM_COMMIT = struct.Struct("!cIBQQq")
_STREAM_ABORT = struct.Struct("!cII")

_REPLICA_IDENTITIES: Final = frozenset("dnfi")

_NULL: Final = b"n"
_UNCHANGED: Final = b"u"


def _pack(st: struct.Struct, *values: object) -> bytes:
    """struct.pack with a ValueError naming the field layout when a value does not fit."""
    try:
        return st.pack(*values)
    except struct.error as e:
        raise ValueError(f"cannot encode {values!r} as {st.format!r}: {e}") from None


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    if b"\x00" in data:
        raise ValueError(f"string {text!r} contains NUL, which the wire format uses as terminator")
    return data + b"\x00"


def _value(value: ColumnValue) -> bytes:
    if type(value) is bytes:
        return b"t" + _I32.pack(len(value)) + value
    if value is None:
        return _NULL
    if value is UNCHANGED:
        return _UNCHANGED
    if isinstance(value, BinaryValue):
        return b"b" + _I32.pack(len(value.data)) + bytes(value.data)
    raise TypeError(f"column value {value!r}: expected bytes (text format), BinaryValue, None or UNCHANGED")


def encode_tuple(values: Iterable[ColumnValue]) -> bytes:
    """TupleData for these column values (Int16 count, then one entry per column)."""
    parts = [_value(v) for v in values]
    return _pack(_U16, len(parts)) + b"".join(parts)


def _head(kind: bytes, xid: int | None, in_stream: bool, name: str) -> bytes:
    """Kind byte plus, inside a streamed transaction, the xid (required there, forbidden outside)."""
    if in_stream:
        if xid is None:
            raise ValueError(f"{name} inside a streamed transaction needs an xid")
        return kind + _pack(_U32, xid)
    if xid is not None:
        raise ValueError(f"{name} has xid={xid} but in_stream=False: the xid is only sent inside a stream")
    return kind


def _begin(m: Begin, in_stream: bool) -> bytes:
    return _pack(_BEGIN, b"B", m.final_lsn, m.commit_ts, m.xid)


def _commit(m: Commit, in_stream: bool) -> bytes:
    return _pack(_COMMIT, b"C", m.flags, m.commit_lsn, m.end_lsn, m.commit_ts)


def _origin(m: Origin, in_stream: bool) -> bytes:
    return _pack(_ORIGIN, b"O", m.origin_lsn) + _string(m.name)


def _relation(m: Relation, in_stream: bool) -> bytes:
    if len(m.replica_identity) != 1 or m.replica_identity not in _REPLICA_IDENTITIES:
        raise ValueError(f"replica_identity {m.replica_identity!r}: expected 'd', 'n', 'f' or 'i'")
    parts = [
        _head(b"R", m.xid, in_stream, "Relation"),
        _pack(_U32, m.relation_id),
        _string(m.namespace),
        _string(m.name),
        _pack(_REL_TAIL, m.replica_identity.encode("ascii"), len(m.columns)),
    ]
    for col in m.columns:
        parts.append(_pack(_U8, col.flags))
        parts.append(_string(col.name))
        parts.append(_pack(_COL_TAIL, col.type_oid, col.typmod))
    return b"".join(parts)


def _type(m: Type, in_stream: bool) -> bytes:
    return (
        _head(b"Y", m.xid, in_stream, "Type")
        + _pack(_U32, m.type_oid)
        + _string(m.namespace)
        + _string(m.name)
    )


def _insert(m: Insert, in_stream: bool) -> bytes:
    return _head(b"I", m.xid, in_stream, "Insert") + _pack(_U32, m.relation_id) + b"N" + encode_tuple(m.new)


def _update(m: Update, in_stream: bool) -> bytes:
    head = _head(b"U", m.xid, in_stream, "Update") + _pack(_U32, m.relation_id)
    if m.old is None and m.old_kind is None:
        return head + b"N" + encode_tuple(m.new)
    if m.old is None or m.old_kind not in ("K", "O"):
        raise ValueError(
            f"Update: old_kind {m.old_kind!r} with old={m.old!r}: need both ('K'/'O') or neither"
        )
    return head + m.old_kind.encode("ascii") + encode_tuple(m.old) + b"N" + encode_tuple(m.new)


def _delete(m: Delete, in_stream: bool) -> bytes:
    if m.old_kind not in ("K", "O"):
        raise ValueError(f"Delete: old_kind {m.old_kind!r}, expected 'K' or 'O'")
    return (
        _head(b"D", m.xid, in_stream, "Delete")
        + _pack(_U32, m.relation_id)
        + m.old_kind.encode("ascii")
        + encode_tuple(m.old)
    )


def _truncate(m: Truncate, in_stream: bool) -> bytes:
    options = (1 if m.cascade else 0) | (2 if m.restart_identity else 0)
    n = len(m.relation_ids)
    return (
        _head(b"T", m.xid, in_stream, "Truncate")
        + _pack(_TRUNC, n, options)
        + _pack(struct.Struct(f"!{n}I"), *m.relation_ids)
    )


def _message(m: Message, in_stream: bool) -> bytes:
    content = bytes(m.content)
    return (
        _head(b"M", m.xid, in_stream, "Message")
        + _pack(_MSG_HEAD, 1 if m.transactional else 0, m.lsn)
        + _string(m.prefix)
        + _pack(_I32, len(content))
        + content
    )


def _stream_start(m: StreamStart, in_stream: bool) -> bytes:
    return _pack(_STREAM_START, b"S", m.xid, 1 if m.first_segment else 0)


def _stream_stop(m: StreamStop, in_stream: bool) -> bytes:
    return b"E"


def _stream_commit(m: StreamCommit, in_stream: bool) -> bytes:
    return _pack(_STREAM_COMMIT, b"c", m.xid, m.flags, m.commit_lsn, m.end_lsn, m.commit_ts)


def _stream_abort(m: StreamAbort, in_stream: bool) -> bytes:
    return _pack(_STREAM_ABORT, b"A", m.xid, m.subxid)


_ENCODERS: Final[dict[type, Callable[..., bytes]]] = {
    Begin: _begin,
    Commit: _commit,
    Origin: _origin,
    Relation: _relation,
    Type: _type,
    Insert: _insert,
    Update: _update,
    Delete: _delete,
    Truncate: _truncate,
    Message: _message,
    StreamStart: _stream_start,
    StreamStop: _stream_stop,
    StreamCommit: _stream_commit,
    StreamAbort: _stream_abort,
}


def encode(msg: PgOutputMessage, *, in_stream: bool = False) -> bytes:
    """Wire bytes of one pgoutput message.

    ``in_stream=True`` writes the xid of the kinds that carry one inside a streamed transaction
    (their ``xid`` must then be set; outside a stream it must be None), mirroring `decode`.
    """
    encoder = _ENCODERS.get(type(msg))
    if encoder is None:
        raise TypeError(f"not a pgoutput message: {msg!r}")
    return encoder(msg, in_stream)
