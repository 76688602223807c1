"""The pipeline's publications: whether the role can create them or add its tables (checks), their
names, and creating them or adding tables (`cdc snapshot`). Keyless tables go into a second,
insert-only publication (insert_publication)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager

from psycopg2 import sql

from cdc.filters import CaptureFilter, publication_member
from cdc.ground.tables import TableName, quote_ident
from cdc.source.report import CheckReport, Problem, ServerInfo, TableInfo


def check_publications(
    conn,
    report: CheckReport,
    info: ServerInfo,
    publication: str,
    followed: Collection[TableName] = (),
    snapshot: Callable[[TableName], str] = lambda t: f"cdc snapshot --tables {t}",
) -> None:
    """Can `cdc snapshot` create the publication or add the pipeline's tables to it, and does it
    publish partitioned tables as themselves? Each problem gets one statement that works as printed
    (the tool's own publications are FOR TABLE ... WITH (publish_via_partition_root = true)).
    `followed`: the tables the log follows; `snapshot(table)`: the command that copies one again."""
    _check_insert_publication(conn, report, info, publication, followed, snapshot)
    tables = [t for t in report.tables if t.relkind in ("r", "p") and not t.insert_only]
    if not tables:
        return
    pub = quote_ident(publication)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT oid, pubviaroot, pg_has_role(pubowner, 'USAGE'), pg_get_userbyid(pubowner), puballtables "
            "FROM pg_publication WHERE pubname = %s",
            (publication,),
        )
        row = cur.fetchone()
    if row is None:
        others = [str(t.table) for t in tables if not t.owned]
        if info.superuser or (not others and info.can_create_in_db):
            return  # `cdc snapshot` creates it
        names = ", ".join(str(t.table) for t in tables)
        statement = f"CREATE PUBLICATION {pub} FOR TABLE {names} WITH (publish_via_partition_root = true);"
        if others:
            why = f"role {info.user} does not own {', '.join(others)}"
            fix = f"ask the tables' owner (or a superuser) to run {statement}"
        else:  # the role owns every table and only lacks CREATE on the database
            why = f"role {info.user} has no CREATE on database {info.database}"
            fix = (
                f"run GRANT CREATE ON DATABASE {quote_ident(info.database)} TO {quote_ident(info.user)}; "
                f"or, as a superuser, {statement}"
            )
        report.problems.append(
            Problem(f"publication {publication} does not exist and {why}, so it cannot create it", fix)
        )
        return
    pub_oid, via_root, own_pub, pub_owner, all_tables = row
    with conn.cursor() as cur:
        cur.execute("SELECT prrelid FROM pg_publication_rel WHERE prpubid = %s", (pub_oid,))
        members = {oid for (oid,) in cur.fetchall()}
        if info.version >= 150000:  # FOR TABLES IN SCHEMA
            cur.execute(
                "SELECT c.oid FROM pg_publication_namespace pn JOIN pg_class c ON c.relnamespace = pn.pnnspid "
                "WHERE pn.pnpubid = %s",
                (pub_oid,),
            )
            members |= {oid for (oid,) in cur.fetchall()}
    missing = [t for t in tables if not all_tables and t.oid not in members]
    cannot = [t for t in missing if not (info.superuser or (t.owned and own_pub))]
    if cannot:
        names = ", ".join(str(t.table) for t in missing)  # every missing table in one statement
        report.problems.append(
            Problem(
                f"{', '.join(str(t.table) for t in cannot)} not in publication {publication}, and role {info.user} "
                f"cannot add {'them' if len(cannot) > 1 else 'it'} (that needs ownership of the publication, "
                f"owned by {pub_owner}, and of the table)",
                f"ask the owner (or a superuser) to run ALTER PUBLICATION {pub} ADD TABLE {names};",
            )
        )
    if info.version >= 180000:
        _check_generated_columns(conn, report, info, publication, own_pub, pub_owner)
    if not via_root and any(t.relkind == "p" for t in tables):
        # Without it a partitioned table's changes are published under its partitions' names,
        # which the pipeline does not capture.
        who = "run" if own_pub or info.superuser else f"ask {pub_owner} (or a superuser) to run"
        parents = ", ".join(str(t.table) for t in tables if t.relkind == "p")
        report.problems.append(
            Problem(
                f"publication {publication} has publish_via_partition_root off, so changes of the partitioned "
                f"table(s) {parents} would come as changes of their partitions, which this pipeline does not capture",
                f"{who} ALTER PUBLICATION {pub} SET (publish_via_partition_root = true);",
            )
        )


def _check_insert_publication(
    conn,
    report: CheckReport,
    info: ServerInfo,
    publication: str,
    followed: Collection[TableName],
    snapshot: Callable[[TableName], str],
) -> None:
    """Keyless tables: never in a publication of the pipeline that publishes updates or deletes
    (PostgreSQL would then refuse the application's own UPDATE and DELETE on them), and the
    insert-only publication can be created or has them (or the statement to run)."""
    keyless = [t for t in report.tables if t.relkind in ("r", "p") and t.insert_only]
    if not keyless:
        return
    inserts = insert_publication(publication)
    members = _publication_tables(conn, publication) or set()
    with conn.cursor() as cur:
        for t in keyless:
            if t.table in followed and t.table in members:
                report.problems.append(
                    switched_to_default(t.table, t.replica_identity, publication, snapshot)
                )
                continue
            cur.execute(
                "SELECT p.pubname FROM pg_publication p WHERE p.pubname = ANY(%s) AND (p.pubupdate OR p.pubdelete)"
                " AND p.oid IN (SELECT prpubid FROM pg_publication_rel WHERE prrelid = %s"
                " UNION SELECT oid FROM pg_publication WHERE puballtables)",
                ([publication, inserts], t.oid),
            )
            for (pub,) in cur.fetchall():
                report.problems.append(
                    Problem(
                        f"table {t.table} has no primary key and is in publication {pub}, which publishes updates "
                        "and deletes: PostgreSQL refuses UPDATE and DELETE on it until it has a replica identity",
                        f"run ALTER PUBLICATION {quote_ident(pub)} DROP TABLE {t.table}; (the pipeline follows it "
                        f"through publication {inserts}, inserts only), or give it a primary key",
                    )
                )
        cur.execute(
            "SELECT pg_has_role(pubowner, 'USAGE'), pg_get_userbyid(pubowner) FROM pg_publication WHERE pubname = %s",
            (inserts,),
        )
        row = cur.fetchone()
    names = ", ".join(str(t.table) for t in keyless)
    others = [str(t.table) for t in keyless if not t.owned]
    statement = (
        f"CREATE PUBLICATION {quote_ident(inserts)} FOR TABLE {names} WITH (publish = 'insert, truncate');"
    )
    if row is None and not (info.superuser or (not others and info.can_create_in_db)):
        report.problems.append(
            Problem(
                f"publication {inserts} (the insert-only publication for keyless tables) does not exist and role "
                f"{info.user} cannot create it",
                f"ask the tables' owner (or a superuser) to run {statement}",
            )
        )
    elif row is not None and not (info.superuser or (row[0] and not others)):
        present = _publication_tables(conn, inserts) or set()
        missing = [str(t.table) for t in keyless if t.table not in present]
        if missing:
            report.problems.append(
                Problem(
                    f"{', '.join(missing)} not in publication {inserts}, and role {info.user} cannot add them",
                    f"ask {row[1]} (or a superuser) to run ALTER PUBLICATION {quote_ident(inserts)} ADD TABLE {', '.join(missing)};",
                )
            )


def switched_to_default(
    table: TableName, replica_identity: str, publication: str, snapshot: Callable[[TableName], str]
) -> Problem:
    """A followed keyless table in the main publication with the default replica identity: it had
    REPLICA IDENTITY FULL when it joined (followed as a multiset) and was switched since. Nothing is
    lost (PostgreSQL refuses its updates and deletes, so its inserts are all its changes), but the
    application is broken. Dropping it from the publication by hand would lose its inserts (it is
    in no publication then), so the fixes are the identity back, or `cdc snapshot --tables`, which
    moves it to the insert-only publication in one transaction and copies it again."""
    identity = "DEFAULT" if replica_identity == "d" else "NOTHING"
    inserts = insert_publication(publication)
    return Problem(
        f"table {table} has no primary key and REPLICA IDENTITY {identity} but is followed through publication "
        f"{publication}, which publishes updates and deletes (it had REPLICA IDENTITY FULL when it joined): "
        "PostgreSQL refuses the application's UPDATE and DELETE on it; `cdc stream` still captures it exactly "
        "(its inserts are all its changes now)",
        f"run ALTER TABLE {table} REPLICA IDENTITY FULL; (followed as a multiset again, nothing to copy), or "
        f"`{snapshot(table)}` (it moves {table} to publication {inserts}, inserts only, and copies it again; "
        "its updates and deletes are not followed from then on)",
        moved_by_snapshot=table,
    )


def _check_generated_columns(
    conn, report: CheckReport, info: ServerInfo, publication: str, own_pub: bool, pub_owner: str
) -> None:
    """PostgreSQL 18 publishes stored generated columns when the publication says
    publish_generated_columns = stored. Followers get no generated columns on any major (the same
    follower schema whatever the source runs, and across an upgrade), and the snapshot, the column
    identity and verify all leave them out: a publication that sends them would give followers a
    column the snapshot never filled, so it is refused (the tool's own publications keep `none`)."""
    with conn.cursor() as cur:
        cur.execute("SELECT pubgencols FROM pg_publication WHERE pubname = %s", (publication,))
        row = cur.fetchone()
    if row is None or row[0] in ("n", None):
        return
    pub = quote_ident(publication)
    who = "run" if own_pub or info.superuser else f"ask {pub_owner} (or a superuser) to run"
    report.problems.append(
        Problem(
            f"publication {publication} has publish_generated_columns = stored: followers do not get generated "
            "columns (on any PostgreSQL version), and the snapshot leaves them out, so streamed rows would not match it",
            f"{who} ALTER PUBLICATION {pub} SET (publish_generated_columns = none);",
        )
    )


def _publication_tables(conn, publication: str) -> set[TableName] | None:
    """Tables in the publication, or None when it does not exist."""
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,))
        if cur.fetchone() is None:
            return None
        # pg_publication_tables names the partitions of a partitioned member when the publication
        # does not publish via the root; the member itself counts too (adding it again fails)
        cur.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s "
            "UNION SELECT n.nspname, c.relname FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
            "JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s",
            (publication, publication),
        )
        return {TableName(s, t) for s, t in cur.fetchall()}


