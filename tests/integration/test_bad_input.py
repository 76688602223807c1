"""Bad pipeline files and unusable sources: each fails with the documented exit code, a message that
names the problem and the fix, no traceback, no secret in the output, and (where DESIGN.md says so)
nothing created on the source."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from pipelines.devservices.base import free_port
from pipelines.devservices.postgres import LocalPostgres
from tests.fixtures.services import postgres
from tests.harness import CdcRun, cdc, materialize, source_rows, sql, write_pipeline

pytestmark = pytest.mark.integration

USAGE, SOURCE = 2, 3


# ---- helpers -------------------------------------------------------------------------------------------
def dbname_of(dsn: str) -> str:
    return dsn.rsplit("/", 1)[1]


def check_output(run: CdcRun, code: int, *needles: str, secrets: Sequence[str] = ()) -> str:
    """Exit code as documented, every needle in the output, no traceback, no secret. Returns the output."""
    text = run.out + run.err
    assert run.code == code, f"exit {run.code}, expected {code}\nstdout:\n{run.out}\nstderr:\n{run.err}"
    assert "Traceback" not in text, text
    assert "internal error" not in text, text
    for needle in needles:
        assert needle in text, f"{needle!r} not in the output:\n{text}"
    for secret in secrets:
        assert secret not in text, f"a secret appears in the output:\n{text}"
    return text


def check_error(run: CdcRun, code: int, *needles: str, secrets: Sequence[str] = ()) -> None:
    """A failing command: problem and fix on stderr (`error: ...` then `  fix: ...`)."""
    check_output(run, code, secrets=secrets)
    assert "error:" in run.err and "fix:" in run.err, f"no problem/fix on stderr:\n{run.err}"
    for needle in needles:
        assert needle in run.err, f"{needle!r} not on stderr:\n{run.err}"


def refused(path: Path, problem: str, fix: str, password: str, pg: LocalPostgres) -> None:
    """A role short of a privilege: `cdc validate` names the problem and the fix, `cdc snapshot` stops
    with the fix on stderr; neither prints the role's or the superuser's password."""
    check_output(cdc("validate", path), SOURCE, problem, fix, secrets=[password])
    check_error(cdc("snapshot", path), SOURCE, fix.rstrip(";"), secrets=[password, pg.password])


def assert_nothing_created(dsn: str, existing_slots: Sequence[str] = ()) -> None:
    assert sql(dsn, "SELECT pubname FROM pg_publication") == [], "a publication was created"
    slots = sql(dsn, "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()")
    created = [s for (s,) in slots if s not in existing_slots]
    assert created == [], f"a replication slot was created: {created}"


def write_doc(directory: Path, doc: Any, name: str = "bad.yml") -> Path:
    path = directory / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def good_doc(dsn: str, tables: Sequence[str] = ("public.t",)) -> dict[str, Any]:
    return {"name": "test", "source": {"postgres": {"dsn": dsn, "tables": list(tables)}}}


@pytest.fixture
def role(pg: LocalPostgres, pg_db: str) -> Iterator[tuple[str, str]]:
    """A login role (name, password) without privileges; dropped afterwards."""
    name, password = f"r_{uuid.uuid4().hex[:8]}", f"Pw{uuid.uuid4().hex}"
    sql(pg.dsn(), f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    try:
        yield name, password
    finally:
        sql(pg_db, f"DROP OWNED BY {name}")
        sql(pg.dsn(), f"DROP ROLE {name}")


# ---- pipeline file -------------------------------------------------------------------------------------
CONFIG_CASES = {
    "malformed_yaml": (
        "name: test\nsource:\n  postgres: {dsn: x, tables: [public.t\n",
        ["not valid YAML", "line"],
    ),
    "unknown_key": (
        {"source": {"postgres": {"tabels": ["public.t"]}}},
        ["source.postgres", "unknown key 'tabels'"],
    ),
    "wrong_type": ({"stream": {"batch_max_events": "many"}}, ["stream.batch_max_events", "integer"]),
    "wrong_type_list": ({"source": {"postgres": {"tables": "public.t"}}}, ["source.postgres.tables", "list"]),
    "bad_name": ({"name": "Bad-Name"}, ["name:", "Bad-Name"]),
    "missing_key": (
        {"source": {"postgres": {"tables": None}}},
        ["source.postgres.tables", "required key is missing"],
    ),
    "missing_source": ({"source": None}, ["source: required key is missing"]),
    "undefined_var": (
        {"source": {"postgres": {"dsn": "${CDC_TEST_UNDEFINED_VAR}"}}},
        ["source.postgres.dsn", "CDC_TEST_UNDEFINED_VAR", "export CDC_TEST_UNDEFINED_VAR"],
    ),
}


def _merge(base: dict, change: dict) -> dict:
    out = dict(base)
    for k, v in change.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_pipeline_file(pg: LocalPostgres, pg_db: str, tmp_path: Path, case: str) -> None:
    change, needles = CONFIG_CASES[case]
    doc = change if isinstance(change, str) else _merge(good_doc(pg_db), change)
    path = write_doc(tmp_path, doc)
    for command in ("validate", "snapshot"):
        run = cdc(command, path)
        check_error(run, USAGE, str(path), *needles, secrets=[pg.password])
    assert_nothing_created(pg_db)


def test_environment_variables(pg: LocalPostgres, pg_db: str, tmp_path: Path) -> None:
    """${VAR:-default} falls back to the default; ${VAR} takes the environment's value."""
    sql(pg_db, "CREATE TABLE t(id int PRIMARY KEY)")
    with_default = write_doc(tmp_path, good_doc("${CDC_TEST_UNSET_DSN:-" + pg_db + "}"), "default.yml")
    check_output(cdc("validate", with_default), 0, "all checks passed", secrets=[pg.password])
    from_env = write_doc(tmp_path, good_doc("${CDC_TEST_DSN}"), "env.yml")
    check_output(
        cdc("validate", from_env, env={"CDC_TEST_DSN": pg_db}), 0, "all checks passed", secrets=[pg.password]
    )
    # An empty default is a value too, and `$$` is a literal dollar.
    odd = write_doc(tmp_path, good_doc("${CDC_TEST_UNSET_DSN:-" + pg_db + "}"), "odd.yml")
    text = odd.read_text().replace("name: test", "name: test${CDC_TEST_UNSET_SUFFIX:-}")
    odd.write_text(text)
    check_output(cdc("validate", odd), 0, "all checks passed")
    assert_nothing_created(pg_db)


