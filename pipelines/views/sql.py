"""A derived view's SQL, analysed (README "Derived views"): pure sqlglot (Spark dialect), no Spark, no I/O.

`analyse(view, captured)` finds the captured tables the view reads, traces its key columns to one
table's columns (the anchor), decides whether the view can be maintained incrementally (and if not,
names the construct), and gives the rewrites the view stage needs: `render` (the SQL over temp
views) and `keys_sql` (the view keys a set of changed base rows touches).

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
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError

from cdc.ground.config import VIEW_SCHEMA, ViewConfig
from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName
from cdc.ground.tables import spark_ident as q

__all__ = ["VIEW_SCHEMA", "ViewPlan", "analyse"]

DIALECT = "spark"
INCREMENTAL, FULL = "incremental", "full"
# Aggregates a group recomputed from its rows gives exactly (the ones the issue names)
_AGGREGATES = (exp.Count, exp.Sum, exp.Min, exp.Max, exp.Avg)
# Functions whose value changes without any base row changing: only a full recomputation follows them
_VOLATILE = (exp.Rand, exp.Randn, exp.CurrentTimestamp, exp.CurrentDate, exp.CurrentTime, exp.Uuid)
_VOLATILE_NAMES = {"now", "random", "uuid", "rand", "randn", "shuffle", "current_timestamp", "localtimestamp"}
_SQL_FIX = (
    "write one Spark SQL SELECT over the captured tables, named schema.table (quote odd names with backticks)"
)


@dataclass(frozen=True)
class _Occ:
    """One table in the view's FROM/JOIN list."""

    table: TableName
    alias: str  # what columns are qualified with in the rewritten SQL
    optional: bool  # the right side of a LEFT join: its columns may be NULL


@dataclass(frozen=True)
class _Conjunct:
    expr: exp.Expr  # columns qualified with occurrence aliases
    occs: frozenset[int]
    edge: tuple[int, int] | None  # an equality between columns of two occurrences