def in_publication(conn, publication: str, table: TableName) -> bool:
    """Whether `table` is a member of `publication`."""
    return table in (_publication_tables(conn, publication) or set())


def followed_insert_only(conn, publication: str, table: TableName) -> bool:
    """Whether a keyless table is in the pipeline's insert-only publication and not in its main one:
    followed by its inserts alone. A REPLICA IDENTITY FULL table there got its identity after it
    joined (its updates and deletes are not published): `cdc snapshot --tables` moves it."""
    inserts = _publication_tables(conn, insert_publication(publication))
    if inserts is None or table not in inserts:
        return False
    return table not in (_publication_tables(conn, publication) or set())


def full_identity_notes(
    conn, report: CheckReport, publication: str, snapshot: Callable[[TableName], str]
) -> None:
    """A note for each REPLICA IDENTITY FULL keyless table still followed insert-only (it was
    switched from DEFAULT while followed). A note, not a problem: the fix, `snapshot(table)`, runs
    the same checks."""
    for t in report.tables:
        if t.multiset and followed_insert_only(conn, publication, t.table):
            report.notes.append(
                f"table {t.table} has REPLICA IDENTITY FULL but is followed insert-only (it is in publication "
                f"{insert_publication(publication)}, not in {publication}): its updates and deletes are not captured, "
                f"and `cdc stream` stops at its next insert; run `{snapshot(t.table)}` (it adds the table to "
                f"{publication} and copies it again, as the updates and deletes since the change were not captured)"
            )


