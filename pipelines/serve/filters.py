"""A subscription's filter: by key (`?key=V`, or `?key.col=V` per column of a composite key) and by
one or more simple column predicates (`?where=col=V`, ops = != < <= > >=), all of them ANDed.

A change matches when its `after` row matches, or its `before` row (deletes; updates whose old
row is in the event: REPLICA IDENTITY FULL), so a row leaving the filter is seen leaving.
Values compare as JSON text (strings as they are); < <= > >= compare numbers as numbers.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from cdc.ground.errors import UsageError

_WHERE = re.compile(r"^([^=!<>]+?)\s*(=|!=|<=|>=|<|>)\s*(.*)$", re.S)
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}  # fmt: skip


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else orjson.dumps(value).decode()


@dataclass(frozen=True)
class Predicate:
    column: str
    op: str
    value: str

    def test(self, row: dict[str, Any]) -> bool:
        if self.column not in row:
            return False
        got = row[self.column]
        if self.op in ("=", "!="):
            return _OPS[self.op](_text(got), self.value)
        try:
            return _OPS[self.op](float(got), float(self.value))
        except (TypeError, ValueError):
            return got is not None and _OPS[self.op](_text(got), self.value)


@dataclass(frozen=True)
class Filter:
    predicates: tuple[Predicate, ...]

    @property
    def empty(self) -> bool:
        return not self.predicates

    def matches(self, doc: dict[str, Any]) -> bool:
        rows = [r for r in (doc.get("after"), doc.get("before")) if r]
        if not rows:
            return doc.get("op") == "t"  # a truncate concerns every row
        return any(all(p.test(r) for p in self.predicates) for r in rows)


def parse_filter(params: list[tuple[str, str]], key_columns: tuple[str, ...]) -> Filter:
    preds: list[Predicate] = []
    for name, value in params:
        if name == "key":
            if len(key_columns) != 1:
                raise UsageError(
                    f"key=: the key has {len(key_columns)} columns",
                    f"write key.<column>=V for each of {', '.join(key_columns)}",
                )
            preds.append(Predicate(key_columns[0], "=", value))
        elif name.startswith("key."):
            preds.append(Predicate(name[4:], "=", value))
        elif name == "where":
            m = _WHERE.match(value)
            if m is None:
                raise UsageError(
                    f"where={value!r} is not `column OP value`",
                    "write e.g. where=status=shipped or where=qty>=10",
                )
            preds.append(Predicate(m.group(1).strip(), m.group(2), m.group(3)))
    return Filter(tuple(preds))
