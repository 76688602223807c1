"""Splitting a table into ctid ranges so several workers can COPY it at once.

ctid ranges are cheap to scan (TID range scans, PostgreSQL 14+) and need no index; a range
of N heap pages holds the same rows whatever the key distribution is.
"""

from __future__ import annotations

from dataclasses import dataclass

PAGES_PER_CHUNK = 4096  # 32 MiB of heap per chunk


@dataclass(frozen=True)
class Chunk:
    number: int
    first_page: int | None  # None = the whole table in one COPY
    end_page: int | None  # exclusive; None = to the end

    @property
    def whole_table(self) -> bool:
        return self.first_page is None and self.end_page is None


def plan_chunks(relpages: int, relkind: str, pages_per_chunk: int = PAGES_PER_CHUNK) -> list[Chunk]:
    """Chunks covering the whole heap. The last one is open-ended so rows on pages the
    statistics did not know about are still copied."""
    if relkind != "r" or relpages <= pages_per_chunk:
        return [Chunk(0, None, None)]
    chunks = []
    start, number = 0, 0
    while start + pages_per_chunk < relpages:
        chunks.append(Chunk(number, start, start + pages_per_chunk))
        start += pages_per_chunk
        number += 1
    chunks.append(Chunk(number, start, None))
    return chunks
