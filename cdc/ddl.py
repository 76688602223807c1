"""DDL capture: an event trigger that writes each schema change of a captured table into the WAL.

pgoutput sends no DDL: it sends a table's columns (a Relation message) only before the table's
next row change, which for a quiet table may be never. With the trigger installed (`cdc ddl
install PIPELINE`, by a role that may create event triggers), every `ddl_command_end`,
`table_rewrite` and `sql_drop` of a table the pipeline's publication covers writes a
transactional logical message (`pg_logical_emit_message(true, <prefix>, <json>)`) in the DDL's
own transaction, so the stream (cdc/stream/, which already asks pgoutput for messages) gets the
table's new columns at the DDL's commit position, in order with the rows around it.

The message body (JSON, version 1):
  {"v": 1, "event": "ddl", "tag": "ALTER TABLE", "oid": 16384, "schema": "public", "table": "t",
   "columns": [[attnum, name, type oid, typmod, ndims, not null, default expr, missing, in key], ...],
   "key": ["id"]}
  {"v": 1, "event": "rewrite", "oid": 16384, "reason": 4}      # the table's rows are rewritten
  {"v": 1, "event": "drop", "tag": "DROP TABLE", "oid": 16384, "schema": "public", "table": "t"}
`missing` is the value rows not written since the column was added hold (attmissingval, read
from a leaf partition for a partitioned table), as of the DDL, not as of when the stream reads.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg2 import sql

from cdc.ground.clock import now_ms
from cdc.ground.private import private_dir, private_open
from cdc.log.base import Column

STATE_FILE = "ddl.json"  # under the pipeline's state_dir: the user asked for DDL capture

FORMAT = 1


def prefix(pipeline_name: str) -> str:
    """The logical message prefix of one pipeline's DDL messages (two pipelines on one database
    each install their own trigger and read only their own messages)."""
    return f"cdc_ddl_{pipeline_name}"


def function_name(pipeline_name: str) -> str:
    return f"cdc_ddl_{pipeline_name}"


def trigger_names(pipeline_name: str) -> dict[str, str]:
    """Event -> event trigger name."""
    base = f"cdc_ddl_{pipeline_name}"
    return {"ddl_command_end": f"{base}_end", "table_rewrite": f"{base}_rewrite", "sql_drop": f"{base}_drop"}


# The table's columns as of this point of the DDL's transaction (generated columns left out, as
# pgoutput before 18 and the snapshot leave them out).
_COLUMNS = """
    WITH leaves AS (SELECT relid FROM pg_partition_tree(r.objid) WHERE isleaf UNION SELECT r.objid),
         pk AS (SELECT i.indkey::int2[] AS keynums FROM pg_index i WHERE i.indrelid = r.objid AND i.indisprimary),
         missing AS (SELECT DISTINCT ON (la.attname) la.attname, m
                       FROM pg_attribute la CROSS JOIN LATERAL unnest(la.attmissingval::text::text[]) m
                      WHERE la.attrelid IN (SELECT relid FROM leaves) AND la.atthasmissing)
    SELECT coalesce(json_agg(json_build_array(
             a.attnum, a.attname, a.atttypid, a.atttypmod, a.attndims, a.attnotnull,
             pg_get_expr(d.adbin, d.adrelid), mi.m,
             a.attnum = ANY(coalesce((SELECT keynums FROM pk), '{}'))
           ) ORDER BY a.attnum), '[]'::json),
           (SELECT coalesce(json_agg(ka.attname ORDER BY k.ord), '[]'::json)
              FROM pk CROSS JOIN LATERAL unnest(pk.keynums) WITH ORDINALITY k(n, ord)
              JOIN pg_attribute ka ON ka.attrelid = r.objid AND ka.attnum = k.n)
      FROM pg_attribute a
      LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
      LEFT JOIN missing mi ON mi.attname = a.attname
     WHERE a.attrelid = r.objid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''"""

_FUNCTION = """
CREATE OR REPLACE FUNCTION {fn}() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $body$
DECLARE
  r record;
  cols json;
  keycols json;
