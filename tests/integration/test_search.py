"""The search follower (sinks/search), both engines, against a real PostgreSQL and, for
`engine: opensearch`, a REAL OpenSearch node (pipelines.devservices.opensearch).

* inserts, updates (incl. unchanged TOAST values and a primary-key change), deletes and
  truncates reach the index, and `cdc verify` says the index equals the source;
* a replayed batch and a late batch with older positions change nothing (also after a
  truncate, and a deleted key is never brought back);
* OpenSearch down: only that follower fails, with a clear message, keeps its checkpoint, and
  the next runs catch up; another sink of the pipeline advances meanwhile;
* a row the engine rejects (mapping conflict) is named with table and key, the batch stays
  pending, and after the field type is fixed the next apply goes through;
* `cdc search` prints the top hits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc.ground.errors import SinkError
from cdc.ground.tables import TableName
from cdc.log import open_log_view
from pipelines.apply.readers import change_reader
from pipelines.checkpoints import load_checkpoint
from pipelines.devservices.opensearch import LocalOpenSearch
from sinks.changes import TableBatch
from sinks.registry import load_pipeline, make_sink
from sinks.search.query import run_search
from tests.fixtures.opensearch import opensearch_node
from tests.fixtures.readers import opensearch_docs, opensearch_ids, tantivy_docs, tantivy_ids
from tests.harness import (
    apply_once,
    cdc,
    cdc_here,
    edit_pipeline,
    source_rows,
    sql,
    stream_changes,
    verify,
    write_pipeline,
)

pytestmark = pytest.mark.integration

ENGINES = ["tantivy", "opensearch"]

ITEMS_DDL = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    """CREATE TABLE items (
        id int PRIMARY KEY,
        title text,
        code varchar(20),
        qty int,
        price numeric(10,2),
        score float8,
        ok bool,
        day date,
        at timestamptz,
        local timestamp,
        ref uuid,
        feeling mood,
        doc jsonb,
        tags text[],
        blob bytea,
        big text
    )""",
    "ALTER TABLE items ALTER COLUMN big SET STORAGE EXTERNAL",  # out of line, uncompressed: unchanged TOAST
]


def insert_items(dsn: str, first: int, last: int, title: str = "hello world") -> None:
    sql(
        dsn,
        f"""INSERT INTO items
        SELECT g, '{title} ' || g, 'C' || g, g, g * 1.5, g / 3.0, g % 2 = 0, DATE '2024-01-01' + g,
               TIMESTAMPTZ '2024-01-01 00:00:00.123456+00' + g * interval '1 hour',
               TIMESTAMP '2024-01-01 10:00:00' + g * interval '1 minute', md5(g::text)::uuid,
               (ARRAY['sad','ok','happy'])[1 + g % 3]::mood, jsonb_build_object('n', g, 'tag', 'x' || g),
               ARRAY['t' || g, NULL], decode(md5(g::text), 'hex'), repeat(md5(g::text), 100)
        FROM generate_series({first}, {last}) g""",
    )


# ---- helpers -------------------------------------------------------------------------------------
def stream(dsn: str, pipeline_file: Path) -> None:
    stream_changes(pipeline_file, dsn)


def snapshot(pipeline_file: Path) -> None:
    from snapshot.runner import run_snapshot

    run_snapshot(load_pipeline(pipeline_file), progress=False)


def search_sink(engine: str, request: pytest.FixtureRequest, name: str = "s", **extra: Any) -> dict:
    settings: dict[str, Any] = {"engine": engine, "tables": ["public.items"]}
    if engine == "opensearch":
        node: LocalOpenSearch = request.getfixturevalue("opensearch")
        settings |= {
            "hosts": [node.url],
            "index_prefix": f"t{abs(hash(request.node.name)) % 10**8}",
            "replicas": 0,
        }
    settings |= extra
    return {"name": name, "search": settings}


def pipeline_file(
    tmp_path: Path, dsn: str, sinks: list[dict], tables: tuple[str, ...] = ("public.items",)
) -> Path:
    return write_pipeline(
        tmp_path, dsn, list(tables), sinks=sinks, spark={"conf": {"spark.sql.shuffle.partitions": 2}}
    )


def stats_of(runs: list, sink: str = "s") -> dict[str, Any]:
    run = next(r for r in runs if r.sink == sink)
    return {t.table: t for t in run.tables}


def assert_verified(f: Path, spark, sink: str = "s") -> str:
    code, report = verify(f, spark, sink)
    assert code == 0, report
    assert "identical" in report, report
    return report


def documents(f: Path, spark, table: str = "public.items", sink: str = "s") -> list:
    pipeline = load_pipeline(f)
    df = make_sink(pipeline.sink(sink), pipeline, spark).current(TableName.parse(table))
    assert df is not None
    return sorted((tuple(r) for r in df.collect()), key=lambda r: r[0])


def table_batch(log, spark, table: TableName, after: int, upto: int) -> TableBatch:
    """The log's events (after, upto] of a table, as the apply job reads them."""
    schema = log.schema(table)
    state = next(t for t in log.tables() if t.table == table)
    raw = change_reader(log).read_changes(spark, table, after, upto, schema)
    return TableBatch(table, schema, raw, False, state.snapshot_lsn, after, upto, log.value_kind)


