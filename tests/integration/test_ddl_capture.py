"""DDL followed as it commits (issue 35): with the event trigger `cdc ddl install` puts in place,
a schema change of a table that gets no later write reaches the log at its commit and every
follower with the next `cdc apply --once`, in order with the rows around it.

The Delta follower is read with delta-rs (`deltalake`, no Spark) and compared with the source;
`cdc verify` must exit 0.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from psycopg2.extensions import make_dsn

from cdc import ddl
from cdc.ground.tables import TableName
from sinks.registry import load_pipeline
from tests.fixtures.readers import DELTA_RS_LACKS, delta_reader_features
from tests.harness import apply_once, cdc, cdc_here, source_rows, sql, verify, write_pipeline

pytestmark = pytest.mark.integration


def _pipeline(tmp_path: Path, dsn: str, tables: list[str]) -> Path:
    return write_pipeline(
        tmp_path, dsn, tables, name="ddlcap", sinks=[{"name": "lake", "delta": {"path": "lake"}}]
    )


def _stream(file: Path, *needles: str) -> str:
    """`cdc stream --until current` as a user runs it (with its re-baser)."""
    run = cdc("stream", file, "--until", "current")
    assert run.code == 0, run.out + run.err
    missing = [n for n in needles if n not in run.out + run.err]
    assert not missing, (missing, run.out, run.err)
    return run.out + run.err


def _lake(tmp_path: Path, table: str) -> dict[str, dict]:
    """The Delta table read with delta-rs: {id as text: row}."""
    from deltalake import DeltaTable

    schema, name = table.split(".")
    path = tmp_path / "lake" / schema / name
    assert not delta_reader_features(path) & DELTA_RS_LACKS, "the follower should stay readable by delta-rs"
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return {str(r["id"]): r for r in rows}


def _same(tmp_path: Path, dsn: str, table: str, columns: list[str]) -> None:
    lake = _lake(tmp_path, table)
    source = {k[0]: v for k, v in source_rows(dsn, table, ["id"]).items()}
    assert set(lake) == set(source), (table, sorted(lake), sorted(source))
    for key, row in source.items():
        missing = [c for c in columns if c not in lake[key]]
        assert not missing, f"{table}: the follower has no column(s) {missing}: {sorted(lake[key])}"
        got = {c: None if lake[key][c] is None else str(lake[key][c]) for c in columns}
        want = {c: row[c] for c in columns}
        assert got == want, (table, key, got, want)


def test_ddl_reaches_the_follower_without_a_later_write(pg_any_db: str, tmp_path: Path, spark) -> None:
    """The issue's test: an update right before a column rename; ADD COLUMN ... DEFAULT then
    ALTER COLUMN ... TYPE (a rewrite); DDL and rows interleaved in one transaction; a table
    renamed; no later write to any of them. One `stream --until current`, one `apply --once`."""
    sql(
        pg_any_db,
        "CREATE TABLE dim (id int PRIMARY KEY, v text)",
        "INSERT INTO dim SELECT g, 'a' || g FROM generate_series(1, 5) g",
        "CREATE TABLE acc (id int PRIMARY KEY, n int, note text)",
        "INSERT INTO acc SELECT g, g, 'n' FROM generate_series(1, 6) g",
        "CREATE TABLE mix (id int PRIMARY KEY, a text)",
        "INSERT INTO mix SELECT g, 'm' FROM generate_series(1, 4) g",
        "CREATE TABLE quiet (id int PRIMARY KEY, q text)",
        "INSERT INTO quiet VALUES (1, 'q')",
    )
    file = _pipeline(tmp_path, pg_any_db, ["public.*"])
    run = cdc_here("ddl", "install", file)
    assert run.code == 0 and "installed event triggers" in run.out, run.out + run.err
    run = cdc_here("validate", file)
    assert "DDL capture: on (event trigger)" in run.out, run.out
    assert cdc("snapshot", file).code == 0
    apply_once(file, spark)

    sql(pg_any_db, "UPDATE dim SET v = 'x' WHERE id = 1", "ALTER TABLE dim RENAME COLUMN v TO w")
    sql(pg_any_db, "ALTER TABLE acc ADD COLUMN tier text DEFAULT 'std'")
    sql(pg_any_db, "ALTER TABLE acc ALTER COLUMN n TYPE bigint USING n * 10")
    sql(
        pg_any_db,
        "BEGIN; UPDATE mix SET a = 'b' WHERE id = 1; ALTER TABLE mix ADD COLUMN c int DEFAULT 7;"
        " UPDATE mix SET c = 8 WHERE id = 2; ALTER TABLE mix RENAME COLUMN a TO a2;"
        " INSERT INTO mix VALUES (10, 'new', 9); ALTER TABLE mix ADD COLUMN d text DEFAULT 'dd'; COMMIT",
    )
    sql(pg_any_db, "ALTER TABLE quiet RENAME TO calm")
    _stream(file, "DDL capture: on", "re-base public.acc: done", "renamed to public.calm")
    apply_once(file, spark)

    _same(tmp_path, pg_any_db, "public.dim", ["w"])
    assert _lake(tmp_path, "public.dim")["1"]["w"] == "x"
    assert "v" not in _lake(tmp_path, "public.dim")["1"]
    _same(tmp_path, pg_any_db, "public.acc", ["n", "note", "tier"])
    assert _lake(tmp_path, "public.acc")["3"]["n"] == 30
    _same(tmp_path, pg_any_db, "public.mix", ["a2", "c", "d"])
    _same(tmp_path, pg_any_db, "public.calm", ["q"])
    code, report = verify(file, spark)
    assert code == 0, report


def test_vacuum_full_and_cluster_cause_no_re_base(pg_db: str, tmp_path: Path) -> None:
    """VACUUM FULL and CLUSTER give the table new storage but change no row: no re-base, also
    without the trigger (the stream goes by what the columns show)."""
    sql(
        pg_db,
        "CREATE TABLE vt (id int PRIMARY KEY, v text)",
        "INSERT INTO vt SELECT g, 'a' FROM generate_series(1, 20) g",
    )
    file = _pipeline(tmp_path, pg_db, ["public.vt"])
    assert cdc("snapshot", file).code == 0
    sql(pg_db, "VACUUM FULL vt", "CLUSTER vt USING vt_pkey", "UPDATE vt SET v = 'b' WHERE id = 1")
    out = _stream(file, "DDL capture: off")
    assert "re-bas" not in out, out


def test_trigger_dropped_behind_the_tools_back_is_said(pg_db: str, tmp_path: Path) -> None:
    """`cdc validate` and `cdc stream` say that the trigger went and how to put it back; the
    stream goes on without it; `cdc teardown --drop-slot` removes the trigger."""
    sql(pg_db, "CREATE TABLE gone (id int PRIMARY KEY, v text)", "INSERT INTO gone VALUES (1, 'a')")
    file = _pipeline(tmp_path, pg_db, ["public.gone"])
    assert cdc_here("ddl", "install", file).code == 0
    assert cdc("snapshot", file).code == 0
    sql(pg_db, f"DROP EVENT TRIGGER {ddl.trigger_names('ddlcap')['ddl_command_end']}")
    run = cdc_here("validate", file)
    assert run.code == 0, run.out + run.err
    assert "warn DDL capture: event trigger(s) for ddl_command_end dropped or disabled" in run.out, run.out
    assert f"fix: run `cdc ddl install {file}` again" in run.out, run.out
    sql(pg_db, "ALTER TABLE gone ADD COLUMN w int", "UPDATE gone SET w = 1")
    out = _stream(file, "warning: DDL capture: event trigger(s) for ddl_command_end dropped")
    assert "fix: run `cdc ddl install" in out, out
    # the fallback: the column still reaches the log with the table's next change
    from cdc.log.local import LocalLog

    log = LocalLog(load_pipeline(file).local_log_path, readonly=True)
    try:
        assert "w" in log.schema(TableName("public", "gone")).column_names
    finally:
        log.close()
    run = cdc_here("status", file)
    assert "DDL capture: event trigger(s) for ddl_command_end dropped or disabled" in run.out, run.out
    # installed again; the user's DDL never fails because of it, not even without the publication
    assert cdc_here("ddl", "install", file).code == 0
    assert "DDL capture: on (event trigger)" in cdc_here("status", file).out
    sql(pg_db, "DROP PUBLICATION cdc_ddlcap", "ALTER TABLE gone ADD COLUMN z float8 DEFAULT random()")
    run = cdc_here("teardown", file, "--drop-slot", "--yes")
    assert run.code == 0, run.out + run.err
    names = list(ddl.trigger_names("ddlcap").values())
    assert sql(pg_db, f"SELECT count(*) FROM pg_event_trigger WHERE evtname IN {tuple(names)}")[0][0] == 0


def test_role_without_the_right_keeps_todays_mode(pg_db: str, tmp_path: Path) -> None:
    """A role that may not create event triggers: `cdc ddl install` changes nothing (exit 3, what
    to do); `cdc validate` says the pipeline runs without DDL capture and why."""
    role = "cdc_noddl_" + uuid.uuid4().hex[:8]
    sql(
        pg_db,
        "CREATE TABLE plain (id int PRIMARY KEY)",
        f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'nd-secret'",
    )
    sql(pg_db, f"GRANT SELECT ON public.plain TO {role}")
    try:
        file = _pipeline(tmp_path, make_dsn(pg_db, user=role, password="nd-secret"), ["public.plain"])
        run = cdc("ddl", "install", file)
        assert run.code == 3, run.out + run.err
        assert f"error: role {role} may not install event triggers" in run.err, run.err
        assert "fix: run `cdc ddl install" in run.err and "Traceback" not in run.err, run.err
        assert "nd-secret" not in run.out + run.err
        run = cdc("validate", file)
        assert "DDL capture: off (no event trigger)" in run.out, run.out
        assert f"role {role} is not a superuser" in run.out, run.out
    finally:
        sql(pg_db, f"DROP OWNED BY {role}", f"DROP ROLE {role}")


def test_kafka_schemas_topic_gets_the_version_at_the_ddl_commit(
    pg_db: str, tmp_path: Path, kafka, spark
) -> None:
    """With `log: kafka`, the DDL's schema version is in `_cdc_schemas` after the next `cdc stream
    --until current`, with no later write to the table (read with a plain Kafka consumer), and the
    Delta follower applying from the topics has the renamed and the new column (read with delta-rs)."""
    import orjson

    from tests.fixtures.kafka_log import apply_ok as kafka_apply
    from tests.fixtures.kafka_log import make_kpipe, verified
    from tests.fixtures.kafka_log import snapshot as kafka_snapshot
    from tests.fixtures.kafka_log import stream_until_current as kafka_stream
    from tests.fixtures.topics import topic_records

    sql(pg_db, "CREATE TABLE kd (id int PRIMARY KEY, v text)", "INSERT INTO kd VALUES (1, 'a')")
    pipe = make_kpipe(tmp_path, pg_db, ["public.kd"], kafka.bootstrap)
    assert cdc_here("ddl", "install", pipe.file).code == 0
    kafka_snapshot(pipe)
    kafka_apply(pipe, spark)
    sql(pg_db, "ALTER TABLE kd RENAME COLUMN v TO w", "ALTER TABLE kd ADD COLUMN tier text DEFAULT 'std'")
    kafka_stream(pipe)
    versions = [orjson.loads(r.value) for r in topic_records(kafka.bootstrap, pipe.schemas_topic)]
    newest = max((v for v in versions if v["table"] == "public.kd"), key=lambda v: v["version"])
    columns = {
        c[0]: c for c in newest["schema"]["columns"]
    }  # [name, type oid, typmod, ndims, missing, attnum]
    assert set(columns) == {"id", "w", "tier"}, columns
    assert columns["w"][5] == 2 and columns["tier"][4] == "std", columns
    kafka_apply(pipe, spark)
    _same(pipe.dir, pg_db, "public.kd", ["w", "tier"])
    assert "v" not in _lake(pipe.dir, "public.kd")["1"]
    verified(pipe, spark)


def test_idle_table_schema_check_without_the_trigger(pg_db: str, tmp_path: Path) -> None:
    """Without DDL capture, a stream with nothing pending compares the catalog of each captured
    table with the log's latest schema: a rename and a new column with a default on a table that
    gets no later write reach the log (attnum and default kept) by the end of `stream --until current`."""
    from cdc.log.local import LocalLog

    sql(pg_db, "CREATE TABLE idle (id int PRIMARY KEY, v text)", "INSERT INTO idle VALUES (1, 'a')")
    file = _pipeline(tmp_path, pg_db, ["public.idle"])
    assert cdc("snapshot", file).code == 0
    sql(pg_db, "ALTER TABLE idle RENAME COLUMN v TO w", "ALTER TABLE idle ADD COLUMN tier text DEFAULT 'std'")
    out = _stream(
        file, "DDL capture: off", "public.idle: its columns changed in the source with no change since"
    )
    assert "re-bas" not in out, out
    log = LocalLog(load_pipeline(file).local_log_path, readonly=True)
    try:
        columns = {c.name: c for c in log.schema(TableName("public", "idle")).columns}
    finally:
        log.close()
    assert (
        set(columns) == {"id", "w", "tier"} and columns["w"].attnum == 2 and columns["tier"].missing == "std"
    ), columns


def test_ddl_reaches_search_cache_and_views_without_a_later_write(
    pg_db: str, tmp_path: Path, spark, opensearch, redis_db: str
) -> None:
    """With the trigger, a rename, an added column with a default and a dropped column of a table
    that gets no later write reach an OpenSearch follower, a Redis follower, a derived view
    (followed by Redis), an Iceberg follower, a Delta SCD2 follower and a tantivy index with one
    `stream --until current` and one `apply --once`, each read with its own reader (opensearch-py,
    redis-py, pyiceberg, delta-rs, tantivy); a view whose SQL names the renamed column is refused
    naming the new name. `DROP TABLE` is marked in the log at its own commit, before a later write to another table."""
    import redis

    from cdc.log.local import LocalLog
    from pipelines.apply.job import ApplyJob
    from tests.fixtures.readers import opensearch_docs, opensearch_ids, redis_rows

    sql(
        pg_db,
        "CREATE TABLE doc (id int PRIMARY KEY, v text, gone text)",
        "INSERT INTO doc SELECT g, 'word' || g, 'g' || g FROM generate_series(1, 3) g",
        "CREATE TABLE tmp (id int PRIMARY KEY, x text)",
        "INSERT INTO tmp VALUES (1, 'x')",
        "CREATE TABLE other (id int PRIMARY KEY)",
        "INSERT INTO other VALUES (1)",
    )
    prefix = f"dd{uuid.uuid4().hex[:8]}"
    search = {"engine": "opensearch", "hosts": [opensearch.url], "index_prefix": prefix, "replicas": 0}
    file = write_pipeline(
        tmp_path,
        pg_db,
        ["public.*"],
        name="ddlcap",
        views=[
            {"name": "doc_all", "sql": "SELECT * FROM public.doc", "key": ["id"]},
            {"name": "doc_v", "sql": "SELECT id, v FROM public.doc", "key": ["id"]},
        ],
        sinks=[
            {"name": "search", "search": {**search, "tables": ["public.doc"]}},
            {
                "name": "cache",
                "redis": {"url": redis_db, "tables": ["public.doc"], "views": ["doc_all"]},
                "dropped_columns": "drop",
            },
            {"name": "oldnames", "redis": {"url": redis_db, "views": ["doc_v"]}},
            {"name": "ice", "iceberg": {"warehouse": "ice", "tables": ["public.doc"]}},
            {"name": "hist", "delta": {"path": "hist", "mode": "scd2", "tables": ["public.doc"]}},
            {"name": "local", "search": {"engine": "tantivy", "tables": ["public.doc"]}},
        ],
    )
    assert cdc_here("ddl", "install", file).code == 0
    assert cdc("snapshot", file).code == 0
    sql(pg_db, "UPDATE doc SET v = v WHERE id = 1")  # a second SCD2 version of id 1: history to rename
    _stream(file)
    apply_once(file, spark)

    sql(
        pg_db,
        "ALTER TABLE doc RENAME COLUMN v TO w",
        "ALTER TABLE doc ADD COLUMN tier text DEFAULT 'std'",
        "ALTER TABLE doc DROP COLUMN gone",
        "UPDATE tmp SET x = 'last'",
        "DROP TABLE tmp",
    )
    ((drop_lsn,),) = sql(pg_db, "SELECT pg_current_wal_lsn() - '0/0'")
    sql(pg_db, "INSERT INTO other VALUES (2)")
    out = _stream(file, "DDL capture: on", "marked dropped in the log: public.tmp at")
    runs = {r.sink: r for r in ApplyJob(load_pipeline(file), spark).run_once()}

    # OpenSearch: the field renamed, the new one with its default, the dropped one kept (`keep`)
    docs = opensearch_docs(opensearch.url, f"{prefix}.public.doc")
    assert {d["id"] for d in docs.values()} == {1, 2, 3}, docs
    for d in docs.values():
        assert (
            "v" not in d and d["w"] == f"word{d['id']}" and d["tier"] == "std" and d["gone"] == f"g{d['id']}"
        ), d
    assert opensearch_ids(opensearch.url, f"{prefix}.public.doc", {"match": {"w": "word2"}}) == {"2"}
    assert opensearch_ids(opensearch.url, f"{prefix}.public.doc", {"term": {"tier": "std"}}) == {
        "1",
        "2",
        "3",
    }
    # Redis: the same, the dropped column gone (`dropped_columns: drop`)
    client = redis.Redis.from_url(redis_db)
    cached = redis_rows(client, "public.doc:")
    assert sorted(cached) == ["public.doc:1", "public.doc:2", "public.doc:3"], sorted(cached)
    for row in cached.values():
        mine = {k: v for k, v in row.items() if not k.startswith("_cdc_")}
        assert mine == {"id": row["id"], "w": f"word{row['id']}", "tier": "std"}, row
    # the view over `*` follows the new columns
    viewed = redis_rows(client, "views.doc_all:")
    client.close()
    assert len(viewed) == 3, viewed
    for row in viewed.values():
        assert "v" not in row and row["w"] == f"word{row['id']}" and row["tier"] == "std", row
    # the view naming the old column: refused, naming the rename and the fix
    assert runs["cache"].error is None and runs["search"].error is None, runs
    error = runs["oldnames"].error
    assert error is not None and "column v" in error.problem and "renamed to w" in error.problem, error
    assert "view's SQL" in (error.fix or ""), error
    assert all(runs[s].error is None for s in ("ice", "hist", "local")), runs
    _iceberg_tantivy_scd2_followed(tmp_path, file, spark)
    # DROP TABLE: marked at its commit, before the later insert into another table
    log = LocalLog(load_pipeline(file).local_log_path, readonly=True)
    try:
        states = {str(s.table): s for s in log.tables()}
    finally:
        log.close()
    assert states["public.tmp"].state == "dropped", states
    assert states["public.tmp"].dropped_lsn is not None and states["public.tmp"].dropped_lsn <= int(
        drop_lsn
    ), (states["public.tmp"].dropped_lsn, drop_lsn, out)


def _iceberg_tantivy_scd2_followed(tmp_path: Path, file: Path, spark) -> None:
    """The rename, the added column with its default and the dropped column (`keep`) of
    `public.doc`, with no later write, in an Iceberg follower (read with pyiceberg: the field
    renamed in place), a Delta SCD2 follower (delta-rs: history rows renamed too, the constant
    default in every version, no new version for a DDL) and a tantivy index (tantivy's own
    searcher, searchable by the new names); `cdc verify` of each exits 0."""
    from deltalake import DeltaTable
    from pyiceberg.catalog.sql import SqlCatalog

    from tests.fixtures.readers import tantivy_docs, tantivy_ids

    want = {i: {"id": i, "w": f"word{i}", "tier": "std", "gone": f"g{i}"} for i in (1, 2, 3)}
    ice = tmp_path / "ice"
    table = SqlCatalog("ice", uri=f"sqlite:///{ice / 'catalog.db'}", warehouse=f"file://{ice}").load_table(
        "public.doc"
    )
    assert [f.name for f in table.schema().fields if not f.name.startswith("_cdc_")] == [
        "id",
        "w",
        "gone",
        "tier",
    ]
    assert table.schema().find_field("w").field_id == 2, (
        table.schema()
    )  # renamed in place, not dropped + added
    rows = table.scan().to_arrow().to_pylist()
    assert {r["id"]: {c: r[c] for c in ("id", "w", "tier", "gone")} for r in rows} == want, rows

    path = tmp_path / "hist" / "public" / "doc"
    assert not delta_reader_features(path) & DELTA_RS_LACKS, (
        "the SCD2 follower should stay readable by delta-rs"
    )
    versions = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    current = [v for v in versions if v["_cdc_end_lsn"] is None]
    ended = [v for v in versions if v["_cdc_end_lsn"] is not None]
    assert all("v" not in v for v in versions), versions
    assert {v["id"]: {c: v[c] for c in ("id", "w", "tier", "gone")} for v in current} == want, versions
    # the DDL adds no version; the ended one (before the update) has its values under the new name
    assert len(current) == 3 and [(v["id"], v["w"], v["gone"]) for v in ended] == [(1, "word1", "g1")], (
        versions
    )

    index = load_pipeline(file).state_path / "search" / "public" / "doc"
    docs = tantivy_docs(index)
    assert {int(k): {c: d.get(c) for c in ("id", "w", "tier", "gone")} for k, d in docs.items()} == want, docs
    assert all("v" not in d for d in docs.values()), docs
    assert tantivy_ids(index, "w:word2", ["w"]) == {"2"}
    assert tantivy_ids(index, "tier:std", ["tier"]) == {"1", "2", "3"}

    for sink in ("ice", "hist", "local"):
        code, report = verify(file, spark, sink)
        assert code == 0, (sink, report)


def test_drop_schema_cascade_marks_its_tables_dropped_at_the_commit(pg_db: str, tmp_path: Path) -> None:
    """`DROP SCHEMA ... CASCADE` drops its tables as dependents: the sql_drop message still names
    them, so the log marks the captured one dropped at the DROP's commit, before a later write."""
    from cdc.log.local import LocalLog

    sql(
        pg_db,
        "CREATE SCHEMA side",
        "CREATE TABLE side.t (id int PRIMARY KEY)",
        "INSERT INTO side.t VALUES (1)",
        "CREATE TABLE later (id int PRIMARY KEY)",
    )
    file = _pipeline(tmp_path, pg_db, ["side.t", "public.later"])
    assert cdc_here("ddl", "install", file).code == 0
    assert cdc("snapshot", file).code == 0
    sql(pg_db, "DROP SCHEMA side CASCADE")
    ((drop_lsn,),) = sql(pg_db, "SELECT pg_current_wal_lsn() - '0/0'")
    sql(pg_db, "INSERT INTO later VALUES (1)")
    _stream(file, "marked dropped in the log: side.t at")
    log = LocalLog(load_pipeline(file).local_log_path, readonly=True)
    try:
        st = next(s for s in log.tables() if str(s.table) == "side.t")
    finally:
        log.close()
    assert st.state == "dropped" and st.dropped_lsn is not None and st.dropped_lsn <= int(drop_lsn), st
