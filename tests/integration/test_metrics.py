"""Prometheus metrics, alert rules, the Grafana board and JSON logs (issue 16 items 1, 2, 4; README
"Monitoring"), against the real running pipeline: the endpoint is scraped over HTTP while `cdc run`
streams (and by a real Prometheus evaluating docs/monitoring/alerts.yml and the board's queries),
and while the apply job applies to a Delta follower on the test Spark session."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cdc.ground import logsetup
from pipelines.metrics import free_port, serving
from sinks.registry import load_pipeline
from tests.fixtures.capture import make_pipe, no_traceback, snapshot
from tests.fixtures.readers import delta_rows
from tests.harness import (
    REPO,
    apply_once,
    cdc,
    cdc_popen,
    flush_wal,
    source_rows,
    sql,
    stop_process,
    stream_changes,
    wait_for,
)

MONITORING = REPO / "docs" / "monitoring"


class Page:
    """One scrape of /metrics: sample values by name and labels, and the families it declares."""

    def __init__(self, port: int):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            self.text = response.read().decode()
        self.families = {f.name: f for f in text_string_to_metric_families(self.text)}
        self.samples = {
            (s.name, frozenset(s.labels.items())): s.value for f in self.families.values() for s in f.samples
        }

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def names(self) -> set[str]:
        """Every series name a query may use (counters with _total, histograms' _bucket/_sum/_count)."""
        out = set()
        for f in self.families.values():
            out.add(f.name)
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(f.type, [])
            out.update(f.name + s for s in suffixes)
        return out


def scrape(port: int) -> Page | None:
    try:
        return Page(port)
    except OSError:
        return None


def prom_query(port: int, expr: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def board_queries() -> list[str]:
    board = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def rule_queries() -> list[str]:
    doc = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: scripts/setup.sh installs it (Debian package prometheus)"
    return path


@pytest.mark.unit
def test_alert_rules_pass_promtool() -> None:
    """The rules file is valid, and each alert fires on the series it is meant for (and not on a
    healthy pipeline), including a killed `cdc run` whose series vanish (the liveness group fires, the
    rules on the vanished series stay blind): promtool's own unit tests in docs/monitoring/alerts_test.yml."""
    check = subprocess.run(
        [promtool(), "check", "rules", "alerts.yml"], cwd=MONITORING, capture_output=True, text=True
    )
    assert check.returncode == 0 and "SUCCESS: 13 rules found" in check.stdout, check
    test = subprocess.run(
        [promtool(), "test", "rules", "alerts_test.yml"], cwd=MONITORING, capture_output=True, text=True
    )
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test


@pytest.mark.integration
def test_cdc_run_metrics_move_with_the_source(pg_db: str, tmp_path: Path) -> None:
    """`cdc run --metrics-port --log-format json` (no sinks: no Spark): one endpoint shows the
    snapshot's progress, the stream child's counters (merged in) and the slot and log gauges; they
    move when the source is written; a real Prometheus scrapes it, evaluates the alert rules and
    every query of the Grafana board; stdout is JSON lines."""
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g",
    )
    pipe = make_pipe(tmp_path, pg_db, ["public.t"], name="metrics_run")
    port = free_port()
    proc = cdc_popen("run", pipe.file, "--metrics-port", str(port), "--log-format", "json")
    prometheus = None
    try:
        labels = {"pipeline": "metrics_run"}
        page = wait_for(
            "the stream child's series on the endpoint",
            lambda: (
                (p := scrape(port))
                and p.get("pgcdc_up", component="stream", **labels) == 1
                and p.get("pgcdc_slot_active", slot=pipe.slot, **labels) == 1
                and p
            ),
            proc,
        )
        assert page.get("pgcdc_up", component="run", **labels) == 1
        assert page.get("pgcdc_snapshot_rows_total", table="public.t", **labels) == 20
        assert page.get("pgcdc_snapshot_table_done", table="public.t", **labels) == 1
        assert page.get("pgcdc_snapshot_last_success_timestamp_seconds", **labels) > 0
        assert page.get("pgcdc_source_up", **labels) == 1
        wal = page.get("pgcdc_source_wal_lsn", **labels)
        assert wal >= page.get("pgcdc_slot_confirmed_flush_lsn", slot=pipe.slot, **labels) > 0
        assert page.get("pgcdc_slot_lag_bytes", slot=pipe.slot, **labels) >= 0
        assert page.get("pgcdc_slot_retained_wal_bytes", slot=pipe.slot, **labels) >= 0
        before = {
            "events": page.get("pgcdc_stream_events_total", **labels) or 0,
            "txns": page.get("pgcdc_stream_transactions_total", **labels) or 0,
            "cut": page.get("pgcdc_log_cut_id", **labels),
            "cut_lsn": page.get("pgcdc_log_cut_lsn", **labels),
        }
        assert before["events"] == 0 and before["cut"] >= 1, before  # snapshot rows are not stream events

        sql(pg_db, "INSERT INTO t SELECT g, 'w' FROM generate_series(21, 30) g")  # 10 events, 1 transaction
        sql(pg_db, "UPDATE t SET v = 'u' WHERE id <= 5")  # 5 events, 1 transaction
        flush_wal(pg_db)
        written_at = int(sql(pg_db, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])
        page = wait_for(
            "15 events counted and the slot confirmed past the writes",
            lambda: (
                (p := scrape(port))
                and p.get("pgcdc_stream_events_total", **labels) == 15
                and p.get("pgcdc_slot_confirmed_flush_lsn", slot=pipe.slot, **labels) >= written_at
                and p
            ),
            proc,
        )
        assert page.get("pgcdc_stream_transactions_total", **labels) == 2
        assert page.get("pgcdc_stream_batches_total", **labels) >= 1
        assert page.get("pgcdc_stream_durable_lsn", **labels) >= written_at
        assert page.get("pgcdc_stream_acked_lsn", **labels) >= written_at
        assert page.get("pgcdc_log_cut_id", **labels) > before["cut"]
        assert page.get("pgcdc_log_cut_lsn", **labels) > before["cut_lsn"]
        assert page.get("pgcdc_stream_last_success_timestamp_seconds", **labels) > 0
        lint = subprocess.run(
            [promtool(), "check", "metrics"], input=page.text, capture_output=True, text=True
        )
        assert lint.returncode == 0 and not lint.stdout + lint.stderr, lint  # format and naming conventions

        # A real Prometheus: scrapes the merged page, evaluates the rules, answers the board's queries.
        prometheus, prom_port = start_prometheus(tmp_path, port)
        wait_for("Prometheus to start", lambda: ready(prom_port), prometheus)
        wait_for(
            "Prometheus to have scraped the events counter",
            lambda: prom_query(prom_port, 'pgcdc_stream_events_total{pipeline="metrics_run"} == 15')["data"][
                "result"
            ],
            prometheus,
        )
        groups = wait_for(
            "the alert rules evaluated",
            lambda: (
                (gs := prom_api(prom_port, "rules")["groups"])
                and all(r.get("lastEvaluation", "").startswith("20") for g in gs for r in g["rules"])
                and gs
            ),
            prometheus,
        )
        assert [r["health"] for g in groups for r in g["rules"]] == ["ok"] * len(rule_queries()), groups
        for expr in board_queries():
            answer = prom_query(prom_port, expr.replace("$pipeline", "metrics_run"))
            assert answer["status"] == "success", (expr, answer)
        names = page.names()
        used = {n for e in board_queries() + rule_queries() for n in names_in(e)}
        missing = {n for n in used if n not in names and not n.startswith(("pgcdc_follower", "pgcdc_apply"))}
        assert not missing, f"the board or the rules use series the endpoint does not declare: {missing}"
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=30)
        out, err = stop_process(proc)
    assert proc.returncode == 0, (proc.returncode, out, err)
    no_traceback((out, err))
    records = [json.loads(line) for line in out.splitlines()]  # every stdout line is one JSON object
    assert records and all(set(r) == {"time", "level", "pipeline", "event", "fields"} for r in records), out
    assert all(r["pipeline"] == "metrics_run" and r["time"].endswith("Z") for r in records), out
    assert any(r["event"] == f"metrics: http://127.0.0.1:{port}/metrics" for r in records), out
    assert any(r["event"].startswith("streamed 15 events") for r in records), out  # the child's lines too