BEGIN
  -- The user's DDL must never fail because of the tool: no publication (yet, or any more), or any
  -- error here, only skips the message (a WARNING says so; the stream then has the Relation message).
  IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {pub}) THEN
    RETURN;
  END IF;
  -- Only tables the pipeline's publication covers: other DDL costs one catalog lookup.
  IF TG_EVENT = 'table_rewrite' THEN
    IF EXISTS (SELECT 1 FROM pg_get_publication_tables({pub}) p WHERE p.relid = pg_event_trigger_table_rewrite_oid()) THEN
      PERFORM pg_logical_emit_message(true, {prefix}, json_build_object(
        'v', 1, 'event', 'rewrite', 'oid', pg_event_trigger_table_rewrite_oid(),
        'reason', pg_event_trigger_table_rewrite_reason())::text);
    END IF;
    RETURN;
  END IF;
  IF TG_EVENT = 'sql_drop' THEN
    -- the catalog no longer has the table: the stream keeps only OIDs it captures. Not only the
    -- objects named (`original`): DROP SCHEMA ... CASCADE drops its tables as dependents
    FOR r IN SELECT objid, schema_name, object_name FROM pg_event_trigger_dropped_objects()
              WHERE object_type = 'table' AND NOT is_temporary LOOP
      PERFORM pg_logical_emit_message(true, {prefix}, json_build_object(
        'v', 1, 'event', 'drop', 'tag', TG_TAG, 'oid', r.objid, 'schema', r.schema_name,
        'table', r.object_name)::text);
    END LOOP;
    RETURN;
  END IF;
  FOR r IN SELECT DISTINCT e.objid FROM pg_event_trigger_ddl_commands() e
            WHERE e.classid = 'pg_class'::regclass
              AND e.objid IN (SELECT p.relid FROM pg_get_publication_tables({pub}) p) LOOP
    SELECT * INTO cols, keycols FROM ({columns}) s;
    PERFORM pg_logical_emit_message(true, {prefix}, json_build_object(
      'v', 1, 'event', 'ddl', 'tag', TG_TAG, 'oid', r.objid,
      'schema', (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = r.objid),
      'table', (SELECT c.relname FROM pg_class c WHERE c.oid = r.objid),
      'columns', cols, 'key', keycols)::text);
  END LOOP;
EXCEPTION WHEN OTHERS THEN
  RAISE WARNING 'cdc DDL capture (%): % (the DDL goes on; the stream learns of it with the table''s next change)',
    {prefix}, SQLERRM;
END
$body$"""


def install_statements(pipeline_name: str, publication: str) -> list[sql.Composable]:
    """The function and its three event triggers (run in one transaction; again: replaced)."""
    fn = sql.Identifier("public", function_name(pipeline_name))
    body = sql.SQL(_FUNCTION).format(
        fn=fn,
        pub=sql.Literal(publication),
        prefix=sql.Literal(prefix(pipeline_name)),
        columns=sql.SQL(_COLUMNS),
    )
    out: list[sql.Composable] = [body]
    for event, name in trigger_names(pipeline_name).items():
        out.append(sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(name)))
        out.append(
            sql.SQL("CREATE EVENT TRIGGER {} ON {} EXECUTE FUNCTION {}()").format(
                sql.Identifier(name), sql.SQL(event), fn
            )
        )
    return out


def remove_statements(pipeline_name: str) -> list[sql.Composable]:
    out: list[sql.Composable] = [
        sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(name))
        for name in trigger_names(pipeline_name).values()
    ]
    out.append(
        sql.SQL("DROP FUNCTION IF EXISTS {}()").format(sql.Identifier("public", function_name(pipeline_name)))
    )
    return out


@dataclass(frozen=True)
class TriggerState:
    """What the source has of the pipeline's DDL capture."""

    enabled: tuple[str, ...]  # events whose trigger exists and is enabled
    missing: tuple[str, ...]  # events whose trigger is absent or disabled

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def absent(self) -> bool:
        return not self.enabled


def trigger_state(conn, pipeline_name: str) -> TriggerState:
    names = trigger_names(pipeline_name)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT evtevent FROM pg_event_trigger WHERE evtname = ANY(%s) AND evtenabled <> 'D'",
            (list(names.values()),),
        )
        have = {r[0] for r in cur.fetchall()}
    return TriggerState(tuple(e for e in names if e in have), tuple(e for e in names if e not in have))


