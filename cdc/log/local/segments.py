"""Reading snapshot segment files (COPY text, one row a line), usable without a LocalLog: Spark
executors open the files themselves. Slices of one file by byte range never overlap."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_segment_lines(path: Path, start: int = 0, end: int | None = None) -> Iterator[bytes]:
    """The lines (newline kept) of a segment file; with start/end only the lines that begin at a
    byte in [start, end) (so slices of one file split it without overlap)."""
    with open(path, "rb") as f:
        if start:
            f.seek(start - 1)
            pos = start - 1 + len(f.readline())  # the line holding byte start-1 belongs to the slice before
        else:
            pos = 0
        for line in f:
            if end is not None and pos >= end:
                return
            pos += len(line)
            yield line


def iter_segment_lines_at(path: Path, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    """iter_segment_lines, each line (newline removed) with the byte offset it starts at (the
    position of a keyless table's snapshot row: cdc.keys.snapshot_seq)."""
    with open(path, "rb") as f:
        if start:
            f.seek(start - 1)
            pos = start - 1 + len(f.readline())
        else:
            pos = 0
        for line in f:
            if end is not None and pos >= end:
                return
            yield pos, line.rstrip(b"\n")
            pos += len(line)


def iter_segment_positions(path: Path, start: int = 0, end: int | None = None) -> Iterator[list[Any]]:
    """As iter_segment, each line's fields followed by the byte offset the line starts at (the
    position of a keyless table's snapshot row: cdc.keys.snapshot_seq)."""
    for pos, line in iter_segment_lines_at(path, start, end):
        fields: list[Any] = line.split(b"\t")
        fields.append(pos)
        yield fields


def iter_segment(path: Path, start: int = 0, end: int | None = None) -> Iterator[list[bytes]]:
    """Fields (still COPY-escaped) of each line of iter_segment_lines."""
    for line in iter_segment_lines(path, start, end):
        yield line.rstrip(b"\n").split(b"\t")