def insert_publication(publication: str) -> str:
    """The pipeline's second publication, for keyless tables: it publishes inserts and truncates
    only, so PostgreSQL never asks for a replica identity on the application's UPDATE and DELETE
    (which it does for every table of a publication that publishes updates or deletes)."""
    return f"{publication[:55]}_inserts"


def publication_names(conn, publication: str) -> str:
    """pgoutput's publication_names: the main publication, plus the insert-only one when it exists
    (naming a publication that does not exist stops the stream)."""
    extra = insert_publication(publication)
    return f"{publication},{extra}" if _publication_tables(conn, extra) is not None else publication


def ensure_publication(
    conn,
    publication: str,
    tables: list[TableInfo],
    filters: Mapping[TableName, CaptureFilter] | None = None,
    copied: Collection[TableName] = (),
) -> list[TableName]:
    """Create the publication, or add missing tables to it, each with its column list and row filter
    (`filters`); insert-only (keyless) tables go into the insert-only publication instead, and those
    of them this snapshot copies (`copied`) that are still in the main publication move there.
    Returns the tables added. (Changed filters of tables already in it: cdc.filters.set_filters.)"""
    keyless = [t for t in tables if t.insert_only]
    main = _publication_tables(conn, publication)
    first = main is None
    # a keyless table switched from REPLICA IDENTITY FULL to DEFAULT while followed, copied again by
    # its `cdc snapshot --tables` (the fix): out of the main publication, into the insert-only one,
    # in one transaction, so each of its inserts is published by one of them
    moving = [t for t in keyless if t.table in (main or set()) and t.table in copied]
    # one not copied now stays where it is, until its own `cdc snapshot --tables` (the checks warn)
    keyless = [t for t in keyless if t in moving or t.table not in (main or set())]
    with _one_transaction(conn, bool(moving)):
        if moving:
            with conn.cursor() as cur:
                cur.execute(
                    sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                        sql.Identifier(publication),
                        sql.SQL(", ").join(sql.Identifier(t.table.schema, t.table.name) for t in moving),
                    )
                )
        added = _ensure(
            conn,
            publication,
            [t for t in tables if not t.insert_only],
            filters,
            "insert, update, delete, truncate",
        )
        # made with the first: a stream started before a keyless table joins reads it too
        if keyless or first:
            added += _ensure(conn, insert_publication(publication), keyless, filters, "insert, truncate")
    return added


