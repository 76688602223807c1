"""PostgreSQL log sequence numbers: 64-bit integers printed as 'HI/LO' in hex."""

from __future__ import annotations


def parse_lsn(text: str) -> int:
    """'16/B374D848' -> 97500059720. Raises ValueError for anything else."""
    hi, sep, lo = text.strip().partition("/")
    if not sep or not hi or not lo:
        raise ValueError(f"not an LSN: {text!r} (expected two hex numbers like 16/B374D848)")
    return (int(hi, 16) << 32) | int(lo, 16)


def format_lsn(value: int) -> str:
    """97500059720 -> '16/B374D848'."""
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"