# ---- the source server -------------------------------------------------------------------------------------
class ReplicaOnlyPostgres(LocalPostgres):
    """A throwaway cluster whose wal_level is `replica` (LocalPostgres rewrites its settings on every
    start, so the setting is changed where they are written)."""

    def _write_conf(self) -> None:
        super()._write_conf()
        conf = self.data_dir / "postgresql.auto.conf"
        text = conf.read_text()
        assert "wal_level = logical" in text, text
        conf.write_text(text.replace("wal_level = logical", "wal_level = replica"))


def test_wal_level_not_logical(tmp_path: Path) -> None:
    with postgres(cls=ReplicaOnlyPostgres) as server:
        dsn = server.dsn()
        assert sql(dsn, "SHOW wal_level") == [("replica",)]
        sql(dsn, "CREATE TABLE t(id int PRIMARY KEY)")
        path = write_pipeline(tmp_path, dsn, ["public.t"])
        run = cdc("validate", path)
        check_output(
            run,
            SOURCE,
            "wal_level is 'replica'",
            "ALTER SYSTEM SET wal_level = logical",
            secrets=[server.password],
        )
        run = cdc("snapshot", path)
        check_error(
            run, SOURCE, "wal_level", "ALTER SYSTEM SET wal_level = logical", secrets=[server.password]
        )
        assert sql(dsn, "SELECT count(*) FROM pg_publication") == [(0,)]
        assert sql(dsn, "SELECT count(*) FROM pg_replication_slots") == [(0,)]