def can_create_event_trigger(conn) -> tuple[bool, str]:
    """(whether this role may create event triggers, the role name). PostgreSQL allows it to
    superusers only (managed services grant it through their own admin roles and extensions)."""
    with conn.cursor() as cur:
        cur.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user")
        user, superuser = cur.fetchone()
    return bool(superuser), user


# ---- the pipeline's record that DDL capture was installed (so a trigger gone since is noticed) -------
def load_installed(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (FileNotFoundError, NotADirectoryError, ValueError):  # an unusable state_dir is said elsewhere
        return None
    return data if isinstance(data, dict) and data.get("installed") else None


def save_installed(state_dir: Path, installed: bool) -> None:
    path = Path(state_dir) / STATE_FILE
    if not installed:
        path.unlink(missing_ok=True)
        return
    private_dir(path.parent)
    tmp = path.with_suffix(".tmp")
    with private_open(tmp, "w") as f:
        f.write(json.dumps({"installed": True, "at_ms": now_ms()}))
    os.replace(tmp, path)


def mode_line(
    state: TriggerState,
    installed: bool,
    install_cmd: str = "cdc ddl install PIPELINE",
    remove_cmd: str = "cdc ddl remove PIPELINE",
) -> tuple[str, str | None]:
    """(how the pipeline follows DDL, the fix when the trigger was installed and is gone)."""
    if state.complete:
        return "DDL capture: on (event trigger): schema changes reach the log at their commit", None
    if installed or state.enabled:
        gone = ", ".join(state.missing)
        return (
            f"DDL capture: event trigger(s) for {gone} dropped or disabled behind the tool's back: schema changes "
            "reach the log only with the table's next change",
            f"run `{install_cmd}` again (or `{remove_cmd}` to stop asking for it)",
        )
    return (
        "DDL capture: off (no event trigger): schema changes reach the log with the table's next change; "
        f"`{install_cmd}` captures them at their commit",
        None,
    )


# ---- the stream's side: reading a message -------------------------------------------------------
@dataclass(frozen=True)
class DdlEvent:
    event: str  # 'ddl' | 'rewrite' | 'drop'
    oid: int
    tag: str = ""
    schema: str = ""
    table: str = ""
    columns: tuple[Column, ...] = ()
    key: tuple[str, ...] = ()
    reason: int = 0


class DdlMessageError(ValueError):
    """A message with the pipeline's prefix that is not a DDL message this version reads."""


def catalog_event(conn, oid: int) -> DdlEvent | None:
    """The table's columns as the catalog has them now, in the form of a DDL message (the idle-table
    schema check of a stream without DDL capture); None when the table is gone."""
    query = (
        "SELECT s.*, n.nspname, c.relname FROM (SELECT %s::oid AS objid) r"
        f" CROSS JOIN LATERAL ({_COLUMNS}) s JOIN pg_class c ON c.oid = r.objid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
    )
    with conn.cursor() as cur:
        cur.execute(query, (oid,))
        row = cur.fetchone()
    if row is None:
        return None
    cols, key, schema, table = row
    body = {
        "v": FORMAT,
        "event": "ddl",
        "oid": oid,
        "schema": schema,
        "table": table,
        "columns": cols,
        "key": key,
    }
    return parse(json.dumps(body).encode())


def parse(content: bytes) -> DdlEvent:
    try:
        body: dict[str, Any] = json.loads(bytes(content))
    except ValueError as exc:
        raise DdlMessageError(f"not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("v") != FORMAT:
        raise DdlMessageError(
            f"unknown DDL message format {body.get('v') if isinstance(body, dict) else body!r}"
        )
    event = body.get("event")
    if event not in ("ddl", "rewrite", "drop"):
        raise DdlMessageError(f"unknown DDL message event {event!r}")
    columns = tuple(
        Column(str(name), int(type_oid), int(typmod), int(ndims or 0), missing, int(attnum))
        for attnum, name, type_oid, typmod, ndims, _notnull, _default, missing, _in_key in body.get("columns")
        or []
    )
    return DdlEvent(
        event=event,
        oid=int(body["oid"]),
        tag=body.get("tag") or "",
        schema=body.get("schema") or "",
        table=body.get("table") or "",
        columns=columns,
        key=tuple(body.get("key") or ()),
        reason=int(body.get("reason") or 0),
    )