@dataclass(frozen=True)
class ViewPlan:
    name: str
    sql: str
    key: tuple[str, ...]
    tables: tuple[TableName, ...]  # captured tables it reads, in order of appearance
    mode: str  # "incremental" | "full"
    reason: str  # why "full" (a sentence naming the construct); "" when incremental
    aggregate: bool  # a GROUP BY view: key = the group columns
    anchor: TableName | None  # the table the key (group) columns come from (incremental only)
    anchor_columns: tuple[str, ...]  # per key column, the anchor table's column it is
    fingerprint: str  # sha256 of normalised SQL + key: changed -> the view is rebuilt
    # the parsed view and what keys_sql needs (incremental only)
    _tree: exp.Expr = field(repr=False, compare=False)
    _occs: tuple[_Occ, ...] = field(default=(), repr=False, compare=False)
    _anchor_occ: int = field(default=-1, repr=False, compare=False)
    _conjuncts: tuple[_Conjunct, ...] = field(default=(), repr=False, compare=False)
    _key_exprs: tuple[exp.Expr, ...] = field(default=(), repr=False, compare=False)

    @property
    def incremental(self) -> bool:
        return self.mode == INCREMENTAL

    def describe(self) -> str:
        """`view X: incremental` / `view X: full recomputation each cut: <reason>` (validate, apply)."""
        if self.incremental:
            return f"view {self.name}: incremental"
        return f"view {self.name}: full recomputation each cut: {self.reason}"

    def render(self, sources: Mapping[TableName, str]) -> str:
        """The view's SQL with each captured table replaced by the named (temp) view; table aliases
        and column qualifiers keep working."""
        return self._rendered(sources).sql(dialect=DIALECT)

    def _rendered(self, sources: Mapping[TableName, str]) -> exp.Expr:
        tree = self._tree.copy()
        for node, table in _table_nodes(tree, self.tables):
            node.replace(_source(sources, table, node.alias or node.name))
        _drop_db_qualifiers(tree)
        return tree

    def keys_sql(
        self,
        sources: Mapping[TableName, str],
        changed: TableName | None = None,
        changed_rows: str | None = None,
    ) -> str:
        """SELECT DISTINCT <key expressions AS key names> of the view's rows (no grouping).

        Without `changed`: the view's FROM/JOIN/WHERE over `sources` (give a table's changed rows as
        its source to get the keys they touch). With `changed` (incremental views), cheaper and
        still every touched key: for the anchor table, its changed rows' anchor columns directly;
        for another table, only the equi-join path from it to the anchor, as INNER joins (a LEFT
        join kept would keep every anchor row), with the join conditions on that path. Its changed
        rows are `changed_rows` when given (a self-join's other occurrences read sources[changed]),
        else sources[changed]."""
        keys = ", ".join(f"{q(k)}" for k in self.key)
        if not self.incremental:
            return f"SELECT DISTINCT {keys} FROM ({self.render(sources)}) AS _v"
        if changed is None:
            return self._keys_all(sources)
        if changed not in self.tables:
            raise ValueError(f"view {self.name} does not read {changed}")
        rows = changed_rows or _table_sql(sources, changed)
        parts = [self._keys_from(i, sources, rows) for i, o in enumerate(self._occs) if o.table == changed]
        return "\nUNION\n".join(parts)

    # -- keys_sql ----------------------------------------------------------------------------------
    def _key_list(self) -> str:
        return ", ".join(
            f"{e.sql(dialect=DIALECT)} AS {q(k)}" for e, k in zip(self._key_exprs, self.key, strict=True)
        )

    def _keys_all(self, sources: Mapping[TableName, str]) -> str:
        tree = self._rendered(sources)
        for arg in (
            "group",
            "having",
            "order",
            "limit",
            "offset",
            "qualify",
            "sort",
            "cluster",
            "distribute",
        ):
            tree.set(arg, None)
        keys = [exp.alias_(e.copy(), k, quoted=True) for e, k in zip(self._key_exprs, self.key, strict=True)]
        tree.set("expressions", keys)
        tree.set("distinct", exp.Distinct())
        return tree.sql(dialect=DIALECT)

    def _keys_from(self, start: int, sources: Mapping[TableName, str], rows: str) -> str:
        path = self._path(start)
        names = [rows if i == start else _table_sql(sources, self._occs[i].table) for i in path]
        joined: set[int] = {start}
        frm = [f"FROM {names[0]} AS {q(self._occs[start].alias)}"]
        on_start = [c for c in self._conjuncts if c.occs == frozenset({start})]
        for pos, i in enumerate(path[1:], 1):
            joined.add(i)
            on = [c.expr.sql(dialect=DIALECT) for c in self._conjuncts if i in c.occs and c.occs <= joined]
            frm.append(f"JOIN {names[pos]} AS {q(self._occs[i].alias)} ON {' AND '.join(on) or 'TRUE'}")
        tail = f" WHERE {' AND '.join(c.expr.sql(dialect=DIALECT) for c in on_start)}" if on_start else ""
        return f"SELECT DISTINCT {self._key_list()} {' '.join(frm)}{tail}"

    def _path(self, start: int) -> list[int]:
        """The occurrences from `start` to the anchor along equi-join conditions (shortest)."""
        before: dict[int, int] = {start: start}
        todo = deque([start])
        while todo:
            i = todo.popleft()
            if i == self._anchor_occ:
                path = [i]
                while path[-1] != start:
                    path.append(before[path[-1]])
                return path[::-1]
            for c in self._conjuncts:
                if c.edge and i in c.edge:
                    j = c.edge[1] if c.edge[0] == i else c.edge[0]
                    if j not in before:
                        before[j] = i
                        todo.append(j)
        raise AssertionError(f"view {self.name}: no join path from {self._occs[start].table} to its anchor")


def _table_sql(sources: Mapping[TableName, str], table: TableName) -> str:
    try:
        name = sources[table]
    except KeyError:
        raise ValueError(f"no source given for {table}") from None
    return exp.to_table(name, dialect=DIALECT).sql(dialect=DIALECT)


