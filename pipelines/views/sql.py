"""A derived view's SQL, analysed (docs/derived-views.md): pure sqlglot (Spark dialect), no Spark, no I/O.

`analyse(view, captured)` finds the captured tables the view reads, traces its key columns to one
table's columns (the anchor), decides whether the view can be maintained incrementally (and if not,
names the construct), and gives the plan with the rewrites the view stage needs (plan.py: `render`,
the SQL over temp views, and `keys_sql`, the view keys a set of changed base rows touches). The
FROM/JOIN scope it walks (tables, aliases, joins, columns) is scope.py's.

Incremental: one SELECT block of projections, WHERE filters, INNER and LEFT equi-joins of tables,
optionally GROUP BY with count/sum/min/max/avg (HAVING allowed), key columns traced to one table's
columns (for a LEFT join, its preserved side). A changed base row can then only change the view rows
whose key is the anchor columns' values of the rows it joins with, so a cut recomputes only those
keys. Anything else is recomputed in full each cut, with the reason.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence

from sqlglot import exp

from cdc.ground.config import ViewConfig
from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName
from pipelines.views.plan import DIALECT, FULL, INCREMENTAL, ViewPlan
from pipelines.views.scope import ViewScope

__all__ = ["analyse"]

# Aggregates a group recomputed from its rows gives exactly (the ones the issue names)
_AGGREGATES = (exp.Count, exp.Sum, exp.Min, exp.Max, exp.Avg)
# Functions whose value changes without any base row changing: only a full recomputation follows them
_VOLATILE = (exp.Rand, exp.Randn, exp.CurrentTimestamp, exp.CurrentDate, exp.CurrentTime, exp.Uuid)
_VOLATILE_NAMES = {"now", "random", "uuid", "rand", "randn", "shuffle", "current_timestamp", "localtimestamp"}


# ---- analysis ------------------------------------------------------------------------------------
def analyse(
    view: ViewConfig,
    captured: Iterable[TableName],
    columns: Mapping[TableName, Sequence[str]] | None = None,
) -> ViewPlan:
    """The plan of one view. `columns` (each captured table's column names) resolves unqualified
    columns of a view that reads several tables and `*`; without it such a column must be written
    qualified (o.id). Raises UsageError (exit 2) naming the view when it cannot work at all."""
    return _Analysis(view, list(captured), columns).plan()


def _output(e: exp.Expr) -> str | None:
    if isinstance(e, exp.Alias):
        return e.alias
    if isinstance(e, exp.Column) and not isinstance(e.this, exp.Star):
        return e.name
    return None


def _is_star(e: exp.Expr) -> bool:
    return isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))


class _Analysis(ViewScope):
    def plan(self) -> ViewPlan:
        view, tree = self.view, self.tree
        tables = self.tables()
        outer = tree
        while isinstance(outer, exp.SetOperation):
            outer = outer.this
        while isinstance(outer, exp.Subquery):
            outer = outer.this
        names = self.outputs(outer) if isinstance(outer, exp.Select) else None
        if names is not None:
            self.check_key_output(names)
        aggregate = isinstance(outer, exp.Select) and self.is_aggregate(outer)
        if aggregate and isinstance(outer, exp.Select) and outer.args.get("group") is not None:
            self.check_group_key(outer)
        reason = self.full_reason()
        base = dict(
            name=view.name,
            sql=view.sql,
            key=tuple(view.key),
            tables=tuple(tables),
            aggregate=aggregate,
            fingerprint=fingerprint(tree, view.key),
            _tree=tree,
        )
        if not reason:
            assert isinstance(tree, exp.Select)
            self.occs = self.occurrences(tree)
            reason = self.joins_reason(tree)
            if not reason:
                lineage = self.lineage(tree)
                if isinstance(lineage, str):
                    reason = lineage
                else:
                    anchor_occ, anchor_columns, key_exprs = lineage
                    return ViewPlan(
                        mode=INCREMENTAL,
                        reason="",
                        anchor=self.occs[anchor_occ].table,
                        anchor_columns=tuple(anchor_columns),
                        _occs=tuple(self.occs),
                        _anchor_occ=anchor_occ,
                        _conjuncts=tuple(self.conjunct_list),
                        _key_exprs=tuple(key_exprs),
                        **base,  # type: ignore[arg-type]
                    )
        return ViewPlan(mode=FULL, reason=reason, anchor=None, anchor_columns=(), **base)  # type: ignore[arg-type]

    def outputs(self, select: exp.Select) -> list[str] | None:
        """The output column names, or None when a `*` hides them and `columns` was not given."""
        names: list[str] = []
        for e in select.expressions:
            if _is_star(e):
                expanded = self.star_columns(select, e)
                if expanded is None:
                    return None
                names += expanded
            else:
                names.append(_output(e) or e.sql(dialect=DIALECT))
        return names

    def star_columns(self, select: exp.Select, star: exp.Expr) -> list[str] | None:
        if self.columns is None:
            return None
        tables = [n for n in [select.args.get("from_")] + (select.args.get("joins") or []) if n is not None]
        names: list[str] = []
        qualifier = star.table.lower() if isinstance(star, exp.Column) else ""
        for holder in tables:
            node = holder.this
            if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
                return None
            if qualifier and (node.alias or node.name).lower() != qualifier:
                continue
            try:
                table = self.table_of(node)
            except UsageError:
                return None  # a CTE or subquery: Spark knows, view_schema checks
            names += list(self.columns.get(table, ()))
        return names

    def check_key_output(self, names: list[str]) -> None:
        lower = [n.lower() for n in names]
        for k in self.view.key:
            count = lower.count(k.lower())
            if count == 0:
                close = difflib.get_close_matches(k, names, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.fail(
                    f"key column {k!r} is not a column of the view (it outputs {', '.join(names)}){hint}",
                    "name output columns in `key`, or add the column to the SELECT list (with AS to name it)",
                )
            if count > 1:
                raise self.fail(
                    f"key column {k!r} is output {count} times",
                    "give each output column its own name with AS, and name one of them in `key`",
                )

    def is_aggregate(self, select: exp.Select) -> bool:
        if select.args.get("group") is not None:
            return True
        return any(
            not agg.find_ancestor(exp.Window) for e in select.expressions for agg in e.find_all(exp.AggFunc)
        )

    def projection_of(self, select: exp.Select, e: exp.Expr) -> exp.Expr | None:
        """The SELECT item a GROUP BY expression is (by ordinal, alias or the same expression)."""
        items = select.expressions
        if isinstance(e, exp.Literal) and not e.is_string and e.name.isdigit():
            n = int(e.name)
            return items[n - 1] if 1 <= n <= len(items) else None
        text = _bare(e)
        for item in items:
            inner = item.this if isinstance(item, exp.Alias) else item
            if _bare(inner) == text:
                return item
        if isinstance(e, exp.Column) and not e.table:
            for item in items:
                if isinstance(item, exp.Alias) and item.alias.lower() == e.name.lower():
                    return item
        return None

    def check_group_key(self, select: exp.Select) -> None:
        group = select.args["group"]
        grouped: list[str] = []
        for e in group.expressions:
            if isinstance(e, exp.Rollup | exp.Cube | exp.GroupingSets):
                return  # full below; the key cannot be checked against grouping sets
            item = self.projection_of(select, e)
            if item is None:
                raise self.fail(
                    f"it groups by {e.sql(dialect=DIALECT)}, which is not among its output columns, so no key "
                    "identifies its rows",
                    f"output every GROUP BY column and make `key` exactly those columns ({', '.join(self.view.key)} now)",
                )
            grouped.append(_output(item) or item.sql(dialect=DIALECT))
        if {g.lower() for g in grouped} != {k.lower() for k in self.view.key}:
            raise self.fail(
                f"its key ({', '.join(self.view.key)}) is not its GROUP BY columns ({', '.join(grouped)}): "
                "one row per group, so only the group columns identify a row",
                f"set key: [{', '.join(grouped)}]",
            )

    def full_reason(self) -> str:
        tree = self.tree
        if isinstance(tree, exp.SetOperation):
            return f"{tree.key.upper()} (the view is not one SELECT block)"
        if not isinstance(tree, exp.Select):
            return f"{tree.key.upper()} (the view is not one SELECT block)"
        if tree.args.get("with_") is not None:
            return "WITH (a common table expression)"
        if tree.args.get("distinct") is not None:
            return "SELECT DISTINCT"
        if any(s is not tree for s in tree.find_all(exp.Select)) or tree.find(exp.Subquery) is not None:
            return "a subquery"
        if tree.find(exp.Window) is not None:
            return "a window function (OVER ...)"
        if tree.args.get("limit") is not None or tree.args.get("offset") is not None:
            return "LIMIT/OFFSET (which rows are kept depends on every row)"
        if tree.args.get("laterals") or tree.find(exp.Lateral) is not None:
            return "LATERAL VIEW"
        if tree.find(exp.Pivot) is not None:
            return "PIVOT"
        if tree.find(exp.TableSample) is not None:
            return "TABLESAMPLE"
        for gen in tree.find_all(exp.Explode, exp.Inline, exp.UDTF):
            return f"a generator function ({gen.sql(dialect=DIALECT)})"
        frm = tree.args.get("from_")
        if (
            frm is None
            or not isinstance(frm.this, exp.Table)
            or not isinstance(frm.this.this, exp.Identifier)
        ):
            return "FROM something other than a captured table"
        for func in tree.find_all(exp.Func):
            if isinstance(func, _VOLATILE) or (
                isinstance(func, exp.Anonymous) and func.name.lower() in _VOLATILE_NAMES
            ):
                return f"a function whose value changes by itself ({func.sql(dialect=DIALECT)})"
        group = tree.args.get("group")
        if group is not None and (
            group.args.get("grouping_sets")
            or group.args.get("rollup")
            or group.args.get("cube")
            or any(isinstance(e, exp.Rollup | exp.Cube | exp.GroupingSets) for e in group.expressions)
        ):
            return "GROUPING SETS/ROLLUP/CUBE"
        for agg in tree.find_all(exp.AggFunc):
            if not isinstance(agg, _AGGREGATES):
                return f"the aggregate {agg.sql(dialect=DIALECT)} (incremental: count, sum, min, max, avg)"
        if self.is_aggregate(tree) and group is None:
            return "an aggregate without GROUP BY (one row over whole tables)"
        return ""

    def lineage(self, select: exp.Select) -> tuple[int, list[str], list[exp.Expr]] | str:
        """(anchor occurrence, its column per key column, qualified key expressions), or why not."""
        traced: list[tuple[int, str]] = []
        for k in self.view.key:
            item = self.item_named(select, k)
            if isinstance(item, tuple):
                traced.append(item)
                continue
            inner = item.this if isinstance(item, exp.Alias) else item
            if not isinstance(inner, exp.Column):
                return f"the key column {k} is computed ({inner.sql(dialect=DIALECT)}), not a table's column"
            traced.append(self.resolve(inner))
        occs = {i for i, _ in traced}
        if len(occs) > 1:
            named = ", ".join(
                f"{k} from {self.occs[i].table}" for k, (i, _) in zip(self.view.key, traced, strict=True)
            )
            return f"the key columns come from several tables ({named})"
        anchor = occs.pop()
        if self.occs[anchor].optional:
            raise self.fail(
                f"its key comes from {self.occs[anchor].table}, the optional side of a LEFT JOIN: rows without a "
                "match would have no key",
                f"take the key from the table the LEFT JOIN keeps, or write JOIN instead of LEFT JOIN for {self.occs[anchor].table}",
            )
        alias = self.occs[anchor].alias
        return anchor, [c for _, c in traced], [exp.column(c, table=alias, quoted=True) for _, c in traced]

    def item_named(self, select: exp.Select, key: str) -> exp.Expr | tuple[int, str]:
        for e in select.expressions:
            if _is_star(e):
                continue
            if (_output(e) or "").lower() == key.lower():
                return e
        # from a `*` (check_key_output made sure the view outputs it)
        qualifier = ""
        for e in select.expressions:
            if _is_star(e):
                qualifier = e.table if isinstance(e, exp.Column) else ""
                col = exp.column(key, table=qualifier or None)
                return self.resolve(col)
        raise AssertionError(key)


def _bare(e: exp.Expr) -> str:
    """An expression's SQL without table qualifiers (GROUP BY o.x matches SELECT x)."""
    copy = e.copy()
    for col in copy.find_all(exp.Column):
        col.set("table", None)
        col.set("db", None)
    return copy.sql(dialect=DIALECT, normalize=True)


def fingerprint(tree: exp.Expr, key: Sequence[str]) -> str:
    """sha256 of the normalised SQL (no comments, case-folded unquoted names, one spacing) and key."""
    text = tree.sql(dialect=DIALECT, normalize=True, comments=False)
    return hashlib.sha256(json.dumps([text, list(key)]).encode()).hexdigest()