def apply_batch(f: Path, spark, after: int, upto: int, table: str = "public.items", sink: str = "s"):
    """Hand the sink a batch directly (a replay or a late batch, which the job itself never sends)."""
    pipeline = load_pipeline(f)
    log = open_log_view(pipeline)
    try:
        batch = table_batch(log, spark, TableName.parse(table), after, upto)
        target = make_sink(pipeline.sink(sink), pipeline, spark)
        target.prepare([batch])
        changes = batch.net()
        try:
            return target.apply(batch, changes, 10**6)
        finally:
            changes.release()
            batch.release()
    finally:
        log.close()


def applied_end(f: Path, sink: str = "s", table: str = "public.items") -> tuple[int, int]:
    ckpt = load_checkpoint(load_pipeline(f).state_path, sink)
    base, end = ckpt.tables[table]
    return base, end


def hits(
    f: Path, query: str, sink: str | None = None, table: str = "public.items", limit: int = 10
) -> list[str]:
    return list(run_search(load_pipeline(f), table, query, sink, limit))


# ---- independent reads: the engine's own client, not the sink's code ------------------------------
def _text(v: str) -> str:
    return v


def _float(v: str) -> float | str:
    return v if v in ("NaN", "Infinity", "-Infinity") else float(v)


# the JSON value a document holds for a source column's PostgreSQL text (sinks/search/json_values.py)
JSON_OF = {"id": int, "qty": int, "score": _float, "ok": lambda v: v == "t"}
COMPARED = {
    "public.items": ("id", "title", "code", "qty", "price", "score", "ok", "day", "ref", "feeling", "big"),
    "public.t": ("id", "v"),
}


def _settings(f: Path, sink: str) -> dict[str, Any]:
    doc = yaml.safe_load(f.read_text())
    return next(s for s in doc["sinks"] if s["name"] == sink)["search"]


def index_docs(f: Path, sink: str = "s", table: str = "public.items") -> dict[str, dict[str, Any]]:
    """The live documents as the engine itself returns them: opensearch-py on the table's alias,
    or tantivy's searcher on the generation cdc.json names."""
    settings = _settings(f, sink)
    if settings.get("engine") == "opensearch":
        return opensearch_docs(settings["hosts"][0], f"{settings.get('index_prefix', 'test')}.{table}")
    schema, name = table.split(".")
    return tantivy_docs(load_pipeline(f).state_path / "search" / schema / name)


