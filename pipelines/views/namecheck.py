"""A derived view's output columns found without Spark (`cdc validate`, before any JVM starts): sqlglot
resolves the view's columns against the captured tables' column names (Spark dialect, names compared
without regard to case, as Spark does). When sqlglot resolves every column and the output names pass
`check_names`, the view is fine by name; anything else (a column it cannot resolve, an unnamed
expression, SQL it cannot qualify) is left to Spark (pipelines/views/check.py), whose analysis is
the authority: a view Spark accepts is never failed here. Types and functions are not checked here:
the view stage checks them with Spark before its first cut."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.qualify import qualify

from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName
from pipelines.views.plan import DIALECT, ViewPlan

# Characters plain Delta column names cannot hold (column mapping off): an unnamed expression such
# as count(1) gets Spark's generated name with parentheses
NOT_IN_NAMES = set(" ,;{}()\n\t=")


def output_names(plan: ViewPlan, columns: Mapping[TableName, Sequence[str]]) -> list[str] | None:
    """The view's output column names, or None when only Spark can tell."""
    schema: dict[str, dict[str, dict[str, str]]] = {}
    for table in plan.tables:
        if table not in columns:
            return None
        schema.setdefault(table.schema, {})[table.name] = {c: "string" for c in columns[table]}
    try:
        tree = sqlglot.parse_one(plan.sql, read=DIALECT)
        if not isinstance(tree, exp.Query):
            return None
        # an unnamed expression: Spark makes up its name (count(1)), sqlglot another (_col_0)
        if any(not isinstance(e, exp.Alias | exp.Column | exp.Star) for e in tree.selects):
            return None
        qualified = qualify(  # dict(): sqlglot types its schema dict[str, object]
            tree, schema=dict(schema), dialect=DIALECT, validate_qualify_columns=True, quote_identifiers=False
        )
        return [e.alias_or_name for e in qualified.selects]
    except (SqlglotError, KeyError, ValueError):  # not resolved (or not understood): Spark decides
        return None


def check_names(plan: ViewPlan, names: Sequence[str]) -> None:
    """UsageError when a column is output twice, has no plain name, or a key column is not output."""
    seen: dict[str, str] = {}
    for name in names:
        if name.lower() in seen:
            raise UsageError(
                f"view {plan.name}: it outputs the column {name} twice",
                "give each output column its own name with AS",
            )
        seen[name.lower()] = name
        if set(name) & NOT_IN_NAMES:
            raise UsageError(
                f"view {plan.name}: its output column {name!r} has no plain name (followers name fields by it)",
                f"name it with AS, e.g. {name} AS {_suggest(name)}",
            )
    for k in plan.key:
        if k.lower() not in seen:
            raise UsageError(
                f"view {plan.name}: key column {k!r} is not a column of the view (it outputs {', '.join(names)})",
                "name output columns in `key`, or add the column to the SELECT list",
            )


def _suggest(name: str) -> str:
    plain = "".join(ch if ch.isalnum() else "_" for ch in name.lower()).strip("_")
    while "__" in plain:
        plain = plain.replace("__", "_")
    return plain or "value"