def names_in(expr: str) -> set[str]:
    import re

    return set(re.findall(r"\bpgcdc_[a-z_]+", expr))


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def prom_api(port: int, what: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{what}", timeout=30) as response:
        return json.loads(response.read())["data"]


def start_prometheus(tmp_path: Path, target_port: int) -> tuple[subprocess.Popen, int]:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: scripts/setup.sh installs it (Debian package prometheus)"
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(MONITORING / "alerts.yml")],
                "scrape_configs": [
                    {"job_name": "pgcdc", "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}
                ],
            }
        )
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    return proc, port


@pytest.mark.integration
def test_apply_metrics_follow_the_follower(pg_db: str, tmp_path: Path, spark) -> None:
    """The apply job's endpoint (in-process, on the test Spark session): a follower's backlog
    (snapshot rows and streamed events) and lag, then after one apply its applied cut and LSN,
    no lag, and one more observation in each stage histogram; the Delta table (read with Spark)
    holds the source's rows. One apply only: Spark is the expensive part."""
    sql(
        pg_db,
        "CREATE TABLE t (id int PRIMARY KEY, v text)",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 20) g",
    )
    lake = tmp_path / "lake"
    pipe = make_pipe(
        tmp_path,
        pg_db,
        ["public.t"],
        name="metrics_apply",
        sinks=[{"name": "lake", "delta": {"path": str(lake)}}],
    )
    snapshot(pipe)
    port = free_port()
    labels = {"pipeline": "metrics_apply", "sink": "lake"}
    with logsetup.collected() as said, serving(load_pipeline(pipe.file), "apply", port):
        assert said == [f"metrics: http://127.0.0.1:{port}/metrics"]
        page = Page(port)
        assert page.get("pgcdc_follower_lag_events", **labels) == 20  # never applied: the whole snapshot
        assert page.get("pgcdc_follower_applied_lsn", **labels) is None
        assert page.get("pgcdc_follower_ok", **labels) == 1
        cut = page.get("pgcdc_log_cut_id", pipeline="metrics_apply")
        counts = {
            s: page.get("pgcdc_apply_stage_duration_seconds_count", stage=s, **labels) or 0
            for s in ("read", "prepare", "cut")
        }
        cuts = page.get("pgcdc_apply_cuts_total", **labels) or 0

        sql(pg_db, "INSERT INTO t SELECT g, 'w' FROM generate_series(21, 25) g", "DELETE FROM t WHERE id = 1")
        stream_changes(pipe.file, pg_db)
        page = Page(port)
        assert page.get("pgcdc_log_cut_id", pipeline="metrics_apply") > cut
        assert page.get("pgcdc_follower_lag_events", **labels) == 26  # 20 snapshot rows + 6 events
        assert page.get("pgcdc_follower_lag_seconds", **labels) > 0  # since the snapshot started
        assert page.get("pgcdc_stream_events_total", pipeline="metrics_apply") == 6

        apply_once(pipe.file, spark)
        page = Page(port)
        assert page.get("pgcdc_follower_applied_cut_id", **labels) == page.get(
            "pgcdc_log_cut_id", pipeline="metrics_apply"
        )
        applied = page.get("pgcdc_follower_applied_lsn", **labels)
        assert applied == page.get("pgcdc_log_cut_lsn", pipeline="metrics_apply")
        assert (
            page.get("pgcdc_follower_lag_bytes", **labels)
            == page.get("pgcdc_source_wal_lsn", pipeline="metrics_apply") - applied
        )
        assert page.get("pgcdc_follower_lag_events", **labels) == 0
        assert page.get("pgcdc_follower_lag_seconds", **labels) == 0
        for s in ("read", "prepare", "cut"):
            assert page.get("pgcdc_apply_stage_duration_seconds_count", stage=s, **labels) == counts[s] + 1, s
        assert page.get("pgcdc_apply_table_duration_seconds_count", table="public.t", **labels) == 1
        assert page.get("pgcdc_apply_cuts_total", **labels) == cuts + 1
        assert page.get("pgcdc_apply_last_success_timestamp_seconds", **labels) > 0
        assert page.names() >= {n for e in board_queries() + rule_queries() for n in names_in(e)}
    assert scrape(port) is None  # the endpoint stops with the block
    lake_rows = {
        k: {"id": str(r["id"]), "v": r["v"]} for k, r in delta_rows(spark, lake / "public" / "t").items()
    }
    assert lake_rows == source_rows(pg_db, "public.t", ["id"])