def index_ids(f: Path, sink: str, table: str, tantivy_query: str, opensearch_query: dict) -> set[str]:
    """Ids matched by a query in the engine's own query language (fields indexed with their types)."""
    settings = _settings(f, sink)
    if settings.get("engine") == "opensearch":
        url, alias = settings["hosts"][0], f"{settings.get('index_prefix', 'test')}.{table}"
        return opensearch_ids(url, alias, opensearch_query)
    schema, name = table.split(".")
    return tantivy_ids(load_pipeline(f).state_path / "search" / schema / name, tantivy_query, ["title"])


def assert_index_is_source(
    f: Path, dsn: str, sink: str = "s", table: str = "public.items"
) -> dict[str, dict[str, Any]]:
    """Read the index independently and compare it with the source: the same ids (deleted rows
    absent), the compared columns with their JSON types, versions as the engine stores them."""
    docs = index_docs(f, sink, table)
    source = {k[0]: row for k, row in source_rows(dsn, table, ("id",)).items()}
    assert sorted(docs, key=int) == sorted(source, key=int), (sorted(docs), sorted(source))
    for doc_id, row in source.items():
        doc = docs[doc_id]
        for column in COMPARED[table]:
            text = row[column]
            expected = None if text is None else JSON_OF.get(column, _text)(text)
            assert doc.get(column) == expected, (doc_id, column, doc.get(column), text)
            assert type(doc.get(column)) is type(expected), (doc_id, column, doc.get(column))
        assert isinstance(doc["_version"], int) and doc["_version"] > 0, doc
        if "_cdc_version" in doc:  # OpenSearch: its own version is the change's version
            assert doc["_version"] == doc["_cdc_version"], doc
    return docs


# ---- 1. changes reach the index --------------------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_changes_reach_the_index(engine: str, pg_db: str, tmp_path: Path, spark, request) -> None:
    sql(pg_db, *ITEMS_DDL)
    insert_items(pg_db, 1, 50)
    sql(
        pg_db,
        "INSERT INTO items (id, score, title) VALUES (100, 'NaN', NULL), (101, '-Infinity', 'minus infinity')",
    )
    f = pipeline_file(tmp_path, pg_db, [search_sink(engine, request)])
    snapshot(f)
    runs = apply_once(f, spark)
    first = stats_of(runs)["public.items"]
    assert (first.inserted, first.updated, first.deleted) == (52, 0, 0), first.line()
    assert_verified(f, spark)
    assert_index_is_source(f, pg_db)
    assert index_ids(f, "s", "public.items", "qty:[5 TO 7]", {"range": {"qty": {"gte": 5, "lte": 7}}}) == {
        "5",
        "6",
        "7",
    }
    lines = hits(f, "hello")
    assert "top 10 of 50 hit(s) for 'hello' among 52 document(s)" in lines[0], (
        lines
    )  # --limit is not the count
    if engine == "opensearch":  # deletes are remembered long enough to reject late writes
        from sinks.search.opensearch_engine import OpenSearchSink

        pipeline = load_pipeline(f)
        sink = OpenSearchSink(pipeline.sink("s"), pipeline, spark)
        settings = sink.client().indices.get_settings(index=sink.index_of(TableName("public", "items")))
        assert [s["settings"]["index"]["gc_deletes"] for s in settings.values()] == ["7d"]

    # updates (one leaves the TOASTed `big` unchanged), deletes, a key change, inserts, NaN
    sql(
        pg_db,
        "UPDATE items SET title = 'changed ' || id, qty = qty + 1000 WHERE id <= 10",
        "DELETE FROM items WHERE id BETWEEN 11 AND 15",
        # a key change carries unchanged TOAST values as "unchanged" for a brand-new key, which no
        # follower can resolve (see the report): change `big` along with the key
        "UPDATE items SET id = 2000, big = 'moved' WHERE id = 20",
        "UPDATE items SET score = 'NaN', tags = ARRAY['a', 'b'] WHERE id = 30",
    )
    insert_items(pg_db, 51, 60, "brand new")
    stream(pg_db, f)
    runs = apply_once(f, spark)
    second = stats_of(runs)["public.items"]
    # 10 title updates + id 30 updated; 11-15 and old key 20 deleted; 51-60 and 2000 inserted
    assert (second.inserted, second.updated, second.deleted) == (11, 11, 6), second.line()
    assert_verified(f, spark)
    independent = assert_index_is_source(f, pg_db)
    assert independent["3"]["big"] == hashlib.md5(b"3").hexdigest() * 100  # kept TOAST value
    assert "20" not in independent and "11" not in independent and independent["2000"]["big"] == "moved"
    changed = index_ids(f, "s", "public.items", "title:changed", {"match": {"title": "changed"}})
    assert changed == {str(i) for i in range(1, 11)}
    docs = {r[0]: r for r in documents(f, spark)}
    assert (
        docs[3][1] == "changed 3" and docs[3][-1] == hashlib.md5(b"3").hexdigest() * 100
    )  # kept TOAST value
    assert 20 not in docs and 2000 in docs and 11 not in docs
    assert "top 5 of 10 hit(s)" in hits(f, "changed", limit=5)[0]
    assert any("id=2000" in line for line in hits(f, "C20", limit=3))

    # a column added with a constant DEFAULT: the rows not written since hold it in the engine's
    # own documents and are found by it (found by bench/chaos.py seed 4: only verify filled it in)
    sql(
        pg_db,
        "ALTER TABLE items ADD COLUMN tier text DEFAULT 'std'",
        "UPDATE items SET tier = 'gold' WHERE id = 1",
    )
    stream(pg_db, f)
    apply_once(f, spark)
    assert_verified(f, spark)
    tiers = {k: d.get("tier") for k, d in index_docs(f).items()}
    assert tiers == {k: "gold" if k == "1" else "std" for k in independent}, tiers
    standard = index_ids(f, "s", "public.items", "tier:std", {"match": {"tier": "std"}})
    assert standard == set(independent) - {"1"}

    # truncate, then rows in the same batch after it
    sql(pg_db, "TRUNCATE items")
    insert_items(pg_db, 1, 3, "after truncate")
    stream(pg_db, f)
    runs = apply_once(f, spark)
    third = stats_of(runs)["public.items"]
    assert third.inserted == 3, third.line()
    assert_verified(f, spark)
    assert sorted(assert_index_is_source(f, pg_db)) == ["1", "2", "3"]
    assert [r[0] for r in documents(f, spark)] == [1, 2, 3]
    lines = hits(f, "truncate")
    assert "3 hit(s)" in lines[0] and "among 3 document(s)" in lines[0], lines


