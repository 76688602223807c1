"""A derived view's plan and its rewrites, pure sqlglot (Spark dialect), no Spark, no I/O: what
pipelines/views/sql.py's `analyse` found (the tables read, the key's anchor, incremental or full and
why), `render` (the view's SQL over temp views) and `keys_sql` (the view keys a set of changed base rows
touches).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlglot import exp

from cdc.ground.tables import TableName
from cdc.ground.tables import spark_ident as q

DIALECT = "spark"
INCREMENTAL, FULL = "incremental", "full"


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