def _source(sources: Mapping[TableName, str], table: TableName, alias: str) -> exp.Table:
    node = exp.to_table(_table_sql(sources, table), dialect=DIALECT)
    node.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
    return node


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


def _fail(view: ViewConfig, problem: str, fix: str) -> UsageError:
    return UsageError(f"view {view.name}: {problem}", fix)


def _parse(view: ViewConfig) -> exp.Expr:
    try:
        statements = [s for s in sqlglot.parse(view.sql, read=DIALECT) if s is not None]
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        where = f" at line {first['line']}, column {first['col']}" if first.get("line") else ""
        what = first.get("description") or str(exc).splitlines()[0]
        raise _fail(view, f"its SQL does not parse{where}: {what}", _SQL_FIX) from None
    except SqlglotError as exc:
        raise _fail(view, f"its SQL does not parse: {str(exc).splitlines()[0]}", _SQL_FIX) from None
    if len(statements) != 1:
        raise _fail(view, f"its SQL holds {len(statements)} statements", "give one SELECT per view")
    tree = statements[0]
    while isinstance(tree, exp.Subquery) and not tree.alias:
        tree = tree.this  # (SELECT ...) as a whole
    if not isinstance(tree, exp.Query):
        raise _fail(view, f"its SQL is a {tree.key.upper()} statement, not a query", _SQL_FIX)
    return tree


def _fold(ident: exp.Expr | None) -> str:
    """An identifier as PostgreSQL names it: unquoted ones fold to lower case."""
    if ident is None:
        return ""
    return ident.name if isinstance(ident, exp.Identifier) and ident.quoted else ident.name.lower()


