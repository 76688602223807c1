"""Watermark-based chunked snapshots (issue 14 item 1; snapshot/chunked.py) against a real PostgreSQL:
short transactions only, kill -9 and resume at the next chunk, a source written to (updates that keep
TOAST values, deletes, primary-key changes) while `cdc stream` runs, and the least-privilege rights."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import psycopg2
import pytest

from cdc.ground.tables import TableName
from cdc.log.local import LocalLog
from tests.fixtures.lake import cut_operations
from tests.fixtures.readers import delta_rows
from tests.harness import (
    apply_once,
    cdc,
    cdc_popen,
    materialize,
    source_rows,
    sql,
    stream_changes,
    verify,
    write_pipeline,
)

pytestmark = pytest.mark.integration

BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 80))"  # ~2.5 kB: TOASTed


def make_table(dsn: str, name: str, rows: int, pad: int = 0) -> None:
    small = f"rpad('small ' || g, {pad}, '.')" if pad else "'small ' || g"
    sql(
        dsn,
        f"CREATE TABLE {name}(id int PRIMARY KEY, n int NOT NULL, big text)",
        f"INSERT INTO {name} SELECT g, 0, CASE WHEN g % 997 = 0 THEN {BIG} ELSE {small} END FROM generate_series(1, {rows}) g",
        f"ANALYZE {name}",
    )


class Writer(threading.Thread):
    """Random changes to a table until stopped: updates that keep the TOAST value (n only), updates of
    everything, deletes, inserts (also below keys already copied) and primary-key changes."""

    def __init__(self, dsn: str, table: str, seed: int, key_space: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.table, self.rng, self.key_space = dsn, table, random.Random(seed), key_space
        self.stop = threading.Event()
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        t, rng = self.table, self.rng
        try:
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    key = rng.randint(1, self.key_space)
                    pick = rng.random()
                    if pick < 0.35:
                        cur.execute(f"UPDATE {t} SET n = n + 1 WHERE id = %s", (key,))
                    elif pick < 0.5:
                        cur.execute(f"UPDATE {t} SET n = n + 1, big = {BIG} WHERE id = %s", (key,))
                    elif pick < 0.65:
                        cur.execute(f"DELETE FROM {t} WHERE id = %s", (key,))
                    elif pick < 0.8:
                        cur.execute(f"INSERT INTO {t} VALUES (%s, 1, 'new') ON CONFLICT DO NOTHING", (key,))
                    else:  # a primary-key change, to a key above or below (of a row without a TOASTed
                        # value: the stream reads those back by the new key, which a second quick move defeats)
                        new = rng.randint(1, self.key_space * 2)
                        cur.execute(
                            f"UPDATE {t} SET id = %s WHERE id = %s AND length(big) < 1000"
                            f" AND NOT EXISTS (SELECT 1 FROM {t} WHERE id = %s)",
                            (new, key, new),
                        )
                    self.done += 1
                    time.sleep(0.002)
        except BaseException as exc:  # surfaced by finish()
            self.error = exc
        finally:
            conn.close()

    def finish(self) -> None:
        self.stop.set()
        self.join(30)
        assert self.error is None, self.error


class XminSampler(threading.Thread):
    """Samples backend_xmin of the snapshot's connections (pg_stat_activity) until stopped."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.samples: list[dict[int, tuple[str, int | None, int | None]]] = []

    def run(self) -> None:
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            while not self.stop.is_set():
                cur.execute(
                    "SELECT pid, application_name, backend_xmin::text::bigint, age(backend_xmin) FROM pg_stat_activity"
                    " WHERE application_name LIKE 'cdc snapshot%%' AND datname = current_database()"
                )
                self.samples.append({pid: (app, xmin, age) for pid, app, xmin, age in cur.fetchall()})
                time.sleep(0.001)
        conn.close()


def checkpoint(state_dir: Path, table: str) -> dict | None:
    path = state_dir / "chunked" / f"{table}.json"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def test_chunked_snapshot_of_an_idle_source_finishes_by_itself(pg_db: str, tmp_path: Path):
    """Nothing written, no stream running: the snapshot streams up to its own last watermark (whose
    transaction commits exactly at the LSN pg_logical_emit_message returned) and stops there."""
    make_table(pg_db, "t", 120)
    pipe = write_pipeline(tmp_path, pg_db, ["public.t"], snapshot={"mode": "chunked", "chunk_rows": 50})
    run = cdc("snapshot", pipe, "--no-progress", timeout=120)
    assert run.code == 0, run.err + run.out
    assert "public.t: 120 rows in 3 chunk(s)" in run.out, run.out
    state = tmp_path / ".cdc" / "test"
    assert materialize(state / "log")["public.t"] == source_rows(pg_db, "public.t", ["id"])


