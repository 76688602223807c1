"""Workers that COPY table chunks, inside one exported snapshot, into segment files.

Each worker is a thread with its own connection and one REPEATABLE READ transaction that
imports the exported snapshot, so every chunk of every table sees the same database state.
COPY output goes to the file as PostgreSQL sends it; psycopg2 releases the GIL while it
waits on the socket, so threads overlap their copies.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg2
from psycopg2 import sql

from cdc.filters import select_query
from cdc.ground.private import private_dir, private_open
from cdc.ground.tables import TableName
from cdc.source import connect
from snapshot.chunks import Chunk


@dataclass(frozen=True)
class CopyJob:
    table: TableName
    columns: tuple[str, ...]
    snapshot_id: int
    chunk: Chunk
    path: Path
    where: str | None = None  # source.postgres.table_options row filter (the publication's too)


@dataclass(frozen=True)
class CopyDone:
    job: CopyJob
    rows: int
    nbytes: int


def count_lines(path: Path) -> int:
    """Rows in a COPY text file (one line each; newlines inside values are escaped)."""
    n = 0
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            n += block.count(b"\n")
    return n


def copy_statement(job: CopyJob) -> sql.Composed:
    """COPY of the job's chunk: the captured columns and rows (cdc.filters.select_query, which the
    publication's column list and row filter match) within the chunk's pages."""
    chunk = job.chunk
    conds: list[sql.Composable] = []
    if not chunk.whole_table:
        conds.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({chunk.first_page},0)")))
        if chunk.end_page is not None:
            conds.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({chunk.end_page},0)")))
    return sql.SQL("COPY ({}) TO STDOUT").format(select_query(job.table, job.columns, job.where, conds))


class CopyPool:
    """Runs CopyJobs on N worker threads; results and errors come back on `results`."""

    def __init__(self, dsn: str, snapshot_name: str, workers: int, on_rows: Callable[[int], None]):
        self.dsn = dsn
        self.snapshot_name = snapshot_name
        self.jobs: queue.Queue[CopyJob | None] = queue.Queue()
        self.results: queue.Queue[CopyDone | BaseException] = queue.Queue()
        self.on_rows = on_rows
        self.stop = threading.Event()
        self.ready = threading.Barrier(workers + 1)
        self._conns: list = []
        self._threads = [
            threading.Thread(target=self._work, name=f"copy-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def wait_imported(self, timeout: float = 120) -> None:
        """Block until every worker has imported the snapshot (then the exporter may go away)."""
        self.ready.wait(timeout)

    def submit(self, job: CopyJob) -> None:
        self.jobs.put(job)

    def close(self) -> None:
        for _ in self._threads:
            self.jobs.put(None)

    def cancel(self) -> None:
        self.stop.set()
        for conn in list(self._conns):
            with contextlib.suppress(psycopg2.Error):
                conn.cancel()
        self.close()

    def join(self, timeout: float = 30) -> None:
        for t in self._threads:
            t.join(timeout)

    def _work(self) -> None:
        conn = None
        try:
            conn = connect(self.dsn, autocommit=False, application_name="cdc snapshot copy")
            self._conns.append(conn)
            conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION SNAPSHOT %s", (self.snapshot_name,))
        except BaseException as exc:
            self.results.put(exc)
            self.ready.abort()
            return
        try:
            self.ready.wait()
            while not self.stop.is_set():
                job = self.jobs.get()
                if job is None:
                    break
                self.results.put(self._copy(conn, job))
        except BaseException as exc:  # surfaced to the coordinating thread
            self.results.put(exc)
        finally:
            try:
                conn.rollback()
                conn.close()
            except psycopg2.Error:
                pass

    def _copy(self, conn, job: CopyJob) -> CopyDone:
        private_dir(job.path.parent)
        tmp = job.path.with_suffix(".part")
        # A plain buffered file: psycopg2 calls its C-level write() once per row, so no Python
        # code runs per row (that, and the GIL it needs, was the cost with several workers).
        with private_open(tmp, "wb", buffering=4 << 20) as sink:
            with conn.cursor() as cur:
                cur.copy_expert(copy_statement(job).as_string(conn), sink, size=1 << 20)
            sink.flush()
            os.fsync(sink.fileno())
            nbytes = sink.tell()
        rows = count_lines(tmp)
        os.replace(tmp, job.path)
        self.on_rows(rows)
        return CopyDone(job, rows, nbytes)
