"""`Bench`: one benchmark run. Its work dir, its services, its pipeline files and its timed commands.

Every cdc command runs as a user runs it: the real console entry (.venv/bin/cdc, next to the
interpreter) in a subprocess, pipeline files with `dsn: ${BENCH_DSN}`, timed from spawn to exit."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from cdc.session import libpq_options, run_sql
from harness.proc import Timed, checked, cluster_cpu_s, run_timed
from harness.services import DB, load_check, postgres
from pipelines.devservices.postgres import LocalPostgres, pg_bin_dir

BIN = Path(sys.executable).parent  # .venv/bin: the `cdc` console entry lives next to the interpreter


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path, stack: contextlib.ExitStack, results: dict):
        self.args = args
        self.work = work
        self.stack = stack  # services started on it stop when the run ends
        self.results = results
        self._pg: LocalPostgres | None = None

    # -- services ------------------------------------------------------------------------------------
    def start_postgres(self, *, durable: bool) -> LocalPostgres:
        self._pg, version = postgres(self.stack, self.work, durable=durable)
        self.results["config"].update(postgres=version, durable=durable)
        # The pipeline files say dsn: ${BENCH_DSN}; set here too for the pipelines loaded in-process.
        os.environ["BENCH_DSN"] = self.dsn
        return self._pg

    @property
    def pg(self) -> LocalPostgres:
        assert self._pg is not None, "start_postgres() first"
        return self._pg

    def load(self, where: str) -> float:
        return load_check(self.results["loadavg"], where)

    # -- SQL -----------------------------------------------------------------------------------------
    @property
    def dsn(self) -> str:
        return self.pg.dsn(DB)

    def sql(self, *statements: str, params: Any = None) -> list[tuple]:
        return run_sql(self.dsn, *statements, params=params)

    def lsn(self) -> str:
        return self.sql("SELECT pg_current_wal_lsn()::text")[0][0]

    def create_slot(self, slot: str) -> None:
        self.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", params=(slot,))

    def drop_slots(self, *slots: str) -> None:
        self.sql(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = ANY(%s)",
            params=(list(slots),),
        )

    # -- pipeline files and commands -----------------------------------------------------------------
    def state(self, name: str) -> Path:
        return self.work / "state" / name

    def pipeline(self, name: str, tables: list[str], **sections: Any) -> Path:
        """work/<name>.yml for these tables; `sections` are the file's other keys (log, sinks, spark,
        stream) and `slot`/`publication` of the source."""
        source = {"dsn": "${BENCH_DSN}", "tables": tables}
        for key in ("slot", "publication"):
            if key in sections:
                source[key] = sections.pop(key)
        doc = {"name": name, "source": {"postgres": source}, **sections, "state_dir": str(self.state(name))}
        path = self.work / f"{name}.yml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def local_log(self, name: str, synchronous: str = "full") -> dict[str, Any]:
        """The `log:` section of a local (SQLite) log under the pipeline's state dir."""
        return {"local": {"path": str(self.state(name) / "log"), "synchronous": synchronous}}

    def pg_env(self) -> dict[str, str]:
        """libpq environment for pg_recvlogical and psql, with cdc's session settings (same text output)."""
        return {
            **os.environ,
            "PGHOST": "127.0.0.1",
            "PGPORT": str(self.pg.port),
            "PGUSER": "postgres",
            "PGPASSWORD": self.pg.password,
            "PGDATABASE": DB,
            "PGOPTIONS": libpq_options(),
        }

    def cdc_env(self) -> dict[str, str]:
        """The environment of cdc commands. Python's bytecode cache is on (in work/pycache) even when
        the caller's environment turns it off (PYTHONDONTWRITEBYTECODE): an installed package has its
        .pyc files, and without them every command would compile cdc's modules again (~0.3 CPU-s)."""
        env = {**os.environ, "BENCH_DSN": self.dsn}  # (already set by start_postgres; explicit for clarity)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(self.work / "pycache")
        return env

    def warm_bytecode(self, *modules: str) -> None:
        """Fill the bytecode cache (cdc_env) with these modules and what they import, untimed."""
        argv = [sys.executable, "-c", "import " + ", ".join(modules)]
        checked(run_timed(argv, self.cdc_env(), self.work, "warm_bytecode"), "bytecode warm-up")

    def timed(
        self,
        argv: list[str],
        env: dict[str, str],
        name: str,
        *,
        stdout_null: bool = False,
        tree: bool = False,
    ) -> Timed:
        """run_timed, plus the CPU the cluster spent meanwhile (sampled when no backend is exiting)."""
        postmaster = self.pg.pid()
        time.sleep(0.2)  # backends of our earlier connections: exited and reaped, so counted once
        before = cluster_cpu_s(postmaster) if postmaster else None
        result = run_timed(argv, env, self.work, name, stdout_null=stdout_null, tree=tree)
        if before is not None:
            time.sleep(0.2)  # let the backends of the finished client exit and be reaped
            result.server_cpu_s = cluster_cpu_s(postmaster) - before
        return result

    def cdc(
        self,
        name: str,
        *args: str | Path,
        tree: bool = False,
        check: bool = True,
        env: dict[str, str] | None = None,
    ) -> Timed:
        """`cdc ARGS` timed (name: its output files in the work dir); it must succeed unless check=False.
        `env`: the whole environment instead of cdc_env() (e.g. another checkout's PYTHONPATH)."""
        run = self.timed([str(BIN / "cdc"), *map(str, args)], env or self.cdc_env(), name, tree=tree)
        return checked(run, f"cdc {' '.join(map(str, args[:1]))} ({name})") if check else run

    def recvlogical(self, name: str, slot: str, endpos: str, publication: str) -> Timed:
        """pg_recvlogical over a pgoutput slot up to endpos, into /dev/null: the walsender alone."""
        argv = [
            str(pg_bin_dir() / "pg_recvlogical"),
            "--start",
            "-S",
            slot,
            "-d",
            DB,
            "--no-loop",
            "-o",
            "proto_version=1",
            "-o",
            f"publication_names={publication}",
            "-E",
            endpos,
            "-f",
            "/dev/null",
        ]
        return checked(self.timed(argv, self.pg_env(), name), "pg_recvlogical")
