"""Consistent reads at a cut (issue 13 item 4): each cut the delta sink applies is recorded in
`<path>/_cdc_cuts` with every follower table's Delta version; readers pinned at a cut (Spark
`read_at_cut`/`views_at_cut`, delta-rs `tables_at_cut_arrow`, `cdc sql`) see whole source
transactions across tables, while a plain read of the live tables can see half of one.

The scenario: transactions that each move money from a row of `acct_a` to a row of `acct_b` (the
sum over both tables never changes in the source). An apply of such a cut is held after its first
table's commit (CDC_PAUSE=apply:between-tables): the live tables then break the invariant, the
readers pinned at the last complete cut do not; after the apply the new cut is read, equal to the
source.
"""

from __future__ import annotations

import threading
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

from cdc.ground import logsetup
from pipelines.cli import cli
from tests.fixtures.lake import LAKE, apply, apply_ok, make_pipe, snapshot, stream
from tests.harness import source_rows, sql

pytestmark = pytest.mark.integration

SETUP = (
    "CREATE TABLE acct_a(id int PRIMARY KEY, bal numeric(12,2) NOT NULL)",
    "CREATE TABLE acct_b(id int PRIMARY KEY, bal numeric(12,2) NOT NULL)",
    "INSERT INTO acct_a SELECT g, 1000 FROM generate_series(1, 20) g",
    "INSERT INTO acct_b SELECT g, 1000 FROM generate_series(1, 20) g",
)
TOTAL = Decimal(40 * 1000)
TABLES = ["public.acct_a", "public.acct_b"]


def transfers(dsn: str, round_no: int) -> None:
    """Ten transactions, each moving an amount from acct_a to acct_b (one commit each)."""
    for i in range(1, 11):
        amount = round_no * 10 + i
        sql(
            dsn,
            "BEGIN",
            f"UPDATE acct_a SET bal = bal - {amount} WHERE id = {i}",
            f"UPDATE acct_b SET bal = bal + {amount} WHERE id = {i + 5}",
            "COMMIT",
        )


def spark_sum(df) -> Decimal:
    return df.agg({"bal": "sum"}).first()[0]


def live_sum(spark, base: Path) -> Decimal:
    return sum(
        spark_sum(spark.read.format("delta").load(str(base / "public" / t))) for t in ("acct_a", "acct_b")
    )