def test_replication_slots_exhausted(pg: LocalPostgres, pg_db: str, tmp_path: Path) -> None:
    sql(pg_db, "CREATE TABLE t(id int PRIMARY KEY)")
    path = write_pipeline(tmp_path, pg_db, ["public.t"])
    used, limit = sql(
        pg_db, "SELECT count(*), current_setting('max_replication_slots')::int FROM pg_replication_slots"
    )[0]
    fillers = [f"fill_{uuid.uuid4().hex[:8]}" for _ in range(limit - used)]
    try:
        for name in fillers:
            sql(pg_db, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", params=(name,))
        run = cdc("validate", path)
        check_output(
            run,
            SOURCE,
            f"all {limit} replication slots are in use",
            "pg_drop_replication_slot",
            "max_replication_slots",
        )
        run = cdc("snapshot", path)
        check_error(
            run, SOURCE, "replication slots are in use", "pg_drop_replication_slot", secrets=[pg.password]
        )
        assert_nothing_created(pg_db, fillers)
    finally:
        for name in fillers:
            sql(
                pg.dsn(),
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                params=(name,),
            )


def test_role_without_replication(
    pg: LocalPostgres, pg_db: str, tmp_path: Path, role: tuple[str, str]
) -> None:
    name, password = role
    sql(
        pg_db,
        "CREATE TABLE t(id int PRIMARY KEY)",
        f"GRANT SELECT ON t TO {name}",
        f"ALTER TABLE t OWNER TO {name}",
    )
    sql(pg_db, f"GRANT CREATE ON DATABASE {dbname_of(pg_db)} TO {name}")
    path = write_pipeline(tmp_path, pg.dsn(dbname_of(pg_db), user=name, password=password), ["public.t"])
    refused(
        path,
        f"role {name} lacks the REPLICATION attribute",
        f"ALTER ROLE {name} WITH REPLICATION",
        password,
        pg,
    )
    assert_nothing_created(pg_db)
    # With the fix applied the same pipeline works.
    sql(pg.dsn(), f"ALTER ROLE {name} WITH REPLICATION")
    check_output(cdc("validate", path), 0, "all checks passed", secrets=[password])


def test_rds_replication_role_counts_as_replication(
    pg: LocalPostgres, pg_db: str, tmp_path: Path, role: tuple[str, str]
) -> None:
    """Amazon RDS and Aurora give the replication right by membership in `rds_replication` (README
    Managed PostgreSQL), not by the REPLICATION attribute: a member (here through another role, as
    through rds_superuser) passes the check. Not RDS: only the check runs, against a real server
    with roles of those names."""
    name, password = role
    sql(
        pg_db,
        "CREATE TABLE t(id int PRIMARY KEY)",
        f"GRANT SELECT ON t TO {name}",
        f"ALTER TABLE t OWNER TO {name}",
    )
    sql(pg_db, f"GRANT CREATE ON DATABASE {dbname_of(pg_db)} TO {name}")
    created = not sql(pg.dsn(), "SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication'")
    if created:
        sql(pg.dsn(), "CREATE ROLE rds_replication NOLOGIN")
    sql(
        pg.dsn(),
        f"CREATE ROLE {name}_su NOLOGIN",
        f"GRANT rds_replication TO {name}_su",
        f"GRANT {name}_su TO {name}",
    )
    try:
        path = write_pipeline(tmp_path, pg.dsn(dbname_of(pg_db), user=name, password=password), ["public.t"])
        check_output(cdc("validate", path), 0, "all checks passed", secrets=[password])
    finally:
        sql(pg.dsn(), f"DROP ROLE {name}_su", *(["DROP ROLE rds_replication"] if created else []))


def test_role_without_select(pg: LocalPostgres, pg_db: str, tmp_path: Path, role: tuple[str, str]) -> None:
    name, password = role
    sql(pg.dsn(), f"ALTER ROLE {name} WITH REPLICATION")
    sql(pg_db, "CREATE TABLE t(id int PRIMARY KEY)", "CREATE PUBLICATION cdc_test FOR TABLE t")
    path = write_pipeline(tmp_path, pg.dsn(dbname_of(pg_db), user=name, password=password), ["public.t"])
    refused(
        path, f"role {name} cannot SELECT from public.t", f"GRANT SELECT ON public.t TO {name};", password, pg
    )
    assert sql(pg_db, "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()") == [
        (0,)
    ]
    sql(pg_db, f"GRANT SELECT ON t TO {name}")
    check_output(cdc("validate", path), 0, "all checks passed", secrets=[password])


# ---- tables and keys ---------------------------------------------------------------------------------------
def test_table_without_primary_key_in_a_cache_sink(pg: LocalPostgres, pg_db: str, tmp_path: Path) -> None:
    """A keyless table is followed insert-only (README "Tables without a primary key"); a cache
    follower has no key to keep its rows under, so a pipeline that asks for it is refused."""
    sql(pg_db, "CREATE TABLE ok(id int PRIMARY KEY)", "CREATE TABLE nopk(a int, b text)")
    cache = {
        "name": "cache",
        "redis": {"url": "redis://127.0.0.1:1/0", "tables": ["public.ok", "public.nopk"]},
    }
    path = write_pipeline(tmp_path, pg_db, ["public.ok", "public.nopk"], sinks=[cache])
    needles = [
        "sink cache (redis) cannot follow public.nopk: it has no primary key",
        "ALTER TABLE public.nopk ADD PRIMARY KEY",
    ]
    check_output(cdc("validate", path), SOURCE, *needles, secrets=[pg.password])
    check_error(cdc("snapshot", path), SOURCE, *needles, secrets=[pg.password])
    assert_nothing_created(pg_db)


def test_replica_identity_full_without_unique_index(pg: LocalPostgres, pg_db: str, tmp_path: Path) -> None:
    """No usable key (a unique index on a nullable column is none) and REPLICA IDENTITY FULL: followed
    as a multiset (docs/keyless-tables.md); a search follower, which cannot remove one of two identical
    rows, is refused with the reason and the ways out, before anything is created."""
    sql(
        pg_db,
        "CREATE TABLE full_only(a int NOT NULL, b text)",
        "CREATE UNIQUE INDEX full_only_nullable ON full_only(b)",  # unique, but on a nullable column
        "ALTER TABLE full_only REPLICA IDENTITY FULL",
    )
    path = write_pipeline(tmp_path, pg_db, ["public.full_only"])
    check_output(cdc("validate", path), 0, "table public.full_only: 2 columns, no key, REPLICA IDENTITY FULL")
    docs = {"name": "docs", "search": {"engine": "tantivy", "path": "docs", "tables": ["public.*"]}}
    path = write_pipeline(tmp_path, pg_db, ["public.full_only"], sinks=[docs])
    needles = [
        "sink docs (search) cannot follow public.full_only: it has no primary key and REPLICA IDENTITY FULL",
        "follow public.full_only with a delta or iceberg sink",
    ]
    check_output(cdc("validate", path), SOURCE, *needles)
    check_error(cdc("snapshot", path), SOURCE, *needles, secrets=[pg.password])
    assert_nothing_created(pg_db)


def test_replica_identity_full_with_unique_index_is_captured(pg_db: str, tmp_path: Path) -> None:
    sql(
        pg_db,
        "CREATE TABLE fu(code text NOT NULL, region int NOT NULL, v text, note text)",
        "CREATE UNIQUE INDEX fu_key ON fu(region, code)",
        "ALTER TABLE fu REPLICA IDENTITY FULL",
        "INSERT INTO fu SELECT 'c' || g, g % 3, 'v' || g, NULL FROM generate_series(1, 30) g",
    )
    path = write_pipeline(tmp_path, pg_db, ["public.fu"])
    check_output(cdc("validate", path), 0, "key (region, code) from unique index")
    check_output(cdc("snapshot", path, "--no-progress"), 0)
    sql(
        pg_db,
        "UPDATE fu SET v = 'updated' WHERE region = 1",
        "UPDATE fu SET code = code || '-renamed' WHERE code = 'c2'",  # a key change
        "DELETE FROM fu WHERE region = 0 AND code < 'c2'",
        "INSERT INTO fu VALUES ('new', 7, NULL, 'n')",
    )
    sql(
        pg_db, "SET synchronous_commit = on", "CREATE TEMP TABLE flush_wal(x int)"
    )  # see test_capture.flush_wal
    check_output(cdc("stream", path, "--until", "current"), 0)
    state = materialize(tmp_path / ".cdc" / "test" / "log")["public.fu"]
    assert state == source_rows(pg_db, "public.fu", ["region", "code"])
    assert ("2", "c2-renamed") in state and ("2", "c2") not in state


def test_missing_table(pg: LocalPostgres, pg_db: str, tmp_path: Path) -> None:
    sql(pg_db, "CREATE TABLE t(id int PRIMARY KEY)")
    path = write_pipeline(tmp_path, pg_db, ["public.t", "public.nope"])
    needles = [f"table public.nope does not exist in database {dbname_of(pg_db)}", "source.postgres.tables"]
    check_output(cdc("validate", path), SOURCE, *needles, secrets=[pg.password])
    check_error(cdc("snapshot", path), SOURCE, *needles, secrets=[pg.password])
    assert_nothing_created(pg_db)


def test_missing_table_that_differs_only_in_case(pg_db: str, tmp_path: Path) -> None:
    """Unquoted names fold to lower case: the error says which table was meant and how to quote it
    (issue 16 item 6), and the name it prints works in the pipeline file."""
    sql(pg_db, 'CREATE SCHEMA "Mixed Case"', 'CREATE TABLE "Mixed Case"."Order Items"(id int PRIMARY KEY)')
    path = write_pipeline(tmp_path, pg_db, ["Mixed Case.Order Items"])
    meant = '"Mixed Case"."Order Items"'
    problem = f'table "mixed case"."order items" does not exist in database {dbname_of(pg_db)}; did you mean {meant}?'
    check_output(
        cdc("validate", path), SOURCE, problem, f"quote mixed-case names in source.postgres.tables: '{meant}'"
    )
    check_error(cdc("snapshot", path), SOURCE, problem)
    # the fix as printed: the quoted name, in single quotes, into the YAML list
    path.write_text(path.read_text().replace("- Mixed Case.Order Items", f"- '{meant}'"))
    ok = cdc("validate", path)
    assert ok.code == 0 and "does not exist" not in ok.out + ok.err, ok


# ---- connection strings ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dsn",
    [
        "host=127.0.0.1 password=Sekr3tPw port",
        "postgresql://cdc:Sekr3tPw@[::1/db",
        "postgresql://cdc:Sekr3tPw@127.0.0.1/db?nosuchoption=1",
        "postgresql://cdc:Sekr3tPw@127.0.0.1:notaport/db",
    ],
    ids=["kv_missing_equals", "uri_unclosed_bracket", "uri_unknown_option", "uri_port_not_a_number"],
)
def test_malformed_dsn(tmp_path: Path, dsn: str) -> None:
    path = write_pipeline(tmp_path, dsn, ["public.t"])
    for command in ("validate", "snapshot", "stream"):
        check_error(cdc(command, path), USAGE, "source.postgres.dsn", secrets=["Sekr3tPw"])