def _table_nodes(tree: exp.Expr, tables: Sequence[TableName]) -> list[tuple[exp.Table, TableName]]:
    """The Table nodes naming captured tables (not CTE names), paired with the table, in order."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    by_lower = {(t.schema.lower(), t.name.lower()): t for t in tables}
    found = []
    for node in tree.find_all(exp.Table):
        if not node.args.get("db") and node.name.lower() in ctes:
            continue
        key = (_fold(node.args.get("db")), _fold(node.this))
        table = TableName(*key)
        if table not in tables:
            table = by_lower.get((key[0].lower(), key[1].lower()), table)
        if table in tables:
            found.append((node, table))
    return found


def _drop_db_qualifiers(tree: exp.Expr) -> None:
    """`public.orders.id` -> `orders.id`: the table is renamed, its alias (the table name) stays."""
    for col in tree.find_all(exp.Column):
        if col.args.get("db") is not None:
            col.set("db", None)
            col.set("catalog", None)


def _conjuncts(condition: exp.Expr | None) -> list[exp.Expr]:
    if condition is None:
        return []
    return list(condition.flatten()) if isinstance(condition, exp.And) else [condition]


def _output(e: exp.Expr) -> str | None:
    if isinstance(e, exp.Alias):
        return e.alias
    if isinstance(e, exp.Column) and not isinstance(e.this, exp.Star):
        return e.name
    return None


def _is_star(e: exp.Expr) -> bool:
    return isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))


class _Analysis:
    def __init__(
        self, view: ViewConfig, captured: list[TableName], columns: Mapping[TableName, Sequence[str]] | None
    ):
        self.view = view
        self.captured = captured
        self.columns = columns
        self.tree = _parse(view)
        self.occs: list[_Occ] = []

    def fail(self, problem: str, fix: str) -> UsageError:
        return _fail(self.view, problem, fix)

    # -- tables ------------------------------------------------------------------------------------
    def tables(self) -> list[TableName]:
        ctes = {c.alias_or_name.lower() for c in self.tree.find_all(exp.CTE)}
        found: list[TableName] = []
        for node in self.tree.find_all(exp.Table):
            if not isinstance(node.this, exp.Identifier):
                continue  # a table function such as range(10): no captured table (full below)
            if not node.args.get("db") and node.name.lower() in ctes:
                continue
            table = self.table_of(node)
            if table not in found:
                found.append(table)
        if not found:
            raise self.fail(
                "its SQL reads no table",
                "read the captured tables by name, e.g. SELECT ... FROM public.orders",
            )
        return found

    def table_of(self, node: exp.Table) -> TableName:
        written = node.sql(dialect=DIALECT).split(" AS ")[0]
        if node.args.get("catalog") is not None or not node.args.get("db"):
            same_name = [t for t in self.captured if t.name.lower() == node.name.lower()]
            example = (same_name or self.captured or [TableName("public", node.name)])[0]
            raise self.fail(
                f"it reads {written}, which is not a schema.table name",
                f"name the tables as in source.postgres.tables, schema.table (e.g. {example})",
            )
        table = TableName(_fold(node.args["db"]), _fold(node.this))
        if table in self.captured:
            return table
        same = [
            t
            for t in self.captured
            if (t.schema.lower(), t.name.lower()) == (table.schema.lower(), table.name.lower())
        ]
        if len(same) == 1:
            return same[0]  # Spark resolves names without regard to case
        if table.schema == VIEW_SCHEMA:
            raise self.fail(
                f"it reads {table}, another derived view: a view reads captured tables only",
                "write the other view's SQL into this one",
            )
        close = difflib.get_close_matches(str(table), [str(t) for t in self.captured], n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise self.fail(
            f"it reads {table}, which the pipeline does not capture{hint}",
            f"add {table} to source.postgres.tables, or correct the name in the view's SQL",
        )

    # -- plan --------------------------------------------------------------------------------------
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

    # -- aggregates --------------------------------------------------------------------------------
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

    # -- what cannot be maintained incrementally ---------------------------------------------------
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

    def occurrences(self, select: exp.Select) -> list[_Occ]:
        occs: list[_Occ] = []
        holders = [select.args["from_"]] + (select.args.get("joins") or [])
        aliases: set[str] = set()
        for holder in holders:
            node = holder.this
            table = self.table_of(node)
            alias = node.alias or node.name
            if alias.lower() in aliases:
                raise self.fail(
                    f"two tables of its FROM/JOIN are both called {alias}",
                    "give each table its own alias (FROM public.orders o JOIN sales.orders s ...)",
                )
            aliases.add(alias.lower())
            optional = isinstance(holder, exp.Join) and holder.side.upper() == "LEFT"
            occs.append(_Occ(table, alias, optional))
        return occs

    def joins_reason(self, select: exp.Select) -> str:
        """Why the joins cannot be maintained incrementally, or ""; fills self.conjunct_list."""
        self.conjunct_list: list[_Conjunct] = []
        for i, join in enumerate(select.args.get("joins") or [], 1):
            table = self.occs[i].table
            side, kind, method = join.side.upper(), join.kind.upper(), join.method.upper()
            if method == "NATURAL":
                return f"NATURAL JOIN of {table} (write JOIN ... ON)"
            if side in ("RIGHT", "FULL"):
                return f"{side} OUTER JOIN of {table}"
            if kind in ("SEMI", "ANTI"):
                return f"LEFT {kind} JOIN of {table}"
            using = join.args.get("using")
            if using:
                for ident in using:
                    left = self.using_side(ident.name, i)
                    expr = exp.EQ(
                        this=exp.column(ident.name, table=self.occs[left].alias),
                        expression=exp.column(ident.name, table=self.occs[i].alias),
                    )
                    self.conjunct_list.append(_Conjunct(expr, frozenset({left, i}), (left, i)))
                continue
            if kind == "CROSS" or join.args.get("on") is None:
                return f"a join of {table} without ON (CROSS JOIN or FROM a, b: write JOIN ... ON)"
            edges = 0
            for conjunct in _conjuncts(join.args["on"]):
                c = self.conjunct(conjunct)
                self.conjunct_list.append(c)
                edges += bool(c.edge and i in c.edge)
            if not edges:
                return f"the join of {table}: its ON has no equality between its columns and another table's (a non-equi join)"
        return ""

    def using_side(self, name: str, right: int) -> int:
        """The earlier table a USING column joins to."""
        if right == 1 or self.columns is None:
            if right == 1:
                return 0
            raise self.fail(
                f"JOIN ... USING ({name}) after several tables: which one holds {name} cannot be told",
                f"write JOIN ... ON with qualified columns (a.{name} = b.{name})",
            )
        having = [i for i in range(right) if self.has_column(i, name)]
        if not having:
            raise self.fail(
                f"JOIN ... USING ({name}): no table before it has a column {name}", "correct the column name"
            )
        return having[0]

    def has_column(self, i: int, name: str) -> bool:
        cols = (self.columns or {}).get(self.occs[i].table, ())
        return any(c.lower() == name.lower() for c in cols)

    def conjunct(self, expr: exp.Expr) -> _Conjunct:
        qualified = _qualified(expr, self)
        occs = frozenset(self.resolve(c)[0] for c in expr.find_all(exp.Column))
        edge = None
        if (
            isinstance(expr, exp.EQ)
            and isinstance(expr.this, exp.Column)
            and isinstance(expr.expression, exp.Column)
        ):
            a, b = self.resolve(expr.this)[0], self.resolve(expr.expression)[0]
            edge = (a, b) if a != b else None
        return _Conjunct(qualified, occs, edge)

    # -- columns -----------------------------------------------------------------------------------
    def resolve(self, col: exp.Column) -> tuple[int, str]:
        """(occurrence, the table's column name) of a column reference in the FROM/JOIN scope."""
        qualifier, db = col.table, col.args.get("db")
        if qualifier:
            for i, occ in enumerate(self.occs):
                if db is not None:
                    if (occ.table.schema.lower(), occ.table.name.lower()) == (
                        db.name.lower(),
                        qualifier.lower(),
                    ):
                        return i, self.real_name(i, col)
                elif occ.alias.lower() == qualifier.lower():
                    return i, self.real_name(i, col)
            raise self.fail(
                f"{col.sql(dialect=DIALECT)}: no table of its FROM/JOIN is called {qualifier}",
                f"qualify columns with a table alias of the FROM/JOIN list ({', '.join(o.alias for o in self.occs)})",
            )
        if len(self.occs) == 1:
            return 0, self.real_name(0, col)
        if self.columns is None:
            raise self.fail(
                f"column {col.name} is not qualified and the view reads several tables",
                f"qualify it with its table's alias ({', '.join(o.alias + '.' + col.name for o in self.occs)})",
            )
        having = [i for i in range(len(self.occs)) if self.has_column(i, col.name)]
        using = self.using_names()
        if len(having) > 1 and col.name.lower() in using:
            having = having[:1]  # JOIN ... USING: the column is the first table's
        if len(having) != 1:
            where = "no table it reads has it" if not having else "several tables it reads have it"
            raise self.fail(
                f"column {col.name}: {where}",
                f"qualify it with its table's alias ({', '.join(o.alias + '.' + col.name for o in self.occs)})",
            )
        return having[0], self.real_name(having[0], col)

    def using_names(self) -> set[str]:
        tree = self.tree
        return {i.name.lower() for j in (tree.args.get("joins") or []) for i in (j.args.get("using") or [])}

    def real_name(self, i: int, col: exp.Column) -> str:
        written = _fold(col.this)
        if self.columns is None or self.occs[i].table not in self.columns:
            return written
        cols = list(self.columns[self.occs[i].table])
        if written in cols:
            return written
        same = [c for c in cols if c.lower() == written.lower()]
        if len(same) == 1:
            return same[0]
        raise self.fail(
            f"{col.sql(dialect=DIALECT)}: {self.occs[i].table} has no column {written}",
            f"correct the column name (its columns: {', '.join(cols)})",
        )

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


def _qualified(expr: exp.Expr, analysis: _Analysis) -> exp.Expr:
    """A copy of `expr` with every column qualified by its occurrence's alias."""
    copy = expr.copy()
    for col in list(copy.find_all(exp.Column)):
        if isinstance(col.this, exp.Star):
            continue
        i, name = analysis.resolve(col)
        col.replace(exp.column(name, table=analysis.occs[i].alias, quoted=True))
    return copy


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
