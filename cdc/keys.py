"""Canonical row keys: the key columns' PostgreSQL text output, COPY-escaped, joined by tabs.

COPY text (snapshot segments) already holds fields in exactly this escaped form, and pgoutput
(the stream) sends the same text output unescaped, so both sides produce identical key bytes
cheaply: a snapshot row and a later change of the same row compact together.
"""

from __future__ import annotations

import re

# Bytes COPY escapes on output (PostgreSQL's CopyAttributeOutText).
_NEEDS_ESCAPE = re.compile(rb"[\\\t\n\r\x08\x0c\x0b]")
_ESCAPES = {
    b"\\": b"\\\\",
    b"\t": b"\\t",
    b"\n": b"\\n",
    b"\r": b"\\r",
    b"\x08": b"\\b",
    b"\x0c": b"\\f",
    b"\x0b": b"\\v",
}
_UNESCAPES = {
    b"\\": b"\\",
    b"t": b"\t",
    b"n": b"\n",
    b"r": b"\r",
    b"b": b"\x08",
    b"f": b"\x0c",
    b"v": b"\x0b",
}
_ESCAPED = re.compile(rb"\\(.)", re.S)


def escape(value: bytes) -> bytes:
    if _NEEDS_ESCAPE.search(value) is None:
        return value
    return _NEEDS_ESCAPE.sub(lambda m: _ESCAPES[m.group(0)], value)


def unescape(field: bytes) -> bytes:
    if b"\\" not in field:
        return field
    return _ESCAPED.sub(lambda m: _UNESCAPES.get(m.group(1), m.group(1)), field)


def key_from_values(values: list, indexes: tuple[int, ...]) -> bytes:
    """Key from raw text values (bytes) as pgoutput sends them."""
    if len(indexes) == 1:
        return escape(values[indexes[0]])
    return b"\t".join(escape(values[i]) for i in indexes)


def key_from_copy_fields(fields: list[bytes], indexes: tuple[int, ...]) -> bytes:
    """Key from the fields of a COPY text line (already escaped)."""
    if len(indexes) == 1:
        return fields[indexes[0]]
    return b"\t".join(fields[i] for i in indexes)


def key_texts(key: bytes) -> list[str]:
    """The key columns' text values back from a canonical key."""
    return [unescape(part).decode() for part in key.split(b"\t")]


# ---- keyless (insert-only) tables: rows keyed by their position in the log ------------------------
_SEGMENT_BITS, _BYTE_BITS = 27, 36


def position_key(lsn: int, seq: int) -> bytes:
    """The log key of a keyless table's row: its position, "<commit lsn>\\t<seq>" (never compacted away)."""
    return b"%d\t%d" % (lsn, seq)


def snapshot_seq(segment_off: int, byte_pos: int) -> int:
    """The `seq` of a keyless table's snapshot row: negative (never a streamed row's), unique within the
    snapshot's LSN: the segment's log offset (low 27 bits) and the row's byte offset in the segment file
    (below 64 GiB), so every reader of the same segment gives the same position."""
    return -(((segment_off & ((1 << _SEGMENT_BITS) - 1)) << _BYTE_BITS) | byte_pos) - 1
