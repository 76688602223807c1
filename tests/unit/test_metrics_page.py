"""pipelines/metrics.py's merged page (cdc run: this process and the stream child's): one family
per name and one sample per series, counters added up, the child's gauges win; promtool accepts
the page (exposition format and naming lint)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipelines.metrics import Merged

pytestmark = pytest.mark.unit

CHILD = """# HELP pgcdc_snapshot_rows_total Rows copied
# TYPE pgcdc_snapshot_rows_total counter
pgcdc_snapshot_rows_total{pipeline="shop",table="public.t"} 20.0
# HELP pgcdc_snapshot_table_done Done
# TYPE pgcdc_snapshot_table_done gauge
pgcdc_snapshot_table_done{pipeline="shop",table="public.t"} 0.0
# HELP pgcdc_up Up
# TYPE pgcdc_up gauge
pgcdc_up{component="stream",pipeline="shop"} 1.0
"""


class Child:
    def collect(self):
        yield from text_string_to_metric_families(CHILD)


def test_merged_page() -> None:
    registry = CollectorRegistry()
    Gauge("pgcdc_up", "Up", ["pipeline", "component"], registry=registry).labels("shop", "run").set(1)
    rows = Counter("pgcdc_snapshot_rows_total", "Rows copied", ["pipeline", "table"], registry=registry)
    rows.labels("shop", "public.t").inc(20)  # cdc run's own snapshot; the child re-based the table: 20 more
    done = Gauge("pgcdc_snapshot_table_done", "Done", ["pipeline", "table"], registry=registry)
    done.labels("shop", "public.t").set(1)
    page = generate_latest(Merged([registry, Child()])).decode()
    families = list(text_string_to_metric_families(page))
    assert len({f.name for f in families}) == len(families) == 3, page
    values = {(s.name, s.labels.get("component")): s.value for f in families for s in f.samples}
    assert values[("pgcdc_snapshot_rows_total", None)] == 40
    assert values[("pgcdc_snapshot_table_done", None)] == 0  # the child's gauge: its re-base is running
    assert values[("pgcdc_up", "run")] == 1 and values[("pgcdc_up", "stream")] == 1
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: scripts/setup.sh installs it (Debian package prometheus)"
    check = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True)
    assert check.returncode == 0 and not check.stdout + check.stderr, check
