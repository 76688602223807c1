"""cdc/ground/secrets.py: passwords masked wherever they appear in printed text, and long values (a
row's 96 kB text in a `cdc verify` sample) passed through whole."""

from __future__ import annotations

import hashlib

import pytest

from cdc.ground.secrets import redact, redact_with

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("postgresql://cdc:hunter2@db/shop", "postgresql://cdc:***@db/shop"),
        ("dsn=postgresql://cdc:hunter2@db", "dsn=postgresql://cdc:***@db"),
        ("url: jdbc:postgresql://cdc:hunter2@db:5432/x", "url: jdbc:postgresql://cdc:***@db:5432/x"),
        ("(redis+tls://:hunter2@cache:6380)", "(redis+tls://:***@cache:6380)"),
        ("host=db password=hunter2 user=cdc", "host=db password=*** user=cdc"),
        ("password = 'two words'", "password = ***"),
        ("no secret in http://db/shop or user@host", "no secret in http://db/shop or user@host"),
    ],
)
def test_passwords_are_masked(text: str, masked: str) -> None:
    assert redact(text) == masked


def test_a_long_value_is_passed_through_whole() -> None:
    # one run of 960,000 letters and digits, then a DSN: each scheme is tried from where a run starts
    # only (tried from every character it took ~50 s per 96 kB line; pytest's timeout ends a relapse)
    value = "".join(hashlib.md5(str(i).encode()).hexdigest() for i in range(30_000))
    line = f"missing: 1 row(s) (doc='{value}') postgresql://cdc:hunter2@db"
    assert redact(line) == f"missing: 1 row(s) (doc='{value}') postgresql://cdc:***@db"
    assert redact_with(value + "hunter2", ["hunter2"]) == value + "***"
