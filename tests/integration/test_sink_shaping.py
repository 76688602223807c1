"""Per-sink columns, masks and renames (issue 17 item 2, README "Choosing what is captured").

One log feeds a full lake and trimmed, masked, renamed followers: a tantivy search index, a
Redis cache and an SCD2 Delta history. Each follower is read back with its engine's own reader
(delta-rs, tantivy, redis-py), compared with the source's values masked in plain Python
(hmac), and `cdc verify` compares each shaped follower with the source shaped the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from cdc.ground import logsetup
from cdc.ground.errors import PipelineFileError
from pipelines.apply.job import ApplyJob
from sinks.registry import load_pipeline
from snapshot.runner import run_snapshot
from tests.fixtures.readers import delta_rows, redis_rows, tantivy_docs
from tests.harness import apply_once, cdc, source_rows, sql, stream_changes, verify, write_pipeline

pytestmark = pytest.mark.integration

KEY = "test-mask-key-0123456789"
REDACTED = "[redacted]"


def hashed(text: str | None) -> str | None:
    import hashlib
    import hmac

    return None if text is None else hmac.new(KEY.encode(), text.encode(), hashlib.sha256).hexdigest()


def pipeline(tmp_path: Path, dsn: str, redis_url: str, search_options: dict | None = None) -> Path:
    users = "public.users"
    search = {
        "exclude_columns": ["password_hash"],
        "mask": {"email": "hash", "phone": "redact", "notes": "null"},
        "rename": "people",
    }
    return write_pipeline(
        tmp_path,
        dsn,
        [users],
        sinks=[
            {"name": "lake", "delta": {"path": str(tmp_path / "lake")}},
            {
                "name": "hist",
                "delta": {
                    "path": str(tmp_path / "hist"),
                    "mode": "scd2",
                    "mask_key": "${CDC_MASK_KEY}",
                    "table_options": {
                        users: {
                            "exclude_columns": ["password_hash"],
                            "mask": {"email": "hash"},
                            "rename": "users_hist",
                        }
                    },
                },
            },
            {
                "name": "search",
                "search": {
                    "path": str(tmp_path / "search"),
                    "tables": [users],
                    "mask_key": "${CDC_MASK_KEY}",
                    "table_options": {users: search_options or search},
                },
            },
            {
                "name": "cache",
                "redis": {
                    "url": redis_url,
                    "tables": [users],
                    "mask_key": "${CDC_MASK_KEY}",
                    "table_options": {
                        users: {
                            "columns": ["email", "age"],
                            "mask": {"email": "hash", "id": "hash"},  # a hashed key column
                            "rename": "users_cache",
                        }
                    },
                },
            },
        ],
    )


def check_followers(tmp_path: Path, dsn: str, redis_url: str, spark) -> None:
    source = {k[0]: v for k, v in source_rows(dsn, "public.users", ["id"]).items()}
    # the full lake: every column, values as they are
    lake = delta_rows(spark, tmp_path / "lake" / "public" / "users")
    assert {k[0]: (r["email"], r["password_hash"]) for k, r in lake.items()} == {
        k: (r["email"], r["password_hash"]) for k, r in source.items()
    }
    # the search index, renamed: no password_hash, email hashed, phone redacted, notes NULL
    docs = tantivy_docs(tmp_path / "search" / "people")
    assert not (tmp_path / "search" / "public").exists()
    assert len(docs) == len(source)
    for doc in docs.values():
        row = source[str(doc["id"])]
        assert "password_hash" not in doc
        assert doc["email"] == hashed(row["email"]) and doc["phone"] == (REDACTED if row["phone"] else None)
        assert doc.get("notes") is None
        # a document written before a column was added lacks it: readers take the column's default
        assert doc.get("nickname", "nick" if "nickname" in row else None) == row.get("nickname")
    # the cache, renamed: only the key (hashed: keys stay distinct) and the listed columns
    client = redis.Redis.from_url(redis_url)
    try:
        cached = redis_rows(client, "users_cache:")
        assert not redis_rows(client, "public.users:")
    finally:
        client.close()
    by_hash = {hashed(k): row for k, row in source.items()}
    assert set(cached) == {f"users_cache:{h}" for h in by_hash}
    for key, value in cached.items():
        row = by_hash[key.split(":", 1)[1]]
        assert value["id"] == hashed(row["id"])
        assert set(value) - {"_cdc_lsn", "_cdc_seq", "_cdc_op", "_cdc_commit_ts"} == {"id", "email", "age"}, (
            value
        )
        assert value["email"] == hashed(row["email"]) and str(value["age"]) == row["age"]
    # the SCD2 history, renamed: every version's email hashed, the current one the source's
    history = delta_rows(spark, tmp_path / "hist" / "users_hist", key=("id", "_cdc_start_lsn"))
    assert all("password_hash" not in r for r in history.values())
    emails = {r["email"] for r in history.values()}
    assert not any("@" in e for e in emails if e), emails
    current = {str(r["id"]): r["email"] for r in history.values() if r["_cdc_end_lsn"] is None}
    assert current == {k: hashed(r["email"]) for k, r in source.items()}


def test_one_log_feeds_a_full_lake_and_masked_renamed_followers(
    pg_db: str, redis_db: str, tmp_path: Path, spark, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CDC_MASK_KEY", KEY)
    sql(
        pg_db,
        "CREATE TABLE users (id int PRIMARY KEY, email text, phone text, notes text, password_hash text, age int, scratch text)",
        "INSERT INTO users SELECT i, 'user' || i || '@example.com', CASE WHEN i % 5 <> 0 THEN '+1-555-' || i END,"
        " 'note ' || i, md5(i::text), 20 + i, 'x' FROM generate_series(1, 30) i",
    )
    f = pipeline(tmp_path, pg_db, redis_db)
    run_snapshot(load_pipeline(f), progress=False)  # the snapshot path (bootstrap)
    apply_once(f, spark)
    check_followers(tmp_path, pg_db, redis_db, spark)

    # the stream, and schema changes: a masked column stays masked after columns come and go
    sql(
        pg_db,
        "UPDATE users SET email = 'new' || id || '@example.org', phone = NULL WHERE id <= 4",
        "DELETE FROM users WHERE id = 30",
        "ALTER TABLE users ADD COLUMN nickname text DEFAULT 'nick'",
        "ALTER TABLE users DROP COLUMN scratch",
        "INSERT INTO users (id, email, phone, notes, password_hash, age) VALUES (31, 'late@example.com', '+1-555-31', 'n', 'h', 51)",
        "UPDATE users SET email = 'again' || id || '@example.net' WHERE id IN (2, 31)",
    )
    stream_changes(f, pg_db)
    with logsetup.collected() as lines:
        runs = ApplyJob(load_pipeline(f), spark).run_once()
    assert all(r.error is None and not r.up_to_date for r in runs), runs
    # markers are found under the renamed names: no follower looks as if it lost its data
    assert not any("lost data" in line for line in lines), lines
    check_followers(tmp_path, pg_db, redis_db, spark)
    code, report = verify(f, spark)
    assert code == 0, report
    assert KEY not in report and KEY not in "\n".join(lines)

    # verify compares masked values, not just keys: a follower's hashed value changed by hand is found
    client = redis.Redis.from_url(redis_db)
    try:
        value = json.loads(client.get(f"users_cache:{hashed('3')}"))
        client.set(f"users_cache:{hashed('3')}", json.dumps({**value, "email": hashed("someone@else.com")}))
    finally:
        client.close()
    code, report = verify(f, spark, "cache")
    assert code == 1 and "different 1" in report, report

    # a typo in a column name stops only that sink, naming sink, table and column (exit 2)
    bad = pipeline(tmp_path, pg_db, redis_db, {"mask": {"emial": "hash"}})
    sql(pg_db, "UPDATE users SET age = age + 1 WHERE id = 1")
    stream_changes(bad, pg_db)
    runs = ApplyJob(load_pipeline(bad), spark).run_once("search")
    error = runs[0].error
    assert isinstance(error, PipelineFileError) and error.exit_code == 2
    assert "sink search" in error.problem and "public.users" in error.problem and "'emial'" in error.problem
    assert error.fix and "correct the column name" in error.fix
    with pytest.raises(PipelineFileError, match="'emial'"):  # verify too: exit 2 before reading the source
        verify(bad, spark, "search")


def test_bad_table_options_exit_2_without_printing_the_key(
    pg_db: str, redis_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CDC_MASK_KEY", raising=False)
    sql(
        pg_db,
        "CREATE TABLE users (id int PRIMARY KEY, email text, phone text, notes text, password_hash text, age int)",
    )
    f = pipeline(tmp_path, pg_db, redis_db)
    missing = cdc("validate", f)  # CDC_MASK_KEY is not set: refused before anything connects
    assert missing.code == 2 and "environment variable CDC_MASK_KEY is not set" in missing.err, missing.err
    assert "  fix: export CDC_MASK_KEY=" in missing.err, missing.err
    doc = f.read_text().replace("public.users:\n", "public.userz:\n", 1)
    typo = tmp_path / "typo.yml"
    typo.write_text(doc)
    run = cdc("validate", typo, env={"CDC_MASK_KEY": KEY})
    assert run.code == 2, run.err
    assert "sinks.hist.delta.table_options: table public.userz is not among this sink's tables" in run.err, (
        run.err
    )
    assert "error:" in run.err and "  fix:" in run.err and "Traceback" not in run.err
    assert KEY not in run.err + run.out

    # a column the table does not have: `cdc validate` says so before any apply stops on it
    bad = pipeline(tmp_path, pg_db, redis_db, {"mask": {"emial": "hash"}})
    run = cdc("validate", bad, env={"CDC_MASK_KEY": KEY})
    assert run.code == 2, run.out + run.err
    assert (
        "sink search: table_options public.users: column 'emial' is not a column of public.users" in run.out
    ), run.out
    assert KEY not in run.err + run.out


def test_changed_table_options_rebuild_the_follower(
    pg_db: str, redis_db: str, tmp_path: Path, spark, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mask added to a running sink masks every row at the next cut, not only the rows changed
    since (the follower is rebuilt from the log's base); a rename builds the follower under its new
    name and says the old one is left."""
    monkeypatch.setenv("CDC_MASK_KEY", KEY)
    sql(
        pg_db,
        "CREATE TABLE members (id int PRIMARY KEY, email text, age int)",
        "INSERT INTO members SELECT i, 'm' || i || '@example.com', i FROM generate_series(1, 20) i",
    )

    def file(options: dict | None) -> Path:
        cache = {"url": redis_db, "tables": ["public.members"], "mask_key": "${CDC_MASK_KEY}"}
        if options:
            cache["table_options"] = {"public.members": options}
        return write_pipeline(tmp_path, pg_db, ["public.members"], sinks=[{"name": "cache", "redis": cache}])

    def applied(f: Path) -> list[str]:
        with logsetup.collected() as lines:
            runs = ApplyJob(load_pipeline(f), spark).run_once()
        assert all(r.error is None for r in runs), runs
        return lines

    def emails(prefix: str) -> dict[str, str]:
        client = redis.Redis.from_url(redis_db)
        try:
            return {k.split(":", 1)[1]: v["email"] for k, v in redis_rows(client, prefix).items()}
        finally:
            client.close()

    f = file(None)
    run_snapshot(load_pipeline(f), progress=False)
    applied(f)
    source = {k[0]: v["email"] for k, v in source_rows(pg_db, "public.members", ["id"]).items()}
    assert emails("public.members:") == source

    f = file({"mask": {"email": "hash"}})
    sql(pg_db, "UPDATE members SET age = 99 WHERE id = 1")
    stream_changes(f, pg_db)
    lines = applied(f)
    assert any(
        "public.members: its table_options changed" in line and "rebuilding" in line for line in lines
    ), lines
    assert emails("public.members:") == {k: hashed(v) for k, v in source.items()}  # all 20, not only id 1
    code, report = verify(f, spark)
    assert code == 0, report

    f = file({"mask": {"email": "hash"}, "rename": "members_v2"})
    sql(pg_db, "UPDATE members SET age = 98 WHERE id = 2")
    stream_changes(f, pg_db)
    lines = applied(f)
    assert any("the follower under its old name is left as it was" in line for line in lines), lines
    assert emails("members_v2:") == {k: hashed(v) for k, v in source.items()}
    code, report = verify(f, spark)
    assert code == 0, report
    assert KEY not in "\n".join(lines) + report
