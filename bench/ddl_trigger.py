"""Cost of DDL capture (`cdc ddl install`, cdc/ddl.py) on a DDL-heavy migration.

One throwaway PostgreSQL (the newest Debian server, durable settings), one captured table and
one that is not. A migration of N ALTER TABLE statements (each in its own transaction, as a
migration tool runs them: ADD COLUMN ... DEFAULT, RENAME COLUMN, ALTER COLUMN ... TYPE
varchar(n) widening, SET DEFAULT, alternating) is timed three ways, interleaved, --repeat times:
without the trigger, with it on the captured table (each ALTER writes its message), and with
it on a table outside the publication (the trigger looks and writes nothing). Medians per
ALTER and the WAL each run wrote.

    .venv/bin/python bench/ddl_trigger.py [--alters 200] [--repeat 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdc import ddl
from pipelines.devservices.postgres import LocalPostgres

PIPELINE = "bench"
PUBLICATION = "cdc_bench"


def statements(table: str, n: int) -> list[str]:
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(f"ALTER TABLE {table} ADD COLUMN c{i} int DEFAULT {i}")
        elif kind == 1:
            out.append(f"ALTER TABLE {table} RENAME COLUMN c{i - 1} TO r{i - 1}")
        elif kind == 2:
            out.append(f"ALTER TABLE {table} ALTER COLUMN s TYPE varchar({100 + i})")  # no rewrite
        else:
            out.append(f"ALTER TABLE {table} ALTER COLUMN r{i - 3} SET DEFAULT {i}")
    return out


def reset(cur, table: str) -> None:
    cur.execute(f"DROP TABLE IF EXISTS {table}")
    cur.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, s varchar(100))")
    cur.execute(f"INSERT INTO {table} SELECT g, 'x' FROM generate_series(1, 1000) g")
    if table == "captured":  # a new table of the name: in the publication again
        cur.execute(f"ALTER PUBLICATION {PUBLICATION} SET TABLE {table}")


def migrate(conn, table: str, n: int) -> tuple[float, int]:
    """Seconds for the N ALTERs (autocommit: one transaction each) and the WAL bytes written."""
    with conn.cursor() as cur:
        reset(cur, table)
        cur.execute("CHECKPOINT")
        cur.execute("SELECT pg_current_wal_lsn()")
        start_lsn = cur.fetchone()[0]
        sqls = statements(table, n)
        started = time.perf_counter()
        for s in sqls:
            cur.execute(s)
        seconds = time.perf_counter() - started
        cur.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (start_lsn,))
        return seconds, int(cur.fetchone()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alters", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cdc-bench-ddl-") as work:
        Path(work).chmod(0o755)  # the server runs as the postgres user
        pg = LocalPostgres(Path(work) / "pg")
        pg.start()
        try:
            conn = psycopg2.connect(pg.dsn())
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SHOW server_version")
                version = cur.fetchone()[0]
                cur.execute("CREATE TABLE captured (id int PRIMARY KEY)")
                cur.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE captured")
            runs: dict[str, list[tuple[float, int]]] = {
                "no trigger": [],
                "trigger, captured table": [],
                "trigger, other table": [],
            }
            for _ in range(args.repeat):
                with conn.cursor() as cur:
                    for s in ddl.remove_statements(PIPELINE):
                        cur.execute(s)
                runs["no trigger"].append(migrate(conn, "captured", args.alters))
                with conn.cursor() as cur:
                    for s in ddl.install_statements(PIPELINE, PUBLICATION):
                        cur.execute(s)
                runs["trigger, captured table"].append(migrate(conn, "captured", args.alters))
                runs["trigger, other table"].append(migrate(conn, "other", args.alters))
            conn.close()
        finally:
            pg.stop()
    base = statistics.median(s for s, _ in runs["no trigger"])
    result = {"postgres": version, "alters": args.alters, "repeat": args.repeat, "runs": {}}
    print(
        f"PostgreSQL {version}: {args.alters} ALTER TABLE statements, one transaction each, median of {args.repeat}"
    )
    for name, values in runs.items():
        secs = statistics.median(s for s, _ in values)
        wal = statistics.median(w for _, w in values)
        result["runs"][name] = {
            "seconds": secs,
            "ms_per_alter": 1000 * secs / args.alters,
            "wal_bytes": wal,
            "all": values,
        }
        print(
            f"  {name:24s} {secs:7.3f} s  {1000 * secs / args.alters:6.2f} ms/ALTER  x{secs / base:4.2f}  "
            f"WAL {wal / 1024:8.1f} KiB"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
