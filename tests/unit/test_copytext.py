"""COPY text format helpers (cdc.copytext)."""

from __future__ import annotations

import random

import pytest

from cdc.copytext import copy_text_escape, copy_text_unescape, split_copy_line

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("", ""),
        ("plain text", "plain text"),
        ("\\N", None),
        ("\\\\N", "\\N"),  # an escaped backslash then N: the two-character string, not NULL
        ("a\\\\b", "a\\b"),
        ("line1\\nline2", "line1\nline2"),
        ("a\\tb", "a\tb"),
        ("\\r\\n", "\r\n"),
        ("\\b\\f\\v", "\b\f\v"),
        ("\\\\\\\\", "\\\\"),
        ("\\x41\\102", "AB"),  # hex and octal escapes (accepted on input by COPY)
        ("\\x4g", "\x04g"),  # a hex escape takes at most the hex digits that follow
        ("\\xg", "xg"),  # no hex digit: backslash-x is just x
        ("\\0", "\x00"),
        ("\\1234", "S4"),  # at most three octal digits
        ("\\xc3\\xa9t\\303\\251", "été"),  # bytes forming UTF-8 characters
        ("\\xf0\\x9f\\x98\\x80", "😀"),
        ("\\q\\.", "q."),  # any other character stands for itself
        ("\\\\0", "\\0"),  # not an octal escape: the backslash is itself escaped
        ("héllo\\twörld ✓", "héllo\twörld ✓"),
    ],
)
def test_unescape(field: str, value: str | None) -> None:
    assert copy_text_unescape(field) == value


def test_unescape_fast_path_returns_same_object() -> None:
    field = "no escapes here " * 10
    assert copy_text_unescape(field) is field


@pytest.mark.parametrize("field", ["a\\", "\\\\\\", "\\xff", "\\xc3"])
def test_unescape_rejects_bad_fields(field: str) -> None:
    with pytest.raises(ValueError):
        copy_text_unescape(field)


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (None, "\\N"),
        ("", ""),
        ("plain", "plain"),
        ("\\N", "\\\\N"),
        ("a\tb\nc\rd", "a\\tb\\nc\\rd"),
        ("\b\f\v\\", "\\b\\f\\v\\\\"),
        ("ünï 😀", "ünï 😀"),
    ],
)
def test_escape(value: str | None, field: str) -> None:
    assert copy_text_escape(value) == field
    assert copy_text_unescape(field) == value


def test_escape_fast_path_returns_same_object() -> None:
    value = "nothing to escape " * 10
    assert copy_text_escape(value) is value


def test_escape_unescape_round_trip_random() -> None:
    rng = random.Random(11)
    alphabet = "ab\\\t\n\r\b\f\vN\x00é😀 x0178"
    for _ in range(3000):
        value = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        field = copy_text_escape(value)
        assert "\t" not in field and "\n" not in field and "\r" not in field
        assert copy_text_unescape(field) == value


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        ("", [""]),
        ("\n", [""]),
        ("a\tb\tc\n", ["a", "b", "c"]),
        ("a\t\t\\N\n", ["a", "", "\\N"]),
        ("a\\tb\tc", ["a\\tb", "c"]),  # an escaped tab (backslash + t) is data
        ("a\\\tb\tc", ["a\\\tb", "c"]),  # backslash + raw tab: an escaped tab character
        ("a\\\\\tb", ["a\\\\", "b"]),  # escaped backslash, then a separator
        ("a\\\\\\\tb\tc\n", ["a\\\\\\\tb", "c"]),
        ("x\\\n", ["x\\\n"]),  # an escaped newline at the end is data, not the line end
    ],
)
def test_split_copy_line(line: str, fields: list[str]) -> None:
    assert split_copy_line(line) == fields


def test_split_then_unescape_round_trip() -> None:
    rng = random.Random(13)
    alphabet = "ab\\\t\n\rN é"
    for _ in range(2000):
        row = [
            None if rng.random() < 0.1 else "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
            for _ in range(rng.randint(1, 6))
        ]
        line = "\t".join(copy_text_escape(v) for v in row) + "\n"
        assert [copy_text_unescape(f) for f in split_copy_line(line)] == row
