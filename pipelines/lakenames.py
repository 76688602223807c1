"""How `cdc sql` names a follower's tables (docs/reading-the-lake.md), in both engines.

Every table answers to its source name, qualified or not, with PostgreSQL's rules: `public.orders`,
`orders`, `"Sales"."Order Items"` (unquoted names fold to lower case, quoted ones keep capitals and
spaces). A bare name is the table's name when one schema has it; when two schemas share a name the
bare name is `schema_table` (`sales_orders`), as before qualified names were accepted; a bare
name no such alias has is looked up in `public`, PostgreSQL's default schema.

DataFusion (the default engine) is given each table under its qualified name, so its own SQL
resolves them. Spark's temp views have one-part names, so for Spark the query is rewritten
(sqlglot, Spark dialect, where quoted names take backticks): each table reference becomes a view.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from cdc.ground.tables import TableName


class EngineRefused(Exception):
    """An engine without a JVM (DataFusion, Polars) could not open a table or plan/run the query;
    `missing_table`: the query names a table the follower does not have."""

    def __init__(self, message: str, missing_table: bool = False):
        super().__init__(message)
        self.missing_table = missing_table


def first_line(exc: BaseException) -> str:
    """An engine error in one line of at most 500 characters."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:500]


_PLAIN = re.compile(r"[a-z_][a-z0-9_]*\Z")


def bare_names(tables: Iterable[str]) -> dict[str, str]:
    """{schema.table: its bare name}: the table's name, or schema_table when two schemas share it."""
    parsed = {t: TableName.parse(t) for t in tables}
    counts: dict[str, int] = {}
    for name in parsed.values():
        counts[name.name] = counts.get(name.name, 0) + 1
    return {t: n.name if counts[n.name] == 1 else f"{n.schema}_{n.name}" for t, n in parsed.items()}


def quoted(name: str) -> str:
    """An identifier double-quoted (DataFusion and PostgreSQL): case and spaces kept."""
    return '"' + name.replace('"', '""') + '"'


def datafusion_names(tables: Iterable[str]) -> dict[str, list[str]]:
    """{schema.table: the names DataFusion registers it under}: `"schema"."table"` and, in the
    default schema `public`, its bare name (when that is another name) unless a captured public
    table has that name."""
    tables = sorted(tables)
    parsed = {t: TableName.parse(t) for t in tables}
    public = {n.name for n in parsed.values() if n.schema == "public"}
    out: dict[str, list[str]] = {}
    for t, bare in bare_names(tables).items():
        n = parsed[t]
        names = [f"{quoted(n.schema)}.{quoted(n.name)}"]
        if (n.schema, n.name) != ("public", bare) and bare not in public:
            names.append(f"{quoted('public')}.{quoted(bare)}")
        out[t] = names
    return out


def schemas_of(tables: Iterable[str]) -> list[str]:
    """The schemas DataFusion must have before tables are registered in them."""
    return sorted({TableName.parse(t).schema for t in tables} | {"public"})


def spark_views(tables: Iterable[str]) -> dict[str, str]:
    """{schema.table: its Spark temp view}: the bare name when it is a plain identifier (a query
    Spark runs unchanged finds it), else a hidden name only the rewrite uses."""
    views = {}
    for i, (t, bare) in enumerate(sorted(bare_names(tables).items())):
        views[t] = bare if _PLAIN.match(bare) else f"_cdc_table_{i}"
    return views


def spark_query(query: str, views: Mapping[str, str]) -> str:
    """The query with every reference to a follower table (qualified, quoted with backticks, any
    case) replaced by its temp view. SQL sqlglot cannot parse is returned unchanged: Spark then
    sees bare names only, as before."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    try:
        tree = sqlglot.parse_one(query, read="spark")
    except SqlglotError:
        return query
    if tree is None:
        return query
    by_name = {TableName.parse(t): v for t, v in views.items()}
    bare = dict(zip(bare_names(views).values(), views.values(), strict=True))
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    changed = False
    for node in list(tree.find_all(exp.Table)):
        if node.args.get("catalog") is not None or not node.name:
            continue
        db = node.args.get("db")
        if db is None:
            if node.name.lower() in ctes or node.name in bare.values():
                continue
            # else as PostgreSQL (and DataFusion) resolve it: a table of the default schema public
            view = _match_bare(node.name, bare) or _match(TableName("public", node.name), by_name)
        else:
            view = _match(TableName(db.name, node.name), by_name)
        if view is None:
            continue
        alias = node.alias or (node.name if _PLAIN.match(node.name.lower()) else "")
        new = exp.Table(this=exp.to_identifier(view))
        if alias:
            new.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
        node.replace(new)
        changed = True
    if not changed:
        return query
    for col in tree.find_all(exp.Column):  # `public.orders.id` -> `orders.id` (the alias)
        if col.args.get("db") is not None:
            col.set("db", None)
            col.set("catalog", None)
    return tree.sql(dialect="spark")


def _match(name: TableName, by_name: Mapping[TableName, str]) -> str | None:
    """Spark resolves names without regard to case: exact first, else the one case-blind match."""
    if name in by_name:
        return by_name[name]
    same = [
        v
        for t, v in by_name.items()
        if (t.schema.lower(), t.name.lower()) == (name.schema.lower(), name.name.lower())
    ]
    return same[0] if len(same) == 1 else None


def _match_bare(name: str, bare: Mapping[str, str]) -> str | None:
    if name in bare:
        return bare[name]
    same = [v for b, v in bare.items() if b.lower() == name.lower()]
    return same[0] if len(same) == 1 else None