def test_unreachable_host(tmp_path: Path) -> None:
    dsn = f"postgresql://cdc:Sekr3tPw@127.0.0.1:{free_port()}/db"
    path = write_pipeline(tmp_path, dsn, ["public.t"])
    for command in ("validate", "snapshot", "stream"):
        run = cdc(command, path, timeout=60)
        check_error(
            run,
            SOURCE,
            "cannot connect to the source database",
            "127.0.0.1",
            "check host, port",
            secrets=["Sekr3tPw"],
        )
        # gave up at once: a first connection is never retried (only a lost one is, in `cdc stream`)
        assert "reconnect" not in run.out + run.err, (command, run.out, run.err)


def test_wrong_password(pg: LocalPostgres, pg_db: str, tmp_path: Path) -> None:
    dsn = pg.dsn(dbname_of(pg_db), password="Wr0ngPassw0rd")
    path = write_pipeline(tmp_path, dsn, ["public.t"])
    check_error(
        cdc("validate", path),
        SOURCE,
        "password authentication failed",
        secrets=["Wr0ngPassw0rd", pg.password],
    )


# ---- odd identifiers ---------------------------------------------------------------------------------------
ODD_SCHEMA = '"Sch.ema"'
ODD_TABLE = '"Sch.ema"."Tab""le, ü"'
ODD_TABLE2 = '"Sch.ema"."UPPER case"'