def idle_reader_stalled(dsn: str) -> int | None:
    """SIGSTOP a chunk reader's backend while it is between chunks (idle: no snapshot, no lock, no
    latch held), so its next chunk stays unread while the other reader goes on; its pid, or None
    when no reader was idle just then. A stopped backend cannot change its pg_stat_activity state:
    still idle once stopped means it was stopped idle, else it is let go again."""
    states = ("idle", "idle in transaction")
    query = (
        "SELECT pid, state FROM pg_stat_activity WHERE application_name = 'cdc snapshot chunk'"
        " AND datname = current_database()"
    )
    for pid, state in sql(dsn, query):
        if state in states:
            os.kill(pid, signal.SIGSTOP)
            if dict(sql(dsn, query)).get(pid) in states:
                return pid
            os.kill(pid, signal.SIGCONT)
    return None


def part_files(state_dir: Path) -> list[int]:
    """Chunk numbers of the segment files being read or read and not yet in the log (.part)."""
    return sorted(int(p.stem[1:]) for p in (state_dir / "log" / "segments").glob("t*/s*/c*.part"))


def copied_keys(state_dir: Path, table: str) -> list[bytes | None]:
    """The keys of the snapshot rows of the table's current base in the log."""
    name = TableName.parse(table)
    log = LocalLog(state_dir / "log", readonly=True)
    try:
        base = log.latest_cut().tables[name]
        return [r.key for r in log.read(name, base.base - 1, base.end) if r.op == "r"]
    finally:
        log.close()