# ---- 2. replays and late batches ---------------------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_replayed_and_late_batches_change_nothing(
    engine: str, pg_db: str, tmp_path: Path, spark, request
) -> None:
    sql(pg_db, *ITEMS_DDL)
    insert_items(pg_db, 1, 20)
    f = pipeline_file(tmp_path, pg_db, [search_sink(engine, request)])
    snapshot(f)
    apply_once(f, spark)
    base, snap_end = applied_end(f)

    sql(
        pg_db,
        "UPDATE items SET title = 'second ' || id WHERE id <= 10",
        "DELETE FROM items WHERE id BETWEEN 11 AND 15",
    )
    stream(pg_db, f)
    apply_once(f, spark)
    _, end = applied_end(f)
    state = documents(f, spark)
    assert len(state) == 15
    independent = assert_index_is_source(f, pg_db)  # with each document's version

    # the same batch again: every change is not newer than the index
    replay = apply_batch(f, spark, snap_end, end)
    assert (replay.inserted, replay.updated, replay.deleted, replay.stale) == (0, 0, 0, 15), replay.line()
    assert documents(f, spark) == state
    # a late batch: the snapshot rows (older positions), including rows deleted since
    late = apply_batch(f, spark, base - 1, snap_end)
    assert (late.inserted, late.updated, late.deleted, late.stale) == (0, 0, 0, 20), late.line()
    assert documents(f, spark) == state  # ids 11-15 stay deleted
    assert_verified(f, spark)
    assert index_docs(f) == independent  # same documents, same versions, 11-15 still absent

    # after a truncate, nothing older than it comes back
    sql(pg_db, "TRUNCATE items")
    insert_items(pg_db, 1, 2, "after truncate")
    stream(pg_db, f)
    apply_once(f, spark)
    after = documents(f, spark)
    assert [r[0] for r in after] == [1, 2]
    for lo, hi in ((base - 1, snap_end), (snap_end, end)):
        late = apply_batch(f, spark, lo, hi)
        assert late.inserted == late.updated == late.deleted == 0, late.line()
        assert documents(f, spark) == after
    assert_verified(f, spark)
    assert sorted(assert_index_is_source(f, pg_db)) == ["1", "2"]


