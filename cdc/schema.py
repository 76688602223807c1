"""Building a table's log schema (columns, key, resolved types) from the source catalog."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from cdc.log.base import Column, TableSchema
from cdc.pgtypes import PgType, resolve_types


def pgtype_to_dict(t: PgType) -> dict[str, Any]:
    return dataclasses.asdict(t)


def pgtype_from_dict(d: Mapping[str, Any]) -> PgType:
    element = d.get("element")
    return PgType(**{**d, "element": pgtype_from_dict(element) if element else None})


class TypeCache:
    """Resolved PgType descriptors by oid, queried from the source once per new oid."""

    def __init__(self) -> None:
        self._types: dict[int, PgType] = {}

    def resolve(self, conn, oids: Iterable[int]) -> dict[int, PgType]:
        missing = {o for o in oids if o not in self._types}
        if missing:
            self._types.update(resolve_types(conn, missing))
        return {o: self._types[o] for o in oids}


def build_schema(
    conn,
    columns: Iterable[tuple[str, int, int]],
    key: Iterable[str],
    types: TypeCache,
    extras: Mapping[str, tuple[int, str | None]] | None = None,
) -> TableSchema:
    """Schema from (name, type oid, typmod) columns; `extras` gives (array dims, missing value) by name."""
    more = extras or {}
    cols = tuple(Column(n, o, m, *more.get(n, (0, None))) for n, o, m in columns)
    resolved = types.resolve(conn, {c.type_oid for c in cols})
    return TableSchema(cols, tuple(key), {oid: pgtype_to_dict(t) for oid, t in resolved.items()})


COLUMN_EXTRAS_SQL = (
    "SELECT a.attname, a.attndims,"
    " CASE WHEN a.atthasmissing THEN (SELECT m FROM unnest(a.attmissingval::text::text[]) m LIMIT 1) END"
    " FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped"
    " AND (a.attndims > 0 OR a.atthasmissing)"
)

# The relations that hold a table's rows: the table itself, or every leaf partition of a
# partitioned table (a partitioned parent has no storage, so no relfilenode and no fast defaults).
LEAVES_SQL = (
    "SELECT c.oid, c.relname, c.relfilenode FROM pg_class c WHERE c.oid IN"
    " (SELECT relid FROM pg_partition_tree(%(oid)s) WHERE isleaf UNION SELECT %(oid)s)"
    " AND c.relkind NOT IN ('p', 'I') ORDER BY c.oid"
)
LEAF_MISSING_SQL = (
    "SELECT a.attrelid, a.attname, (SELECT m FROM unnest(a.attmissingval::text::text[]) m LIMIT 1)"
    " FROM pg_attribute a WHERE a.attrelid = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped AND a.atthasmissing"
)
DIMS_SQL = "SELECT attname, attndims FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND attndims > 0"


@dataclasses.dataclass(frozen=True)
class RelationCatalog:
    """What the catalog says about where a table's rows live, read in one go.

    `extras`: declared array dimensions and fast-default value by column (see build_schema).
    A fast default (ADD COLUMN ... DEFAULT <constant>: pg_attribute.attmissingval) is stored per
    relation with storage, so for a partitioned table it is read from every leaf partition.
    When leaves disagree (a partition attached with its own value) one value per column cannot
    say which rows have which: those columns are in `conflicts` (leaf name -> value) and get no
    value in `extras`; the stream re-bases such a table (cdc/rebase.py).
    `filenodes`: (leaf oid, relfilenode) of every leaf; a change means the rows were rewritten
    (or truncated, or partitions attached/detached) without row-level change events."""

    oid: int
    extras: dict[str, tuple[int, str | None]]
    conflicts: dict[str, dict[str, str | None]]
    filenodes: tuple[tuple[int, int], ...]


def relation_catalog(cur, oid: int) -> RelationCatalog:
    """Read with `cur` (so it also works inside an exported snapshot's transaction)."""
    cur.execute(LEAVES_SQL, {"oid": oid})
    leaves = cur.fetchall()
    names = {leaf_oid: name for leaf_oid, name, _ in leaves}
    values: dict[str, dict[str, str | None]] = {}
    if leaves:
        cur.execute(LEAF_MISSING_SQL, ([leaf_oid for leaf_oid, _, _ in leaves],))
        for leaf_oid, column, value in cur.fetchall():
            values.setdefault(column, {})[names[leaf_oid]] = value
    cur.execute(DIMS_SQL, (oid,))
    extras: dict[str, tuple[int, str | None]] = {name: (dims, None) for name, dims in cur.fetchall()}
    conflicts: dict[str, dict[str, str | None]] = {}
    for column, by_leaf in values.items():
        # Leaves without a value for the column were created after it (their rows hold it).
        distinct = set(by_leaf.values())
        if len(distinct) == 1:
            extras[column] = (extras.get(column, (0, None))[0], distinct.pop())
        else:
            conflicts[column] = by_leaf
    return RelationCatalog(oid, extras, conflicts, tuple((leaf_oid, node) for leaf_oid, _, node in leaves))


def table_oid(cur, table) -> int | None:
    cur.execute(
        "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (table.schema, table.name),
    )
    row = cur.fetchone()
    return row[0] if row else None


def table_catalog(conn, table) -> RelationCatalog | None:
    with conn.cursor() as cur:
        oid = table_oid(cur, table)
        return None if oid is None else relation_catalog(cur, oid)


def generated_columns(conn, oid: int) -> list[str]:
    """Generated columns of a table: PostgreSQL before 18 does not publish them (18 only with the
    publication option publish_generated_columns), and the snapshot leaves them out to match."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped AND attgenerated <> ''"
            " ORDER BY attnum",
            (oid,),
        )
        return [r[0] for r in cur.fetchall()]


def column_extras(conn, table) -> dict[str, tuple[int, str | None]]:
    """Declared array dimensions (int[][] -> 2) and fast-default values, by column name."""
    catalog = table_catalog(conn, table)
    return {} if catalog is None else catalog.extras


def schema_types(schema: TableSchema) -> dict[int, PgType]:
    return {oid: pgtype_from_dict(d) for oid, d in schema.types.items()}


# ---- column identity (attnum) -------------------------------------------------------------------
# Generated columns are left out: pgoutput (PostgreSQL < 18) and the snapshot leave them out too,
# so they must not be candidates for a column of a Relation message.
ATTRIBUTES_SQL = (
    "SELECT attnum, attname, attisdropped FROM pg_attribute WHERE attrelid = %s AND attnum > 0"
    " AND attgenerated = '' ORDER BY attnum"
)


def _consistent(nums: list[int]) -> bool:
    """pgoutput lists columns in attnum order: known attnums must be unique and increasing."""
    known = [n for n in nums if n]
    return len(set(known)) == len(known) and known == sorted(known)


def match_attnums(
    names: list[str], previous: TableSchema | None, catalog: list[tuple[int, str, bool]]
) -> list[int]:
    """The attnum of each column of a Relation message (names in stream order), 0 where unsure.

    The catalog is read now, possibly after more DDL than the message saw (a later rename, drop
    or add), so each name is tried against the log's previous version of the table (the name at an
    earlier point of the stream) and against the live catalog, in the order that gives a
    consistent answer. Columns still unknown take the attnum the order leaves them, when exactly
    one is left: the catalog keeps dropped columns' attnums, and attnums only ever grow."""
    before = {c.name: c.attnum for c in previous.columns if c.attnum} if previous else {}
    live = {name: num for num, name, dropped in catalog if not dropped}
    first = [before.get(n) or live.get(n, 0) for n in names]
    nums = first if _consistent(first) else [live.get(n) or before.get(n, 0) for n in names]
    if not _consistent(nums):
        nums = [live.get(n, 0) for n in names]
        if not _consistent(nums):
            return [0] * len(names)
    nums = _renamed_since(names, nums, previous, live)
    taken = set(nums)
    all_nums = [num for num, _name, _dropped in catalog]
    i = 0
    while i < len(nums):
        if nums[i]:
            i += 1
            continue
        j = i
        while j < len(nums) and not nums[j]:
            j += 1
        low = nums[i - 1] if i else 0
        high = nums[j] if j < len(nums) else 1 << 30
        free = [n for n in all_nums if low < n < high and n not in taken]
        if len(free) == j - i:
            nums[i:j] = free
        i = j
    return nums