@contextmanager
def _one_transaction(conn, wanted: bool) -> Iterator[None]:
    """The block's statements in one transaction when `wanted` (on an autocommit connection too)."""
    if not (wanted and conn.autocommit):
        yield
        return
    with conn.cursor() as cur:
        cur.execute("BEGIN")
    try:
        yield
    except BaseException:
        with conn.cursor() as cur:
            cur.execute("ROLLBACK")
        raise
    with conn.cursor() as cur:
        cur.execute("COMMIT")


def _ensure(
    conn,
    publication: str,
    tables: list[TableInfo],
    filters: Mapping[TableName, CaptureFilter] | None,
    publish: str,
) -> list[TableName]:
    existing = _publication_tables(conn, publication)
    chosen = filters or {}
    idents = [publication_member(chosen.get(t.table) or CaptureFilter(t.table)) for t in tables]
    with conn.cursor() as cur:
        if existing is None:
            members = sql.SQL("FOR TABLE {} ").format(sql.SQL(", ").join(idents)) if idents else sql.SQL("")
            cur.execute(
                sql.SQL(
                    "CREATE PUBLICATION {} {}WITH (publish = {}, publish_via_partition_root = true)"
                ).format(sql.Identifier(publication), members, sql.Literal(publish))
            )
            return [t.table for t in tables]
        added = [t for t in tables if t.table not in existing]
        if added:
            cur.execute(
                sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                    sql.Identifier(publication),
                    sql.SQL(", ").join(
                        publication_member(chosen.get(t.table) or CaptureFilter(t.table)) for t in added
                    ),
                )
            )
        return [t.table for t in added]
