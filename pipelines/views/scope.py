"""A derived view's FROM/JOIN scope, for pipelines/views/sql.py's analysis: its SQL parsed (one query,
or a usage error naming the view), the captured tables it reads, its tables' occurrences and aliases, its
join conditions, and each column reference resolved to a table's column.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError

from cdc.ground.config import VIEW_SCHEMA, ViewConfig
from cdc.ground.errors import UsageError
from cdc.ground.tables import TableName
from pipelines.views.plan import DIALECT, _Conjunct, _fold, _Occ

_SQL_FIX = (
    "write one Spark SQL SELECT over the captured tables, named schema.table (quote odd names with backticks)"
)


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


def _conjuncts(condition: exp.Expr | None) -> list[exp.Expr]:
    if condition is None:
        return []
    return list(condition.flatten()) if isinstance(condition, exp.And) else [condition]


class ViewScope:
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


def _qualified(expr: exp.Expr, analysis: ViewScope) -> exp.Expr:
    """A copy of `expr` with every column qualified by its occurrence's alias."""
    copy = expr.copy()
    for col in list(copy.find_all(exp.Column)):
        if isinstance(col.this, exp.Star):
            continue
        i, name = analysis.resolve(col)
        col.replace(exp.column(name, table=analysis.occs[i].alias, quoted=True))
    return copy
