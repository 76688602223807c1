"""docs/reference/metrics.md: every series `--metrics-port` (and `cdc serve`'s /metrics) can show.

Two sources, both read from the code: the collectors registered on the project's Prometheus
registry (cdc/metrics.py, pipelines/serve/metrics.py), and the gauges `StateCollector` builds at
scrape time from the source, the log and the checkpoints (pipelines/metrics.py), read from its
`_gauge(name, doc, labels)` calls because collecting them needs a live source."""

from __future__ import annotations

import ast
import inspect

from pipelines.docgen.common import header


def _registered() -> list[tuple[str, str, str, list[str]]]:
    import pipelines.serve.metrics  # noqa: F401  (registers cdc serve's series)
    from cdc.metrics import REGISTRY

    rows = []
    # the registry keeps its collectors in a private mapping; its public collect() omits the
    # label names of a series nobody has set yet
    for collector in list(REGISTRY._collector_to_names):
        labels = list(getattr(collector, "_labelnames", ()))
        describe = getattr(collector, "describe", collector.collect)  # describe(): no scrape needed
        for family in describe():
            labels = labels or list(getattr(family, "_labelnames", ()))
            rows.append((family.name, family.type, family.documentation, labels))
    return rows


def _scrape_time() -> list[tuple[str, str, str, list[str]]]:
    from pipelines import metrics

    tree = ast.parse(inspect.getsource(metrics.StateCollector))
    rows = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_gauge" and len(node.args) == 3:
            name, doc, labels = (ast.literal_eval(a) for a in node.args)
            rows.append((name, "gauge", doc, list(labels)))
    return rows


def _table(rows: list[tuple[str, str, str, list[str]]]) -> list[str]:
    out = ["| series | type | labels | meaning |", "|---|---|---|---|"]
    for name, kind, doc, labels in sorted(rows):
        shown = f"`{name}_total`" if kind == "counter" and not name.endswith("_total") else f"`{name}`"
        if kind == "histogram":
            shown += " (`_bucket`, `_sum`, `_count`)"
        label_text = ", ".join(f"`{label}`" for label in labels)
        out.append(f"| {shown} | {kind} | {label_text} | {doc.replace('|', '/')} |")
    return out


def metrics_page() -> str:
    out = [
        header(
            "the Prometheus registry of cdc/metrics.py and the scrape-time gauges of pipelines/metrics.py"
        ).rstrip("\n"),
        "",
        "# Metrics reference",
        "",
        "`cdc snapshot`, `stream`, `apply` and `run` serve these at `http://127.0.0.1:PORT/metrics` with",
        "`--metrics-port PORT` (or `metrics.port` in the pipeline file); `cdc serve` serves its own and the",
        "process series at its `/metrics`. How to use them, the alert rules and the Grafana board:",
        "[Monitoring](../monitoring.md).",
        "",
        "## Recorded by the process",
        "",
        *_table(_registered()),
        "",
        "## Read from the source, the log and the checkpoints at each scrape",
        "",
        *_table(_scrape_time()),
    ]
    return "\n".join(out).rstrip("\n") + "\n"