# ---- 3. OpenSearch down -----------------------------------------------------------------------------
@pytest.fixture
def own_opensearch() -> Iterator[LocalOpenSearch]:
    """A node of this test's own, stopped and started by the test."""
    with opensearch_node("cdc-test-opensearch-down-") as node:
        yield node


def test_opensearch_down_fails_only_that_follower(
    own_opensearch: LocalOpenSearch, pg_db: str, tmp_path: Path, spark
) -> None:
    node = own_opensearch
    sql(pg_db, *ITEMS_DDL)
    insert_items(pg_db, 1, 10)
    sinks = [
        {"name": "local", "search": {"engine": "tantivy", "tables": ["public.items"]}},
        {
            "name": "os",
            "search": {
                "engine": "opensearch",
                "tables": ["public.items"],
                "hosts": [node.url],
                "replicas": 0,
                "timeout_s": 5,
            },
        },
    ]
    f = pipeline_file(tmp_path, pg_db, sinks)
    snapshot(f)
    apply_once(f, spark)
    state = load_pipeline(f).state_path
    before = load_checkpoint(state, "os")

    node.stop()
    sql(
        pg_db, "UPDATE items SET title = 'while down ' || id WHERE id <= 5", "DELETE FROM items WHERE id = 10"
    )
    stream(pg_db, f)
    run = cdc_here("apply", f, "--once")  # in-process: exit code and output as printed
    assert run.code == 4, (run.out, run.err)
    assert "Traceback" not in run.out + run.err and "Py4J" not in run.out + run.err
    assert "sink local: applied cut" in run.out, run.out
    assert f"sink os: FAILED: OpenSearch at {node.url} is unreachable (Connection refused)" in run.out, (
        run.out
    )
    assert "fix: start OpenSearch" in run.out and "resumes" in run.out, run.out
    local, failed = load_checkpoint(state, "local"), load_checkpoint(state, "os")
    assert local.cut_id > before.cut_id  # the other follower advanced
    # kept its place; the index is checked (markers) before a cut is started: nothing pending
    assert failed.cut_id == before.cut_id and failed.pending is None
    assert_verified(f, spark, "local")
    assert_index_is_source(f, pg_db, "local")

    # more changes while down; then the node comes back and the next runs catch up
    insert_items(pg_db, 11, 12, "late arrival")
    stream(pg_db, f)
    node.start()
    apply_once(f, spark, "os")  # the latest cut ...
    apply_once(f, spark, "os")  # ... and again: up to date
    apply_once(f, spark, "local")
    log = open_log_view(load_pipeline(f))
    latest = log.latest_cut().id
    log.close()
    caught_up = load_checkpoint(state, "os")
    assert caught_up.pending is None and caught_up.cut_id == latest
    assert_verified(f, spark, "os")
    assert_verified(f, spark, "local")
    assert "2 hit(s)" in hits(f, '"late arrival"', "os")[0]
    assert assert_index_is_source(f, pg_db, "os")["1"]["title"] == "while down 1"
    assert "10" not in assert_index_is_source(f, pg_db, "local")


