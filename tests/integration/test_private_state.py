"""State is owner-only whatever the umask (issue 24 item 2, cdc/ground/private.py): state_dir, the
log (SQLite files and snapshot segments), checkpoints, locks and verify's source copies are 0700
directories and 0600 files; verify's copies are gone when it ends; `cdc validate` warns when an
existing state_dir is group/world readable and its fix, run as printed, clears the warning.
The cycle runs as the least-privilege role README Security documents (LOGIN REPLICATION, SELECT on
the table, the publication made by the table's owner)."""

from __future__ import annotations

import os
import stat
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fixtures.capture import validate_warnings
from tests.harness import apply_once, cdc, sql, stream_changes, verify, write_pipeline

pytestmark = pytest.mark.integration


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """Relative path -> permission bits of root and everything under it."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for p in root.rglob("*"):
        out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def not_private(root: Path) -> dict[str, str]:
    return {
        rel: f"{mode:04o}"
        for rel, mode in modes(root).items()
        if mode != (0o700 if (root / rel).is_dir() else 0o600)
    }


@pytest.fixture
def least_privilege(pg_db: str) -> Iterator[str]:
    """The README's least-privilege role: LOGIN REPLICATION and SELECT on the table; the table and
    the publication belong to the superuser. Yields its DSN."""
    from psycopg2.extensions import make_dsn

    role = "cdc_priv_" + uuid.uuid4().hex[:8]
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'r' || g FROM generate_series(1, 50) g",
        f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'lp-secret'",
        f"GRANT SELECT ON public.t TO {role}",
        "CREATE PUBLICATION cdc_test FOR TABLE public.t WITH (publish_via_partition_root = true)",
    )
    try:
        yield make_dsn(pg_db, user=role, password="lp-secret")
    finally:
        sql(pg_db, f"DROP OWNED BY {role}", f"DROP ROLE {role}")


def test_state_is_owner_only_whatever_the_umask(
    pg_db: str, least_privilege: str, tmp_path: Path, spark
) -> None:
    """The whole cycle also runs as the least-privilege role (README Security)."""
    state = tmp_path / "state" / "shop"  # neither directory exists yet: both are created by the tool
    file = write_pipeline(
        tmp_path,
        least_privilege,
        ["public.t"],
        state_dir=str(state),
        sinks=[{"name": "lake", "delta": {"path": str(tmp_path / "lake")}}],
    )
    with umask(0o022):  # the usual umask: files would be 0644 in 0755 directories
        assert cdc("snapshot", file).code == 0
    log = state / "log"
    assert (log / "log.db").exists() and list((log / "segments").rglob("*.copy"))
    assert not_private(tmp_path / "state") == {}

    with umask(0o000):  # nothing taken away: files would be 0666 in 0777 directories
        sql(pg_db, "UPDATE t SET v = 'u' WHERE id <= 5", "INSERT INTO t VALUES (51, 'new')")
        stream_changes(file, pg_db)
        apply_once(file, spark)
        code, report = verify(file, spark)
        assert code == 0, report

        from cdc.ground.private import private_dir
        from cdc.ground.tables import TableName
        from cdc.log import open_log_view
        from pipelines.verify_source import copy_source
        from sinks.registry import load_pipeline

        pipeline = load_pipeline(file)
        workdir = private_dir(state / "verify-copy")
        view = open_log_view(pipeline)
        try:
            schemas = {TableName("public", "t"): view.schema(TableName("public", "t"))}
        finally:
            view.close()
        version = int(sql(pg_db, "SHOW server_version_num")[0][0])
        copied = copy_source(pipeline, version, schemas, workdir)
        assert [stat.S_IMODE(p.stat().st_mode) for p in copied.files.values()] == [0o600]
        assert copied.files[TableName("public", "t")].stat().st_size > 0
        (copied.files[TableName("public", "t")]).unlink()
        workdir.rmdir()

    names = set(modes(state))
    for made in ("log/log.db", "log/log.db-wal", "checkpoints/lake.json", "locks/apply.lake.lock"):
        assert made in names, (made, sorted(names))
    assert not any(n.startswith("verify-") for n in os.listdir(state))  # verify's copies are cleaned up
    # Spark's warehouse (made by Hadoop with its own modes, when the CLI starts Spark) sits in the
    # 0700 state_dir; everything else is 0700/0600
    assert {k: v for k, v in not_private(tmp_path / "state").items() if not k.startswith("shop/spark")} == {}

    # an existing state_dir others can read: validate warns (exit unchanged) with a fix that works
    os.chmod(state, 0o755)
    run = cdc("validate", file)
    assert run.code == 0, run
    assert f"warn state_dir {state}: group and world can read or enter it (mode 0755)" in run.out, run.out
    fix = next(line.split("fix: ", 1)[1] for line in run.out.splitlines() if "fix: chmod" in line)
    assert fix == f"chmod -R go-rwx {state}"
    subprocess.run(fix, shell=True, check=True)
    again = cdc("validate", file)
    assert again.code == 0 and validate_warnings(again.out) == [], again.out
