"""What the feed shows of a table: the columns, masks and name of the sink it names (`--sink`).

Design: the feed has no per-table options of its own; `cdc serve --sink NAME` serves exactly what
that sink gets (its tables, `columns` / `exclude_columns`, `mask`, `rename`), so an application
sees the same shaped rows as the sink's follower. Without --sink, every captured table as the log
holds it. Shaping works on the log's text values before they are typed, like sinks/shaping.py
(which needs Spark); both mask with sinks/masks.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cdc.ground.config import Pipeline, SinkConfig, sink_tables
from cdc.ground.tables import TableName
from cdc.log.base import LogRecord, TableSchema
from cdc.pgoutput import UNCHANGED
from sinks.masks import TEXT_OID, TEXT_TYPE, mask_text


@dataclass
class TableShape:
    table: TableName
    name: str  # the name the feed serves it under: the sink's rename, or schema.table
    columns: list[str] | None = None
    exclude: frozenset[str] = frozenset()
    masks: dict[str, str] | None = None
    mask_key: str | None = None

    def __post_init__(self) -> None:
        self._cache: dict[int, tuple[TableSchema, list[int], list[str | None]]] = {}

    @property
    def identity(self) -> bool:
        return self.columns is None and not self.exclude and not self.masks

    def _plan(self, schema: TableSchema) -> tuple[TableSchema, list[int], list[str | None]]:
        plan = self._cache.get(id(schema))
        if plan is None:
            keep = [
                i
                for i, c in enumerate(schema.columns)
                if c.name in schema.key
                or ((self.columns is None or c.name in self.columns) and c.name not in self.exclude)
            ]
            masks = self.masks or {}
            cols, kinds = [], []
            for i in keep:
                col, kind = schema.columns[i], masks.get(schema.columns[i].name)
                if kind in ("hash", "redact"):
                    col = replace(col, type_oid=TEXT_OID, typmod=-1, ndims=0)
                cols.append(col)
                kinds.append(kind)
            types = dict(schema.types) | {TEXT_OID: TEXT_TYPE}
            plan = self._cache[id(schema)] = (TableSchema(tuple(cols), schema.key, types), keep, kinds)
        return plan

    def _values(self, values: list | None, keep: list[int], kinds: list[str | None]) -> list | None:
        if values is None:
            return None
        out = []
        for i, kind in zip(keep, kinds, strict=True):
            v = values[i]
            out.append(v if kind is None or v is UNCHANGED else mask_text(kind, self.mask_key, v))
        return out

    def apply(self, rec: LogRecord) -> LogRecord:
        if self.identity:
            return rec
        schema, keep, kinds = self._plan(rec.schema)
        return replace(
            rec,
            schema=schema,
            values=self._values(rec.values, keep, kinds),
            before=self._values(rec.before, keep, kinds),
        )


def table_shapes(
    pipeline: Pipeline, sink: SinkConfig | None, tables: list[TableName]
) -> dict[str, TableShape]:
    """{served name: shape} of the tables the feed serves."""
    if sink is None:
        return {str(t): TableShape(t, str(t)) for t in tables}
    shapes = {}
    for t in sink_tables(sink, tables):
        opts = sink.settings.options_for(t)
        if opts is None:
            shapes[str(t)] = TableShape(t, str(t))
            continue
        name = opts.rename or str(t)
        shapes[name] = TableShape(
            t,
            name,
            opts.columns,
            frozenset(opts.exclude_columns or ()),
            dict(opts.mask),
            sink.settings.mask_key,
        )
    return shapes
