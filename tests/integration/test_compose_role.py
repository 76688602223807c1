"""docker-compose.yml's PostgreSQL init scripts on a real server (no Docker here): shop.sql and
cdc-role.sh run as the image would run them at first start (psql as the superuser, the password
from a secret file), and the pipeline's role they make is enough for `cdc validate` and
`cdc snapshot` (README "Operations", "Running in containers"; Security, "Least-privilege role")."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from pipelines.devservices.postgres import LOOPBACK, SUPERUSER, LocalPostgres
from tests.fixtures.capture import no_traceback
from tests.harness import REPO, cdc, sql, write_pipeline

pytestmark = pytest.mark.integration

EXAMPLES = REPO / "pipelines" / "examples"


def test_compose_init_scripts_make_a_role_the_pipeline_can_use(
    pg: LocalPostgres, pg_db: str, tmp_path: Path
) -> None:
    dbname = pg_db.rsplit("/", 1)[1]
    role, password = f"cdc_{uuid.uuid4().hex[:8]}", f"Pw{uuid.uuid4().hex}"
    secret = tmp_path / "cdc_pg_password"
    secret.write_text(password + "\n")
    env = {
        **os.environ,
        "PGHOST": LOOPBACK,
        "PGPORT": str(pg.port),
        "PGPASSWORD": pg.password,
        "POSTGRES_USER": SUPERUSER,
        "POSTGRES_DB": dbname,
        "CDC_PG_PASSWORD_FILE": str(secret),
        "CDC_PG_USER": role,
    }
    psql = ["psql", "-v", "ON_ERROR_STOP=1", "-q", "--username", SUPERUSER, "--dbname", dbname]
    try:
        subprocess.run(
            [*psql, "-f", EXAMPLES / "shop.sql"], env=env, check=True, capture_output=True, timeout=120
        )
        done = subprocess.run(
            ["sh", EXAMPLES / "cdc-role.sh"], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done
        assert password not in done.stdout + done.stderr
        assert sql(pg.dsn(), f"SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = '{role}'") == [
            (False, True)
        ]

        file = write_pipeline(
            tmp_path,
            pg.dsn(dbname, user=role, password=password),
            ["public.customers", "public.products", "public.orders"],
            name="shop",
            state_dir=str(tmp_path / "state"),
        )
        for verb in (["validate", file], ["snapshot", file, "--no-progress"]):
            run = cdc(*verb)
            assert run.code == 0, (verb, run)
            no_traceback(run)
            assert password not in run.out + run.err
    finally:
        sql(pg_db, f"DROP OWNED BY {role}")  # the slot is dropped with the test's database
        sql(pg.dsn(), f"DROP ROLE IF EXISTS {role}")
