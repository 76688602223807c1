"""The session settings every connection of ours uses, so PostgreSQL's text output is canonical.

Values in the log are PostgreSQL text output (from COPY in snapshots, from pgoutput in the
stream). Both must print a value the same way, whatever the server's defaults are, or the
same key would look different in a snapshot row and in a later change.
"""

from __future__ import annotations

SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "iso_8601",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "client_encoding": "UTF8",
}


def libpq_options() -> str:
    """The value for libpq's `options` connection parameter (applies to walsenders too)."""
    return " ".join(f"-c {name}={value.replace(' ', '')}" for name, value in SESSION_SETTINGS.items())
