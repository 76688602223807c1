"""Every follower against the source, read with each engine's own client, none of our sink code:
delta-rs for Delta, pyiceberg for Iceberg (its SQL catalog on the sink's SQLite catalog file),
redis-py for Redis, tantivy's searcher for the search index (the readers of
tests/fixtures/readers.py, shared with the test suite). `cdc verify` runs too, as a second opinion.

Values are compared as text (PostgreSQL's output function on the source; str() of what the
follower holds), over the columns the source has now: a column the source dropped may stay in
a follower (the lake keeps it), so it is not compared.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fixtures.readers import (
    DELTA_RS_LACKS,
    delta_reader_features,
    iceberg_catalog,
    redis_rows,
    tantivy_docs,
    tantivy_live_count,
)
from tests.harness import source_rows

EXAMPLES = 5  # mismatches printed per follower and table, at most


@dataclass
class Tally:
    compared: int = 0  # source rows looked up in the follower
    lost: int = 0  # in the source, not in the follower
    extra: int = 0  # in the follower, not in the source (a delete not applied)
    doubled: int = 0  # a key held more than once (Delta rows, or documents)
    stale: int = 0  # present with another value
    examples: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name in ("compared", "lost", "extra", "doubled", "stale"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.examples += other.examples[: max(0, EXAMPLES - len(self.examples))]

    @property
    def clean(self) -> bool:
        return self.lost == self.extra == self.doubled == self.stale == 0


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)


def compare(
    where: str, source: dict[str, dict[str, Any]], follower: dict[str, dict[str, Any]], doubled: int
) -> Tally:
    """source: {key text: {column: text}}; follower: {key text: {column: value}}."""
    tally = Tally(compared=len(source), doubled=doubled)
    for key, row in source.items():
        held = follower.get(key)
        if held is None:
            tally.lost += 1
            _example(tally, f"{where}: key {key} lost")
            continue
        diff = [c for c, v in row.items() if _text(held.get(c)) != v]
        if diff:
            tally.stale += 1
            _example(
                tally,
                f"{where}: key {key} differs in {diff[:3]}: source {[row[c] for c in diff[:3]]}, follower {[held.get(c) for c in diff[:3]]}",
            )
    extra = sorted(set(follower) - set(source))
    tally.extra = len(extra)
    for key in extra[:2]:
        _example(tally, f"{where}: key {key} should have been deleted")
    return tally


def _example(tally: Tally, text: str) -> None:
    if len(tally.examples) < EXAMPLES:
        tally.examples.append(text)


def source_table(dsn: str, table: str) -> dict[str, dict[str, Any]]:
    return {key[0]: row for key, row in source_rows(dsn, table, ["id"]).items()}


def delta_table(path: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """(rows by id, how many ids appear more than once), read with delta-rs."""
    from deltalake import DeltaTable

    lacks = delta_reader_features(path) & DELTA_RS_LACKS
    if lacks:
        raise RuntimeError(f"{path}: delta-rs cannot read reader features {sorted(lacks)}")
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    counts = Counter(str(r["id"]) for r in rows)
    return {str(r["id"]): r for r in rows}, sum(n - 1 for n in counts.values() if n > 1)


def iceberg_table(warehouse: Path, table: str) -> tuple[dict[str, dict[str, Any]], int]:
    """(rows by id, how many ids appear more than once), read with pyiceberg."""
    rows = iceberg_catalog(warehouse, "ice").load_table(table).scan().to_arrow().to_pylist()
    counts = Counter(str(r["id"]) for r in rows)
    return {str(r["id"]): r for r in rows}, sum(n - 1 for n in counts.values() if n > 1)


def redis_table(client: Any, table: str) -> tuple[dict[str, dict[str, Any]], int]:
    rows = redis_rows(client, f"{table}:")
    return {key.split(":", 1)[1]: value for key, value in rows.items()}, 0  # a key is unique in Redis


def tantivy_table(table_dir: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """Live documents by id; an id with two live documents is doubled."""
    docs = tantivy_docs(table_dir)  # {_cdc_id: row}: one entry per id, so live documents are counted apart
    return docs, tantivy_live_count(table_dir) - len(docs)
