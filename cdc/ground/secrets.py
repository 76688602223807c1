"""Keep passwords out of anything we print or log."""

from __future__ import annotations

import re

# A scheme starts where no scheme character precedes it and is at most 64 long: without both, a long
# run of letters and digits (a 96 kB value in a `cdc verify` sample) is retried from each of its
# characters to its end, quadratic: 50 s to print one line.
_URI_PASSWORD = re.compile(
    r"(?<![a-z0-9+.-])(?P<head>[a-z][a-z0-9+.-]{0,63}://[^:/@\s]*:)(?P<secret>[^@\s]*)(?P<tail>@)", re.I
)
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|\S+)", re.I)
_MASK = "***"


def redact(text: str) -> str:
    """Mask passwords in DSNs/URLs (`postgresql://u:pw@h`, `password=pw`) found anywhere in text."""
    text = _URI_PASSWORD.sub(lambda m: m["head"] + _MASK + m["tail"], text)
    return _KV_PASSWORD.sub(lambda m: m["head"] + _MASK, text)


def redact_with(text: str, secrets: list[str]) -> str:
    """Like redact(), and also mask each known secret value wherever it appears (e.g. in a driver message)."""
    text = redact(text)
    for secret in secrets:
        if secret and len(secret) >= 3:
            text = text.replace(secret, _MASK)
    return text