def test_readers_pinned_at_a_cut_see_whole_transactions(
    pg_db: str, tmp_path: Path, spark, monkeypatch
) -> None:
    from sinks.delta.cuts import cut_record, read_at_cut, tables_at_cut_arrow, views_at_cut

    sql(pg_db, *SETUP)
    # one table after the other, so the apply can be held with exactly one table of the cut committed
    pipe = make_pipe(tmp_path, pg_db, TABLES, sinks=[LAKE], spark={"apply_parallelism": 1})
    base = tmp_path / "lake"
    snapshot(pipe)
    apply_ok(pipe, spark)
    first = cut_record(spark, base)
    assert set(first.versions) == {"public.acct_a", "public.acct_b"}, first
    assert (base / "_cdc_cuts" / "_delta_log").is_dir()

    pause = tmp_path / "paused"
    monkeypatch.setenv("CDC_PAUSE", "apply:between-tables")
    monkeypatch.setenv("CDC_PAUSE_FILE", str(pause))
    previous = first
    transfers(pg_db, 1)
    stream(pipe)
    done: list = []
    worker = threading.Thread(target=lambda out=done: out.append(apply(pipe, spark)), daemon=True)
    worker.start()
    while not pause.exists():  # the apply holds with one table of the cut committed
        assert worker.is_alive(), f"apply ended without reaching the pause: {done}"
        worker.join(0.05)

    # The live tables show half of the cut's transactions: the invariant breaks (the test can
    # tell a torn read), the readers pinned at the last complete cut do not.
    assert live_sum(spark, base) != TOTAL
    assert cut_record(spark, base).cut_id == previous.cut_id
    pinned = sum(spark_sum(read_at_cut(spark, base, t)) for t in TABLES)
    assert pinned == TOTAL
    record, views = views_at_cut(spark, base)
    assert views == {"public.acct_a": "acct_a", "public.acct_b": "acct_b"}
    both = spark.sql("SELECT (SELECT sum(bal) FROM acct_a) + (SELECT sum(bal) FROM acct_b) AS total").first()
    assert both["total"] == TOTAL and record.cut_id == previous.cut_id
    rs_record, arrow = tables_at_cut_arrow(base)  # delta-rs, no Spark
    assert rs_record.versions == previous.versions
    assert sum(sum(arrow[t].column("bal").to_pylist()) for t in TABLES) == TOTAL

    pause.unlink()
    worker.join(600)  # a hang guard only
    assert not worker.is_alive() and done and done[0][0][0].error is None, done
    latest = cut_record(spark, base)
    assert latest.cut_id > previous.cut_id
    assert all(latest.versions[t] > previous.versions[t] for t in TABLES), (previous, latest)

    # After the apply, the latest cut equals the source, read with delta-rs; an older cut stays readable.
    monkeypatch.delenv("CDC_PAUSE")
    _record, arrow = tables_at_cut_arrow(base)
    for t in TABLES:
        source = source_rows(pg_db, t, ("id",))
        got = {(str(r["id"]),): str(r["bal"]) for r in arrow[t].to_pylist()}
        assert got == {k: r["bal"] for k, r in source.items()}, t
    _old, old_tables = tables_at_cut_arrow(base, first.cut_id)
    assert all(set(old_tables[t].column("bal").to_pylist()) == {Decimal(1000)} for t in TABLES)

    # A replay of the same cut records nothing new (an idempotent append).
    rows_before = spark.read.format("delta").load(str(base / "_cdc_cuts")).count()
    from sinks.delta.cuts import record_cut

    record_cut(spark, base, latest.log_id, latest.cut_id, latest.lsn, {}, {}, again=True)
    assert spark.read.format("delta").load(str(base / "_cdc_cuts")).count() == rows_before

    # `cdc sql`: views at the latest cut, rows printed; --cut pins an older one; --cuts lists them.
    runner = CliRunner()
    query = "SELECT sum(a.bal) + sum(b.bal) AS total, count(*) AS n FROM acct_a a JOIN acct_b b USING (id)"
    result = runner.invoke(cli, ["sql", str(pipe.file), query], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["total\tn", f"{TOTAL:.2f}\t20"], result.stdout
    assert f"-- sink lake: cut {latest.cut_id} " in result.stderr, result.stderr
    result = runner.invoke(
        cli, ["sql", str(pipe.file), "--cut", str(first.cut_id), "--json", "SELECT max(bal) AS m FROM acct_b"]
    )
    assert result.exit_code == 0 and result.stdout.strip() == '{"m": "1000.00"}', result.output
    result = runner.invoke(cli, ["sql", str(pipe.file), "--cuts"])
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 2, result.output
    result = runner.invoke(cli, ["sql", str(pipe.file), "SELECT * FROM nosuch"])
    assert result.exit_code == 2 and "error: DataFusion refused the query" in result.stderr, result.output
    result = runner.invoke(cli, ["sql", str(pipe.file), "--cut", "999", "SELECT 1"])
    assert result.exit_code == 2 and "cut 999 is not recorded" in result.stderr, result.output


def disk_files(path: Path) -> tuple[int, int]:
    """(Parquet data files on disk, JSON commits in _delta_log) of a Delta table."""
    data = sum(1 for p in path.rglob("*.parquet") if "_delta_log" not in p.parts)
    return data, len(list((path / "_delta_log").glob("*.json")))


def test_a_cut_record_spark_wrote_goes_on_with_delta_rs_appends(tmp_path: Path, spark) -> None:
    """A lake from before delta-rs wrote the cut record (Spark made `_cdc_cuts`, as every lake of
    0.2.0 and earlier): the next cuts are appended by delta-rs; Spark and delta-rs read every row,
    a replayed cut (`again`) adds none, and `forget_table` (Spark's DELETE) still works beside them."""
    import sinks.delta.cuts as cuts
    from cdc.ground.tables import TableName

    base = tmp_path / "lake"
    local = cuts._local
    try:
        cuts._local = lambda _path: False  # the Spark writer, as before
        cuts.record_cut(spark, base, "log", 1, 100, {"public.t": 1}, {"public.t": "public/t"}, again=False)
    finally:
        cuts._local = local
    cuts.record_cut(
        spark, base, "log", 2, 200, {"public.t": 2, "public.u": 1}, {"public.t": "public/t"}, again=False
    )
    cuts.record_cut(
        spark, base, "log", 2, 200, {"public.t": 2, "public.u": 1}, {"public.t": "public/t"}, again=True
    )
    both = [(c.cut_id, c.versions) for c in cuts.list_cuts(spark, base)]
    assert both == [(c.cut_id, c.versions) for c in cuts.list_cuts_arrow(base)]
    assert both == [(2, {"public.t": 2, "public.u": 1}), (1, {"public.t": 1})]
    cuts.forget_table(spark, base, TableName.parse("public.u"))
    cuts.record_cut(spark, base, "log", 3, 300, {"public.t": 3}, {"public.t": "public/t"}, again=False)
    assert (
        [c.cut_id for c in cuts.list_cuts_arrow(base)]
        == [3, 1]
        == [c.cut_id for c in cuts.list_cuts(spark, base)]
    )


@pytest.mark.slow  # a soak: apply keeps applying cuts for as long as maintenance runs (make test-slow)
def test_maintain_beside_a_running_apply(pg_db: str, tmp_path: Path, spark) -> None:
    """Many small cuts, then `cdc maintain` (OPTIMIZE, VACUUM, checkpoint) while apply keeps
    applying cuts: nothing lost or doubled (delta-rs read equal to the source, cdc verify 0), an
    older cut still readable; then, with no apply running, a retention below the safety default
    removes the compacted files and the cuts older than it."""
    from pipelines.maintain import run_maintain
    from sinks.delta.cuts import cut_record, tables_at_cut_arrow
    from sinks.registry import load_pipeline
    from tests.fixtures.lake import verified
    from tests.fixtures.readers import delta_rows

    sql(
        pg_db,
        "CREATE TABLE t(id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.t"], sinks=[LAKE])
    table = tmp_path / "lake" / "public" / "t"
    snapshot(pipe)
    apply_ok(pipe, spark)
    first = cut_record(spark, tmp_path / "lake")

    def small_cut(i: int) -> None:
        sql(
            pg_db,
            f"UPDATE t SET v = 'r{i}' WHERE id = {i % 50 + 1}",
            f"INSERT INTO t VALUES ({100 + i}, 'n{i}')",
        )
        stream(pipe)
        apply_ok(pipe, spark)

    for i in range(2):
        small_cut(i)
    before = disk_files(table)

    # `cdc maintain` in a thread with its own Spark session (its own SQL confs, as its own process
    # has); apply goes on in this thread until maintenance is done and one more cut is in.
    out: list = []
    pipeline = load_pipeline(pipe.file)
    args = (pipeline, spark.newSession(), None, None, 1, True, True)
    with logsetup.collected("pipelines.maintain") as lines:  # maintain's lines, not apply's
        worker = threading.Thread(target=lambda: out.append(run_maintain(*args)), daemon=True)
        worker.start()
        i = 2
        while worker.is_alive() or i < 3:
            small_cut(i)
            i += 1
        worker.join()
    assert out == [0], "\n".join(lines)
    report = "\n".join(lines)
    print(report)
    assert "sink lake: public/t: " in report and "VACUUM retention 168 h" in report, report
    during = disk_files(table)
    rows = delta_rows(None, table)
    assert sorted(rows) == sorted(source_rows(pg_db, "public.t", ("id",))), "rows lost or doubled"
    assert {k: r["v"] for k, r in rows.items()} == {
        k: r["v"] for k, r in source_rows(pg_db, "public.t", ("id",)).items()
    }
    _rec, old = tables_at_cut_arrow(
        tmp_path / "lake", first.cut_id
    )  # 168 h retention: the first cut is readable
    assert old["public.t"].num_rows == 50

    # No apply running: retention 0 (the user says so) keeps only what the newest cut needs.
    small_cut(i)
    with logsetup.collected("pipelines.maintain") as lines:
        assert run_maintain(pipeline, spark.newSession(), ["lake"], 0.0, 1, True, True) == 0
    report = "\n".join(lines)
    print(report)
    assert "below Delta's safety default" in report, report
    after = disk_files(table)
    print(
        f"public.t files: {before} after 3 cuts, {during} after maintain beside apply, {after} after --retain-hours 0"
    )
    assert after[0] < before[0] and after[0] <= 2, (before, during, after)
    assert "_cdc_cuts: " in report and "forgotten" in report, report
    with pytest.raises(Exception, match="is not recorded"):
        tables_at_cut_arrow(tmp_path / "lake", first.cut_id)
    _rec, now = tables_at_cut_arrow(tmp_path / "lake")
    assert now["public.t"].num_rows == len(source_rows(pg_db, "public.t", ("id",)))
    verified(pipe, spark)
