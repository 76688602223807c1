"""`cdc ddl install|remove PIPELINE`: the event trigger that writes each DDL of a captured table
into the WAL (cdc/ddl.py), installed only when the user asks for it."""

from __future__ import annotations

import logging

import psycopg2

from cdc import ddl
from cdc.ground.config import Pipeline
from cdc.ground.errors import SourceError
from cdc.source import connect

logger = logging.getLogger(__name__)


def _no_right(pipeline: Pipeline, user: str, action: str) -> SourceError:
    return SourceError(
        f"role {user} may not {action} event triggers (PostgreSQL allows it to superusers; managed services to "
        "their admin role, where they allow it at all); nothing was changed, and the pipeline goes on following "
        "schema changes with each table's next change",
        f"run `{pipeline.command(f'ddl {action}')}` with a DSN of a superuser, or on a managed service of its admin "
        "role (docs/schema-changes.md: which role may create event triggers on RDS, Cloud SQL, Azure, Supabase)",
    )


def run_install(pipeline: Pipeline) -> None:
    conn = connect(pipeline.source.postgres.dsn, application_name="cdc ddl install")
    try:
        _, user = ddl.can_create_event_trigger(conn)
        try:  # tried, not pre-checked: managed services let their (non-superuser) admin role do it
            with conn, conn.cursor() as cur:  # one transaction: all three triggers or none
                for statement in ddl.install_statements(pipeline.name, pipeline.publication):
                    cur.execute(statement)
        except psycopg2.errors.InsufficientPrivilege:
            raise _no_right(pipeline, user, "install") from None
        ddl.save_installed(pipeline.state_path, True)
        names = ", ".join(ddl.trigger_names(pipeline.name).values())
        logger.info(
            f"installed event triggers {names} (function public.{ddl.function_name(pipeline.name)}): each DDL of a "
            f"table in publication {pipeline.publication} now writes its new columns into the WAL in its own "
            "transaction; `cdc stream` makes them the table's new schema version at that point"
        )
    finally:
        conn.close()


def run_remove(pipeline: Pipeline) -> None:
    conn = connect(pipeline.source.postgres.dsn, application_name="cdc ddl remove")
    try:
        remove(conn, pipeline)
    finally:
        conn.close()


def remove(conn, pipeline: Pipeline) -> None:
    """Drop the triggers and their function (also from `cdc teardown --drop-slot`)."""
    state = ddl.trigger_state(conn, pipeline.name)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT to_regprocedure(%s) IS NOT NULL", (f"public.{ddl.function_name(pipeline.name)}()",)
        )
        has_function = bool(cur.fetchone()[0])
    if state.absent and not has_function:
        ddl.save_installed(pipeline.state_path, False)
        logger.info("no DDL capture event trigger to remove")
        return
    _, user = ddl.can_create_event_trigger(conn)
    try:
        with conn, conn.cursor() as cur:
            for statement in ddl.remove_statements(pipeline.name):
                cur.execute(statement)
    except psycopg2.errors.InsufficientPrivilege:
        raise _no_right(pipeline, user, "remove") from None
    ddl.save_installed(pipeline.state_path, False)
    logger.info(
        f"removed the DDL capture event triggers of pipeline {pipeline.name}: schema changes now reach the log with each table's next change"
    )


def describe(conn, pipeline: Pipeline) -> tuple[str, str | None]:
    """`cdc validate`'s line: which mode the pipeline runs in (and the fix when a trigger went)."""
    state = ddl.trigger_state(conn, pipeline.name)
    installed = ddl.load_installed(pipeline.state_path) is not None
    line, fix = ddl.mode_line(
        state, installed, pipeline.command("ddl install"), pipeline.command("ddl remove")
    )
    if not state.complete and fix is None:
        allowed, user = ddl.can_create_event_trigger(conn)
        if not allowed:
            line += (
                f" (role {user} is not a superuser: `cdc ddl install` needs one, or a managed service's admin role "
                "where the service lets it create event triggers)"
            )
    return line, fix
