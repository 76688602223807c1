"""What `cdc` prints about its own work, read back by the benchmarks (its clock starts after imports
and connecting, so self-reported rates are a little higher than the wall-clock ones)."""

from __future__ import annotations

import re

_STREAMED = re.compile(r"streamed ([\d,]+) events in ([\d,]+) transactions \(([\d,]+) events/s\)")
_SNAPSHOT_DONE = re.compile(
    r"snapshot done: ([\d,]+) rows from \d+ table\(s\) in [\d.]+s \(([\d,]+) rows/s\)"
)
_COPYING = re.compile(r"in (\d+) chunk\(s\) with (\d+) worker\(s\)")
_CHUNKED = re.compile(r"rows in (\d+) chunk\(s\) in ")  # a chunked snapshot's per-table line
_CHUNK_READERS = re.compile(r"rows in \d+ chunk\(s\) in [\d.]+s \((\d+) reader\(s\)")
_APPLIED = re.compile(r"sink (\w+): applied cut \d+ \([^)]*\) in ([\d.]+)s: (.*)")
_COUNTS = re.compile(r"\+([\d,]+) ~([\d,]+) -([\d,]+)(?: \(([\d,]+) not newer)?")


def num(text: str) -> int:
    return int(text.replace(",", ""))


def stream(out: str) -> dict[str, int]:
    """`cdc stream`'s final line: events, transactions, self-reported rate."""
    m = _STREAMED.search(out)
    if m is None:
        raise RuntimeError(
            f"cannot find the final 'streamed ...' line in cdc stream's output:\n{out[-2000:]}"
        )
    return {"events": num(m[1]), "transactions": num(m[2]), "rate": num(m[3])}


def snapshot(out: str) -> dict[str, int]:
    """`cdc snapshot`'s rows, self-reported rate, chunks and workers."""
    m, w = _SNAPSHOT_DONE.search(out), _COPYING.search(out)
    if m is None:
        raise RuntimeError(f"cannot find 'snapshot done: ...' in cdc snapshot's output:\n{out[-2000:]}")
    return {
        "rows": num(m[1]),
        "rate": num(m[2]),
        "chunks": int(w[1]) if w else sum(int(c) for c in _CHUNKED.findall(out)),
        "workers": int(w[2]) if w else max((int(r) for r in _CHUNK_READERS.findall(out)), default=0),
    }


def applied(out: str, sink: str) -> tuple[float, str]:
    """`cdc apply`'s report line of one sink: (its own seconds, what it wrote)."""
    for line in out.splitlines():
        m = _APPLIED.search(line)
        if m and m[1] == sink:
            return float(m[2]), m[3]
    raise RuntimeError(f"no 'applied cut' line for sink {sink} in:\n{out[-2000:]}")


def doc_counts(detail: str) -> tuple[int, int, int, int]:
    """A search sink's (+inserted ~updated -deleted, not newer) from its report detail."""
    c = _COUNTS.search(detail)
    if c is None:
        return 0, 0, 0, 0
    return num(c[1]), num(c[2]), num(c[3]), num(c[4]) if c[4] else 0
