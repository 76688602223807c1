"""Upgrading a pipeline in place (README "Upgrading"): the state_dir cdc 0.1.0 wrote
(tests/fixtures/data/state-0.1.0: a local log after snapshot + stream + apply, and one more cut its
Delta follower has not applied) is upgraded at the start of the first verb, and the follower then
continues exactly: the next apply takes exactly the pending cut, and `cdc verify` finds the
follower identical to the source (the source rows the fixture ended with, loaded here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import orjson
import pytest
from kafka import KafkaProducer

from cdc.ground.formats import DELTA_CUTS, KAFKA, STATE, VERSION
from tests.fixtures.capture import ok
from tests.fixtures.kafka_log import make_kpipe
from tests.fixtures.kafka_log import snapshot as snapshot_kafka
from tests.fixtures.topics import topic_records
from tests.harness import apply_once, cdc, sql, verify

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).parent.parent / "fixtures" / "data" / "state-0.1.0"


def test_state_of_0_1_0_upgraded_and_the_follower_continues_exactly(
    pg_db: str, tmp_path: Path, spark, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "p"
    shutil.copytree(FIXTURE, work)
    pipe = work / "pipeline.yml"
    sql(pg_db, *[s for s in (work / "source.sql").read_text().split(";") if s.strip()])
    monkeypatch.setenv("FIXTURE_DSN", pg_db)
    ckpt_file = work / "state" / "checkpoints" / "lake.json"
    before = json.loads(ckpt_file.read_text())
    assert "format" not in before and before["cut_id"] == 3  # as 0.1.0 left it: cut 5 not applied yet

    run = ok("log", "read", pipe)  # any verb upgrades at start, and says so on stderr
    assert f"from state format 0 (cdc 0.1.0) to {STATE.version} (cdc {VERSION}), in place" in run.err, run.err
    assert json.loads(ckpt_file.read_text()) == {"format": STATE.version, "cdc_version": VERSION, **before}
    assert "upgraded" not in ok("log", "read", pipe).err  # once only

    # 0.1.0's marker keeps its own position (end, cut_id): the self-check compares that offset
    from deltalake import DeltaTable

    from cdc.ground.tables import TableName
    from sinks.delta.paths import table_path

    items = str(table_path(work / "lake", TableName("public", "items")))
    old_marker = json.loads(DeltaTable(items).metadata().configuration["cdc.follower"])
    assert old_marker["end"] == 4 and old_marker["cut_id"] == 3, old_marker

    runs = apply_once(pipe, spark)
    assert [(r.sink, r.cut_id) for r in runs] == [("lake", 5)], runs
    after = json.loads(ckpt_file.read_text())
    assert (after["format"], after["cut_id"], after["tables"]) == (
        STATE.version,
        5,
        {"public.items": [1, 7]},
    ), after
    # written again, the table's marker takes the new form: the position is the MERGE's txn version
    marker = json.loads(DeltaTable(items).metadata().configuration["cdc.follower"])
    assert "end" not in marker and {k: marker[k] for k in ("pipeline", "sink", "base")} == {
        k: old_marker[k] for k in ("pipeline", "sink", "base")
    }, marker
    assert after["written"] == {"public.items": 5}, after
    code, report = verify(pipe, spark)
    assert code == 0, report
    # the lake's _cdc_cuts of 0.1.0 got the format columns with the new cut's row (its old row: null)
    cuts = spark.read.format("delta").load(str(work / "lake" / "_cdc_cuts")).orderBy("cut_id").collect()
    assert [(r.cut_id, r.format, r.cdc_version) for r in cuts] == [
        (3, None, None),
        (5, DELTA_CUTS.version, VERSION),
    ], cuts


def test_kafka_cut_record_from_the_future_refused_cleanly(pg_db: str, tmp_path: Path, kafka) -> None:
    """A cut record a newer cdc published (its `format` above this cdc's kafka format) stops the
    readers of the topics with exit 5 naming both versions, instead of misreading the records
    (`cdc status` shows it in its log line)."""
    sql(pg_db, "CREATE TABLE public.t (id int PRIMARY KEY, v text)", "INSERT INTO public.t VALUES (1, 'a')")
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], kafka.bootstrap, sinks=[])
    snapshot_kafka(pipe)
    assert ok("log", "read", pipe.file).out.strip()  # this release reads its own records

    latest = orjson.loads(topic_records(kafka.bootstrap, pipe.cuts_topic)[-1].value)
    assert (latest["format"], latest["cdc_version"]) == (KAFKA.version, VERSION)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap)
    future = {**latest, "cut_id": latest["cut_id"] + 1, "format": KAFKA.version + 1, "cdc_version": "0.9.0"}
    producer.send(pipe.cuts_topic, key=b"cut", value=orjson.dumps(future)).get(timeout=30)
    producer.close()

    said = f"is in kafka format {KAFKA.version + 1}, written by cdc 0.9.0; this cdc {VERSION} reads kafka format {KAFKA.version}"
    run = cdc("log", "read", pipe.file)
    assert run.code == 5 and said in run.err and "  fix: run cdc 0.9.0 or newer" in run.err, run
    status = cdc("status", pipe.file)  # status reports a log it cannot read in its log line, as ever
    assert f"log (kafka): the Kafka log {pipe.cuts_topic} {said}" in status.out, status
    assert "Traceback" not in run.out + run.err + status.out + status.err
