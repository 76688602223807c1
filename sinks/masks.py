"""The masks of one value's text, in plain Python (no Spark): what `mask: hash | redact | null`
makes of a PostgreSQL text value. sinks/shaping.py builds the Spark expression that must equal
`hmac_hex`; the change feed (pipelines/serve) masks with these functions directly."""

from __future__ import annotations

import hashlib
import hmac

REDACTED = "[redacted]"
TEXT_OID = 25
# pg_type of text as cdc.typemap resolves it: what a hashed or redacted column is typed as.
TEXT_TYPE = {
    "oid": TEXT_OID,
    "name": "text",
    "kind": "base",
    "element": None,
    "delimiter": ",",
    "base_typmod": -1,
    "domain_name": None,
}


def hmac_hex(key: str, text: str) -> str:
    """The `hash` mask of one value's text (the reference the Spark expression must equal)."""
    return hmac.new(key.encode(), text.encode(), hashlib.sha256).hexdigest()


def mask_text(kind: str, key: str | None, text: str | None) -> str | None:
    """A mask applied to one value's text in Python (fast defaults, missing values, the feed)."""
    if text is None or kind == "null":
        return None
    if kind == "redact":
        return REDACTED
    assert key is not None  # the pipeline file requires mask_key with a hash mask
    return hmac_hex(key, text)