@pytest.mark.integration
def test_metrics_port_taken_and_json_errors(pg_db: str, tmp_path: Path) -> None:
    """The file's metrics.port in use: a one-shot verb (beside a running `cdc run`, which holds it)
    says so and serves none; an explicit --metrics-port in use is exit 2 with error/fix (as one JSON
    record with --log-format json); `metrics:` in the pipeline file is checked like every key."""
    sql(pg_db, "CREATE TABLE t (id int PRIMARY KEY)")
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        pipe = make_pipe(tmp_path, pg_db, ["public.t"], metrics={"port": port})
        run = cdc("snapshot", pipe.file, "--no-progress")
        assert run.code == 0, run
        assert f"metrics: port {port} (metrics.port) is in use" in run.out + run.err, run
        run = cdc("snapshot", pipe.file, "--no-progress", "--metrics-port", str(port))
        assert run.code == 2, run
        assert (
            f"error: cannot serve metrics on 127.0.0.1:{port}" in run.err
            and "  fix: choose a free port" in run.err
        ), run
        run = cdc(
            "stream",
            pipe.file,
            "--until",
            "current",
            "--metrics-port",
            str(port),
            env={"CDC_LOG_FORMAT": "json"},
        )
        assert run.code == 2, run
        (record,) = [json.loads(line) for line in run.err.splitlines()]
        assert (
            record["level"] == "error"
            and record["event"].startswith("cannot serve metrics")
            and record["pipeline"] == "test"
        )
        assert record["fields"]["exit_code"] == 2 and record["fields"]["fix"].startswith(
            "choose a free port"
        ), record
        no_traceback(run)
    pipe = make_pipe(tmp_path, pg_db, ["public.t"], metrics={"prot": 9100})
    run = cdc("validate", pipe.file)
    assert run.code == 2 and "did you mean 'port'" in run.err, run