# ---- 4. rejected documents ------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_rejected_row_names_table_and_key(engine: str, pg_db: str, tmp_path: Path, spark, request) -> None:
    sql(pg_db, "CREATE TABLE t (id int PRIMARY KEY, v text)", "INSERT INTO t VALUES (1, '10'), (2, '20')")
    sink = search_sink(engine, request, tables=["public.t"], fields={"public.t": {"v": "long"}})
    f = pipeline_file(tmp_path, pg_db, [sink], tables=("public.t",))
    snapshot(f)
    apply_once(f, spark)  # numbers in text: fine as long
    state = load_pipeline(f).state_path
    before = load_checkpoint(state, "s")

    sql(pg_db, "INSERT INTO t VALUES (3, 'abc'), (4, '40')", "UPDATE t SET v = '11' WHERE id = 1")
    stream(pg_db, f)
    with pytest.raises(SinkError) as failure:
        apply_once(f, spark)
    message = str(failure.value)
    assert "public.t" in message and "id=3" in message, message
    assert (
        ("mapper_parsing_exception" in message)
        if engine == "opensearch"
        else ("column 'v' (field type long)" in message)
    ), message
    # built on the driver, carried to the executors: names the pipeline file as given, rebuilds only this follower
    assert f"`cdc reset {f} --sink s --rebuild --yes`" in message, message
    after = load_checkpoint(state, "s")
    assert after.cut_id == before.cut_id and after.pending is not None  # not recorded as done
    with pytest.raises(SinkError):
        apply_once(f, spark)  # the same cut again: still rejected

    # the remedy the error names: a field type that fits; the index is rebuilt and the batch goes through
    edit_pipeline(f, lambda doc: doc["sinks"][0]["search"].update(fields={"public.t": {"v": "keyword"}}))
    apply_once(f, spark)
    assert load_checkpoint(state, "s").pending is None
    assert_verified(f, spark)
    assert assert_index_is_source(f, pg_db, table="public.t")["3"]["v"] == "abc"
    assert "1 hit(s)" in hits(f, "v:abc", table="public.t")[0]


# ---- 5. `cdc search` --------------------------------------------------------------------------------
def test_cdc_search_command(pg_db: str, tmp_path: Path, spark) -> None:
    sql(pg_db, *ITEMS_DDL)
    insert_items(pg_db, 1, 30)
    sql(pg_db, "CREATE TABLE empty (id int PRIMARY KEY, v text)")
    sinks = [
        {"name": "lake", "delta": {"path": "lake", "tables": ["public.empty"]}},
        {"name": "s", "search": {"engine": "tantivy", "tables": ["public.items", "public.empty"]}},
    ]
    f = pipeline_file(tmp_path, pg_db, sinks, tables=("public.items", "public.empty"))
    snapshot(f)

    before = cdc("search", f, "public.items", "hello")
    assert (
        before.code == 4 and "has no index for public.items yet" in before.err and "cdc apply" in before.err
    ), before

    apply_once(f, spark, "s")
    assert len(assert_index_is_source(f, pg_db)) == 30
    assert index_docs(f, table="public.empty") == {}
    run = cdc("search", f, "public.items", "title:world AND qty:[5 TO 7]", "--limit", "5")
    assert run.code == 0, run
    lines = run.out.splitlines()
    assert lines[0].startswith("sink s (tantivy), public.items: 3 hit(s)"), lines
    assert sorted(line.split()[2] for line in lines[1:]) == ["id=5", "id=6", "id=7"], lines
    assert "title=hello world 5" in run.out or "title=hello world 6" in run.out

    empty = cdc("search", f, "public.empty", "anything")
    assert empty.code == 0 and "the index is empty" in empty.out, empty
    for args, expected in (
        (("public.nope", "x"), "does not follow public.nope"),
        (("public.items", "x", "--sink", "lake"), "is a delta sink, not a search sink"),
        (("public.items", "x", "--sink", "zzz"), "no sink named 'zzz'"),
        (("public.items", "title:("), "invalid query"),
    ):
        bad = cdc("search", f, *args)
        assert bad.code == 2 and expected in bad.err and "Traceback" not in bad.err, (args, bad)