def test_odd_identifiers(pg_db: str, tmp_path: Path) -> None:
    """Capitals, spaces, double quotes, dots, commas and unicode in schema, table and column names,
    key columns included: through snapshot, stream, `--tables`, `log read` and the follower."""
    sql(
        pg_db,
        f"CREATE SCHEMA {ODD_SCHEMA}",
        f'CREATE TABLE {ODD_TABLE}("Id ""k""" int, "Col ""x""" text, "a.b, c" int, "ÄÖÜ" text, PRIMARY KEY ("Id ""k"""))',
        f"INSERT INTO {ODD_TABLE} SELECT g, 'v' || g, g, 'ü' FROM generate_series(1, 20) g",
        f'CREATE TABLE {ODD_TABLE2}("K" text PRIMARY KEY, "V" text)',
        f"INSERT INTO {ODD_TABLE2} VALUES ('a', 'x'), ('B', 'y')",
    )
    path = write_pipeline(tmp_path, pg_db, [ODD_TABLE, ODD_TABLE2])
    check_output(cdc("validate", path), 0, "all checks passed")
    check_output(cdc("snapshot", path, "--no-progress"), 0, ODD_TABLE, ODD_TABLE2)
    sql(
        pg_db,
        f'UPDATE {ODD_TABLE} SET "Col ""x""" = \'upd\' WHERE "Id ""k""" <= 5',
        f'DELETE FROM {ODD_TABLE} WHERE "Id ""k""" = 6',
        f'UPDATE {ODD_TABLE} SET "Id ""k""" = 1000 WHERE "Id ""k""" = 7',
        f"INSERT INTO {ODD_TABLE2} VALUES ('c', 'z')",
    )
    # A second snapshot of one table (the comma inside the quoted name must not split the list).
    check_output(cdc("snapshot", path, "--no-progress", "--tables", ODD_TABLE), 0, "copying 1 table(s)")
    sql(
        pg_db,
        f"INSERT INTO {ODD_TABLE} VALUES (2000, E'tab\\there', NULL, NULL)",
        f"UPDATE {ODD_TABLE2} SET \"V\" = 'w'",
    )
    sql(pg_db, "SET synchronous_commit = on", "CREATE TEMP TABLE flush_wal(x int)")
    check_output(cdc("stream", path, "--until", "current"), 0)

    run = cdc("log", "read", path, "--table", ODD_TABLE, "--keys")
    check_output(run, 0)
    records = [orjson.loads(line) for line in run.out.splitlines()]
    assert {r["table"] for r in records} == {ODD_TABLE}
    assert {r["value"]["source"]["schema"] for r in records if r["value"]} == {"Sch.ema"}
    assert {r["value"]["source"]["table"] for r in records if r["value"]} == {'Tab"le, ü'}
    assert {'Id "k"'} == {k for r in records for k in r["key"]}
    last = [r for r in records if r["key"] == {'Id "k"': 2000}][-1]["value"]["after"]
    plain = cdc("log", "read", path, "--table", ODD_TABLE)  # values only: the same envelopes, no tombstones
    check_output(plain, 0)
    drop_ts = [{**orjson.loads(line), "ts_ms": 0} for line in plain.out.splitlines()]
    assert drop_ts == [{**r["value"], "ts_ms": 0} for r in records if r["value"] is not None]
    assert last == {'Id "k"': 2000, 'Col "x"': "tab\there", "a.b, c": None, "ÄÖÜ": None}

    state = materialize(tmp_path / ".cdc" / "test" / "log")
    assert state[ODD_TABLE] == source_rows(pg_db, ODD_TABLE, ['Id "k"'])
    assert state[ODD_TABLE2] == source_rows(pg_db, ODD_TABLE2, ["K"])


# ---- order of commands ---------------------------------------------------------------------------------------
def test_stream_before_snapshot(pg: LocalPostgres, pg_db: str, tmp_path: Path) -> None:
    sql(pg_db, "CREATE TABLE t(id int PRIMARY KEY)")
    path = write_pipeline(tmp_path, pg_db, ["public.t"])
    # a missing slot is a slot problem: exit 3 like a dropped or busy one (README "Exit codes")
    check_error(
        cdc("stream", path),
        SOURCE,
        "replication slot cdc_test does not exist",
        "cdc snapshot",
        secrets=[pg.password],
    )
    check_error(cdc("stream", path, "--until", "current"), SOURCE, "cdc snapshot")
    assert_nothing_created(pg_db)


def test_stream_with_bad_until(pg_db: str, tmp_path: Path) -> None:
    path = write_pipeline(tmp_path, pg_db, ["public.t"])
    check_error(cdc("stream", path, "--until", "yesterday"), USAGE, "--until", "0/16B3748")


def test_pipeline_file_missing(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yml"
    run = cdc("validate", missing)
    check_output(run, USAGE, str(missing), "does not exist")
    assert run.err.startswith("error:")
    assert not os.path.exists(missing)
