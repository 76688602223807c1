"""A Spark failure of a derived view as an error that names the view and says what to do: a column the
source renamed (found in the log's schema versions) or dropped, a key that is not unique, or the Spark line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from cdc.ground.config import ViewConfig
from cdc.ground.errors import CdcError, SinkError
from cdc.ground.tables import TableName

_UNRESOLVED = re.compile(r"name `([^`]+)`(?:\.`([^`]+)`)? cannot be resolved")


def renamed_column(log, tables: Sequence[TableName], column: str) -> tuple[TableName, str] | None:
    """(table, the column's name now) when `column` is an earlier name of a column of one of
    `tables` that the source renamed since (the log's schema versions keep each column's attnum)."""
    history = getattr(log, "schema_history", None)  # Debezium topics keep no versions
    if history is None:
        return None
    for table in tables:
        try:
            versions = history(table)
        except CdcError:
            continue
        if not versions:
            continue
        now = {c.attnum: c.name for c in versions[-1][2].columns if c.attnum}
        if any(c.lower() == column.lower() for c in now.values()):
            continue
        for _v, _since, schema in reversed(versions[:-1]):
            old = next((c for c in schema.columns if c.name.lower() == column.lower() and c.attnum), None)
            if old is not None:
                return (table, now[old.attnum]) if old.attnum in now else None
    return None


def _explain(
    view: ViewConfig,
    exc: Exception,
    line: str,
    renamed: Callable[[str], tuple[TableName, str] | None] = lambda _c: None,
) -> SinkError:
    """A Spark failure of the view as an error naming the view (and the column, for a column the
    source renamed or no longer has)."""
    match = _UNRESOLVED.search(str(exc))
    if match:
        column = match.group(2) or match.group(1)
        found = renamed(column)
        if found is not None:
            table, now = found
            return SinkError(
                f"view {view.name}: column {column} of {table} it uses was renamed to {now} at the source; the view "
                "keeps its last good cut and its followers wait",
                f"change the view's SQL in the pipeline file to use {now} (the view is then rebuilt)",
            )
        return SinkError(
            f"view {view.name}: column {column} it uses is not in the captured tables any more "
            f"(dropped at the source?): {line}",
            "change the view's SQL in the pipeline file (the view is then rebuilt) or restore the column",
        )
    if "multiple source rows matched" in str(exc).lower() or "MERGE_CARDINALITY" in str(exc):
        return SinkError(
            f"view {view.name}: its key ({', '.join(view.key)}) is not unique: {line}",
            "choose key columns that identify one row of the view (key: in the pipeline file)",
        )
    return SinkError(
        f"view {view.name}: {line}",
        "the view keeps its last good cut and is maintained again on the next run; CDC_DEBUG=1 shows a traceback",
    )