def test_chunks_finish_out_of_order_with_writes_into_both_ranges(pg_db: str, tmp_path: Path):
    """Two chunks in flight: one reader is stalled before its chunk c while the other reads c+1 and
    goes on; then writes into both key ranges (updates, a delete, inserts into the range read and
    the one not read, key changes from each range into the other); let go, c is read last, the
    chunks join the log in chunk order and the log ends as the source, no key copied twice."""
    sql(
        pg_db,
        "CREATE TABLE s(id int PRIMARY KEY, n int NOT NULL, big text)",
        "INSERT INTO s SELECT 2 * g, 0, 'row ' || g FROM generate_series(1, 400) g",  # even keys: room for odd ones
        "ANALYZE s",
    )
    snap = {"mode": "chunked", "chunk_rows": 50, "max_rows_per_s": 200}  # chunk i: keys (100 i, 100 i + 100]
    pipe = write_pipeline(tmp_path, pg_db, ["public.s"], snapshot=snap)
    state = tmp_path / ".cdc" / "test"
    proc = cdc_popen("snapshot", pipe, "--no-progress", "--parallel", "2")
    stalled = None
    try:
        while (cp := checkpoint(state, "public.s")) is None or not cp["chunks"] or stalled is None:
            assert proc.poll() is None, proc.communicate()
            if cp is not None and cp["chunks"]:
                stalled = idle_reader_stalled(pg_db)
            time.sleep(0.02)
        while len(parts := part_files(state)) < 3:  # the stalled chunk, the one after it read, one more
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        c = parts[0]
        assert len(checkpoint(state, "public.s")["chunks"]) == c  # c+1 was read before c: it waits
        base = 100 * c
        sql(
            pg_db,
            f"UPDATE s SET n = n + 1, big = 'changed' WHERE id = {base + 10}",  # in c, not read yet
            f"UPDATE s SET n = n + 1 WHERE id = {base + 110}",  # in c+1, read
            f"DELETE FROM s WHERE id = {base + 120}",
            f"INSERT INTO s VALUES ({base + 131}, 1, 'new in the range read')",
            f"INSERT INTO s VALUES ({base + 31}, 1, 'new in the range not read')",
            f"UPDATE s SET id = {base + 41} WHERE id = {base + 140}",  # from the range read into the other
            f"UPDATE s SET id = {base + 151} WHERE id = {base + 50}",  # and the other way
        )
    finally:
        if stalled is not None:
            os.kill(stalled, signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "rows in 8 chunk(s)" in out and "(2 reader(s);" in out, out  # 400 keys: no empty 9th chunk
    stream_changes(pipe, pg_db)
    assert materialize(state / "log")["public.s"] == source_rows(pg_db, "public.s", ["id"])
    keys = copied_keys(state, "public.s")
    assert len(keys) == len(set(keys))  # no key copied twice


def test_chunked_snapshot_holds_no_long_transaction_and_resumes_after_kill(pg_db: str, tmp_path: Path):
    """Two readers read chunks side by side; one is stalled between chunks, so the other reads the
    chunks after its one (out of order) and they wait for it; kill -9 then, and the same command
    resumes at the stalled chunk: the log ends as the source, no row copied twice."""
    make_table(pg_db, "t", 40_000, pad=150)  # chunks of 4,000 rows: each read lasts long enough to be seen
    pipe = write_pipeline(
        tmp_path,
        pg_db,
        ["public.t"],
        snapshot={"mode": "chunked", "chunk_rows": 4000, "max_rows_per_s": 16000},
    )
    state = tmp_path / ".cdc" / "test"
    first_xid = int(sql(pg_db, "SELECT txid_current()")[0][0])
    writer = Writer(pg_db, "t", seed=1, key_space=41_000)  # writes into every range, read or not
    sampler = XminSampler(pg_db)
    writer.start()
    sampler.start()
    proc = cdc_popen("snapshot", pipe, "--no-progress", "--parallel", "2")
    stalled = None
    try:
        while (cp := checkpoint(state, "public.t")) is None or not cp["chunks"] or stalled is None:
            assert proc.poll() is None, proc.communicate()
            if cp is not None and cp["chunks"]:
                stalled = idle_reader_stalled(pg_db)
            time.sleep(0.02)
        while len(parts := part_files(state)) < 3:  # the stalled chunk, one read after it, one started
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        killed_at = len(checkpoint(state, "public.t")["chunks"])
        proc.send_signal(signal.SIGKILL)  # kill -9 with chunks read out of order, not in the log
        proc.wait(30)
    finally:
        sampler.stop.set()
        sampler.join(10)
        if proc.poll() is None:
            proc.kill()
        if stalled is not None:
            os.kill(stalled, signal.SIGCONT)  # it finds its client gone and ends
    assert parts[0] == killed_at and parts[-1] >= killed_at + 2, (parts, killed_at)
    xids_during = int(sql(pg_db, "SELECT txid_current()")[0][0]) - first_xid

    # No transaction outlived a chunk: each reading connection was seen between chunks with no
    # snapshot at all, an xmin once given up never came back (no snapshot spans chunks), and no
    # xmin of the snapshot's connections was ever older than a fraction of the run's transactions.
    readers: dict[int, list[int | None]] = {}
    for sample in sampler.samples:
        for pid, (app, xmin, _age) in sample.items():
            if app == "cdc snapshot chunk":
                readers.setdefault(pid, []).append(xmin)
    assert len(readers) == 2, readers.keys()
    chunks_seen = 0
    for xmins in readers.values():
        assert None in xmins, "a chunk reader never closed its transaction"
        held = [xmin for xmin in xmins if xmin is not None]
        runs = [x for i, x in enumerate(held) if i == 0 or held[i - 1] != x]
        assert len(runs) == len(set(runs)), runs  # one xmin per chunk, each given up for good
        chunks_seen += len(runs)
    assert chunks_seen >= 2, readers
    ages = [age for sample in sampler.samples for _, xmin, age in sample.values() if xmin is not None]
    assert xids_during > 100 and max(ages) < xids_during / 3, (max(ages), xids_during)

    run = cdc("snapshot", pipe, "--no-progress")  # the same command resumes
    writer.finish()
    assert run.code == 0, run.err + run.out
    assert f"resuming the chunked snapshot at chunk {killed_at}" in run.out + run.err, run.out + run.err
    assert checkpoint(state, "public.t") is None  # finished: the checkpoint is gone
    assert not part_files(state)  # the chunks read before the kill were read again, in place
    stream_changes(pipe, pg_db)
    assert materialize(state / "log")["public.t"] == source_rows(pg_db, "public.t", ["id"])
    copied = copied_keys(state, "public.t")
    assert copied and len(copied) == len(set(copied))  # no key copied twice


def test_chunked_snapshot_while_streaming_and_writing(pg_db: str, tmp_path: Path, spark):
    """`cdc snapshot --tables` copies a live table again in chunks while `cdc stream` runs and the
    table is written to; the follower ends as the source (cdc verify 0, delta-rs, the log replayed).
    A Delta follower appends a cut of inserts alone (sinks/delta/sink.py _appends), before the
    chunked snapshot and after it; the cut that takes the chunks as the table's new base (their
    snapshot rows and the stream's changes of the same keys, the appended ones among them) MERGEs."""
    make_table(pg_db, "b", 300)
    lake = tmp_path / "lake"
    lake_b = lake / "public" / "b"
    sinks = [{"name": "lake", "delta": {"path": str(lake)}}]
    snap = {"tables": {"public.b": "exported"}, "chunk_rows": 25}
    pipe = write_pipeline(tmp_path, pg_db, ["public.b"], sinks=sinks, snapshot=snap)
    assert cdc("snapshot", pipe, "--no-progress").code == 0  # the slot, and b's first base (exported)
    apply_once(pipe, spark)
    sql(pg_db, "INSERT INTO b SELECT g, 0, 'appended' FROM generate_series(1000, 1009) g")
    stream_changes(pipe, pg_db)
    (run,) = apply_once(pipe, spark)
    assert cut_operations(lake_b, run.cut_id) == ["WRITE"]
    stream = cdc_popen("stream", pipe)
    writer = Writer(pg_db, "b", seed=3, key_space=330)
    try:
        # the stream holds the slot before the snapshot starts (else the snapshot streams itself)
        held = "SELECT bool_or(active) FROM pg_replication_slots WHERE database = current_database()"
        while not sql(pg_db, held)[0][0]:
            assert stream.poll() is None, stream.communicate()
            time.sleep(0.05)
        writer.start()
        pipe = write_pipeline(
            tmp_path, pg_db, ["public.b"], sinks=sinks, snapshot={**snap, "tables": {"public.b": "chunked"}}
        )
        run = cdc("snapshot", pipe, "--tables", "public.b", "--no-progress")
        assert run.code == 0, run.err + run.out
        assert "public.b: chunked snapshot from" in run.out, run.out
        assert "no stream is running" not in run.out  # the running stream passed the watermarks
        writer.finish()
        assert writer.done > 50
    finally:
        writer.stop.set()
        stream.send_signal(signal.SIGTERM)
        stream.wait(60)
    state = tmp_path / ".cdc" / "test"
    stream_changes(pipe, pg_db)
    expected = source_rows(pg_db, "public.b", ["id"])
    assert materialize(state / "log")["public.b"] == expected
    (run,) = apply_once(pipe, spark)
    assert cut_operations(lake_b, run.cut_id) == ["MERGE"]  # the new base
    code, report = verify(pipe, spark)
    assert code == 0, report
    held = delta_rows(spark, lake_b)  # delta-rs: fails on a key held twice
    assert {k: (r["n"], r["big"]) for k, r in held.items()} == {
        k: (int(r["n"]), r["big"]) for k, r in expected.items()
    }
    sql(pg_db, "INSERT INTO b SELECT g, 0, 'appended' FROM generate_series(2000, 2009) g")
    stream_changes(pipe, pg_db)
    (run,) = apply_once(pipe, spark)
    assert cut_operations(lake_b, run.cut_id) == ["WRITE"]
    held = delta_rows(spark, lake_b)
    assert {k: r["n"] for k, r in held.items()} == {
        k: int(r["n"]) for k, r in source_rows(pg_db, "public.b", ["id"]).items()
    }


def test_watermarks_need_only_execute_and_validate_names_the_grant(pg_db: str, tmp_path: Path):
    """A REPLICATION role with SELECT can write watermarks (PUBLIC may execute pg_logical_emit_message
    by default); where that right was revoked, `cdc validate` names the GRANT (exit 3)."""
    import uuid

    from psycopg2.extensions import make_dsn

    make_table(pg_db, "t", 10)
    role = "cdc_wm_" + uuid.uuid4().hex[:8]
    sql(
        pg_db,
        f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'wm-secret'",
        f"GRANT SELECT ON public.t TO {role}",
    )
    try:
        role_dsn = make_dsn(pg_db, user=role, password="wm-secret")
        lsn = sql(role_dsn, "SELECT pg_logical_emit_message(true, 'cdc_watermark', 'x')")[0][0]
        assert "/" in lsn
        sql(role_dsn, "SELECT pg_xact_status(x) FROM pg_snapshot_xip(pg_current_snapshot()) x")
        pipe = write_pipeline(tmp_path, role_dsn, ["public.t"], snapshot={"mode": "chunked"})
        sql(pg_db, "REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC")
        run = cdc("validate", pipe)
        assert run.code == 3, run.out + run.err
        out = run.out + run.err
        assert "pg_logical_emit_message" in out and "fix: GRANT EXECUTE" in out and f"TO {role};" in out, out
    finally:
        sql(pg_db, f"DROP OWNED BY {role}", f"DROP ROLE {role}")