def _renamed_since(
    names: list[str], nums: list[int], previous: TableSchema | None, live: dict[str, int]
) -> list[int]:
    """Columns of the previous version whose names the message lacks but whose attnums are live in
    the catalog were renamed (a live column was never dropped, so the message has it). When the
    message's names that neither version nor catalog knows are exactly as many, they are those
    columns, in attnum order (renames keep attnums; columns added since come after them). This
    follows a column renamed again before the stream read its first rename, also when other
    columns were dropped or added around it meanwhile (their dropped attnums leave the order
    ambiguous)."""
    if previous is None:
        return nums
    had = {c.name for c in previous.columns}
    live_nums = set(live.values())
    renamed = sorted(
        c.attnum
        for c in previous.columns
        if c.attnum and c.name not in names and c.attnum in live_nums and c.attnum not in nums
    )
    unknown = [i for i, n in enumerate(names) if not nums[i] and n not in had]
    if not renamed or len(unknown) != len(renamed):
        return nums
    trial = list(nums)
    for i, num in zip(unknown, renamed, strict=True):
        trial[i] = num
    return trial if _consistent(trial) else nums


def relation_attnums(conn, table, names: list[str], previous: TableSchema | None) -> dict[str, int]:
    """Attnums (name -> attnum, known ones only) for a Relation message of `table` (see match_attnums)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
            (table.schema, table.name),
        )
        row = cur.fetchone()
        if row is None:
            return {}
        cur.execute(ATTRIBUTES_SQL, (row[0],))
        catalog = [(num, name, dropped) for num, name, dropped in cur.fetchall()]
    return {n: a for n, a in zip(names, match_attnums(names, previous, catalog), strict=True) if a}


def with_attnums(schema: TableSchema, attnums: Mapping[str, int]) -> TableSchema:
    cols = tuple(dataclasses.replace(c, attnum=attnums.get(c.name, 0)) for c in schema.columns)
    return dataclasses.replace(schema, columns=cols)
