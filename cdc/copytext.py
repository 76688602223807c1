"""PostgreSQL COPY text format: splitting a line into fields, unescaping and escaping a field.

In COPY's text format (the default of `COPY ... TO STDOUT`) a row is one line, fields are
separated by tabs, NULL is written `\\N`, and a backslash escapes the characters that would
otherwise end a field or a line: `\\\\`, `\\n`, `\\t`, `\\r`, `\\b`, `\\f`, `\\v`. On input
COPY also accepts `\\ooo` (octal) and `\\xhh` (hex) byte escapes, and a backslash before any
other character stands for that character; `copy_text_unescape` accepts all of these.

Most fields contain no backslash at all; every function here returns early in that case.
"""

from __future__ import annotations

import re

_SIMPLE_UNESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
# One escape: octal (1-3 digits), hex (1-2 digits) or a backslash before any one character.
_ESCAPE_RE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))", re.DOTALL)

_ESCAPES = str.maketrans(
    {"\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
)
_NEEDS_ESCAPE_RE = re.compile(r"[\\\b\f\n\r\t\v]")
_TAB_OR_ESCAPE_RE = re.compile(r"\\.|\t", re.DOTALL)


def copy_text_unescape(field: str) -> str | None:
    """One field of a COPY text line -> its value; `\\N` -> None (SQL NULL).

    Raises ValueError when the field ends with a lone backslash, or when byte escapes
    (`\\ooo`, `\\xhh`) do not form valid UTF-8.
    """
    if "\\" not in field:
        return field
    if field == "\\N":
        return None
    high_bytes = False

    def unescape(match: re.Match[str]) -> str:
        nonlocal high_bytes
        char = match[3]
        if char is not None:
            return _SIMPLE_UNESCAPES.get(char, char)
        byte = int(match[1], 8) & 0xFF if match[1] is not None else int(match[2], 16)
        if byte < 0x80:
            return chr(byte)
        # Bytes of a multi-byte character, possibly spread over several escapes: kept as
        # surrogate escapes for now and decoded together below.
        high_bytes = True
        return chr(0xDC00 + byte)

    value = _ESCAPE_RE.sub(unescape, field)
    if (len(field) - len(field.rstrip("\\"))) % 2:
        raise ValueError(f"COPY field ends with a lone backslash: {field!r}")
    if high_bytes:
        try:
            value = value.encode("utf-8", "surrogateescape").decode("utf-8")
        except UnicodeError as exc:
            raise ValueError(f"COPY field's byte escapes are not valid UTF-8: {field!r}") from exc
    return value


def copy_text_escape(value: str | None) -> str:
    """A value -> one field of a COPY text line (the inverse of `copy_text_unescape`)."""
    if value is None:
        return "\\N"
    if _NEEDS_ESCAPE_RE.search(value) is None:
        return value
    return value.translate(_ESCAPES)


def split_copy_line(line: str) -> list[str]:
    """A COPY text line -> its (still escaped) fields. One trailing newline is dropped.

    Only tabs not escaped by a backslash separate fields (COPY itself writes a tab inside a
    value as `\\t`, so a raw tab is always a separator in what PostgreSQL prints).
    """
    if line.endswith("\n") and (len(line) - 1 - len(line[:-1].rstrip("\\"))) % 2 == 0:
        line = line[:-1]
    if "\\\t" not in line:
        return line.split("\t")
    fields = []
    start = 0
    for match in _TAB_OR_ESCAPE_RE.finditer(line):
        if match[0] == "\t":
            fields.append(line[start : match.start()])
            start = match.end()
    fields.append(line[start:])
    return fields
