"""`cdc teardown` removes every captured byte it says it removes (issue 34 item 2): after a capture
of a row with a distinctive value, no file under state_dir (binary ones included) holds that
value, for the local log and for `log: kafka` (whose staging log and snapshot segments used to
stay); Kafka topics stay and are named unless --delete-topics, which deletes them."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaAdminClient

from tests.fixtures.capture import make_pipe, no_traceback, ok, slot_info
from tests.fixtures.capture import snapshot as snapshot_local
from tests.fixtures.capture import stream_until_current as stream_local
from tests.fixtures.kafka_log import make_kpipe
from tests.fixtures.kafka_log import snapshot as snapshot_kafka
from tests.fixtures.kafka_log import stream_until_current as stream_kafka
from tests.harness import cdc, sql

pytestmark = pytest.mark.integration


def files_holding(root: Path, needle: bytes) -> list[Path]:
    """Every file under root (recursively, any content) that contains needle."""
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def capture_distinctive(dsn: str) -> bytes:
    """A table whose snapshot row and a streamed row carry one distinctive value; returns it."""
    value = f"secret-{uuid.uuid4().hex}"
    sql(
        dsn,
        "CREATE TABLE public.t (id int PRIMARY KEY, v text)",
        f"INSERT INTO public.t VALUES (1, '{value}-snap')",
    )
    return value.encode()


def test_teardown_local_log_leaves_no_captured_row(pg_db: str, tmp_path: Path) -> None:
    needle = capture_distinctive(pg_db)
    pipe = make_pipe(tmp_path, pg_db, ["public.t"])
    snapshot_local(pipe)
    sql(pg_db, f"INSERT INTO public.t VALUES (2, '{needle.decode()}-stream')")
    stream_local(pipe)
    state = tmp_path / ".cdc" / pipe.name
    assert files_holding(state, needle), "the capture did not write the value: the test would prove nothing"

    run = ok("teardown", pipe.file, "--drop-slot", "--yes")
    assert files_holding(tmp_path, needle) == [], "captured rows left behind"
    assert f"deleted the log at {pipe.log.resolve()}" in run.out, run.out
    assert slot_info(pg_db, pipe.slot) is None
    assert "followers' data was left in place: none configured" in run.out, run.out


def test_teardown_kafka_log_leaves_no_captured_row_and_deletes_topics_when_asked(
    pg_db: str, tmp_path: Path, kafka
) -> None:
    needle = capture_distinctive(pg_db)
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], kafka.bootstrap)  # its lake is outside state_dir
    snapshot_kafka(pipe)
    sql(pg_db, f"INSERT INTO public.t VALUES (2, '{needle.decode()}-stream')")
    stream_kafka(pipe)
    state = tmp_path / ".cdc" / pipe.name
    held = files_holding(state, needle)
    assert any("segments" in p.parts for p in held) and any(p.name.startswith("log.db") for p in held), held
    topics = {pipe.topic("public.t"), pipe.cuts_topic, pipe.schemas_topic}

    run = ok("teardown", pipe.file, "--drop-slot", "--yes")
    assert files_holding(state.parent, needle) == [], "captured rows left behind under state_dir"
    assert "deleted the staging log" in run.out and "snapshot segment files" in run.out, run.out
    # without --delete-topics the topics stay, and the output names each one and where
    assert f"left 3 Kafka topic(s) at {kafka.bootstrap}, holding the captured rows" in run.out, run.out
    assert all(t in run.out for t in topics) and "--delete-topics" in run.out, run.out
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        assert topics <= set(admin.list_topics())

        run = ok("teardown", pipe.file, "--delete-topics", "--yes")
        assert f"deleted 3 Kafka topic(s) at {kafka.bootstrap}" in run.out, run.out
        deadline = time.monotonic() + 60  # the broker deletes topics asynchronously
        while topics & set(admin.list_topics()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not topics & set(admin.list_topics()), admin.list_topics()
    finally:
        admin.close()


def test_teardown_delete_topics_refused_for_a_local_log(pg_db: str, tmp_path: Path) -> None:
    pipe = make_pipe(tmp_path, pg_db, ["public.t"])
    run = cdc("teardown", pipe.file, "--delete-topics", "--yes")
    assert run.code == 2 and "error: --delete-topics: this pipeline has no Kafka log" in run.err, run
    no_traceback(run)


def test_teardown_delete_topics_over_sasl_ssl_with_the_pipelines_security(
    pg_db: str, tmp_path: Path, secure_kafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--delete-topics signs in as the pipeline does (SASL_SSL, SCRAM); a login Kafka refuses stops
    teardown before it changes anything (exit 3, naming the setting, no secret printed)."""
    broker = secure_kafka
    monkeypatch.delenv("KAFKA_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("KAFKA_PASSWORD", broker.password)
    security = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": broker.user,
        "sasl_password": "${KAFKA_PASSWORD}",
        "ssl_cafile": str(broker.ca_file),
    }
    needle = capture_distinctive(pg_db)
    pipe = make_kpipe(tmp_path, pg_db, ["public.t"], broker.bootstrap, sinks=[], **security)
    snapshot_kafka(pipe)
    state = tmp_path / ".cdc" / pipe.name
    topics = {pipe.topic("public.t"), pipe.cuts_topic, pipe.schemas_topic}

    monkeypatch.setenv("KAFKA_PASSWORD", "wrong-" + broker.password)
    run = cdc("teardown", pipe.file, "--drop-slot", "--delete-topics", "--yes")
    assert run.code == 3 and "wrong log.kafka.sasl_password" in run.err, run
    assert broker.password not in run.out + run.err
    no_traceback(run)
    assert files_holding(state, needle) and slot_info(pg_db, pipe.slot) is not None  # nothing changed

    monkeypatch.setenv("KAFKA_PASSWORD", broker.password)
    run = ok("teardown", pipe.file, "--drop-slot", "--delete-topics", "--yes")
    assert f"deleted 3 Kafka topic(s) at {broker.bootstrap}" in run.out, run.out
    assert files_holding(state.parent, needle) == [] and slot_info(pg_db, pipe.slot) is None
    admin = KafkaAdminClient(
        bootstrap_servers=broker.bootstrap,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username=broker.user,
        sasl_plain_password=broker.password,
        ssl_cafile=str(broker.ca_file),
    )
    try:
        deadline = time.monotonic() + 60  # the broker deletes topics asynchronously
        while topics & set(admin.list_topics()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not topics & set(admin.list_topics()), admin.list_topics()
    finally:
        admin.close()
