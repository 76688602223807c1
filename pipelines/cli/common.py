"""What the verbs share: the PIPELINE argument, the --log-format and --metrics-port options, and
loading the pipeline file (with the state_dir checked and upgraded)."""

from __future__ import annotations

from pathlib import Path

import click

from cdc.ground import logsetup

PIPELINE = click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
# docs/monitoring.md: JSON lines for log shippers, and the Prometheus endpoint
LOG_FORMAT = click.option(
    "--log-format",
    type=click.Choice(logsetup.FORMATS, case_sensitive=False),
    envvar="CDC_LOG_FORMAT",
    expose_value=False,
    is_eager=True,
    callback=lambda _ctx, _param, value: logsetup.configure(value),
    help="text (default) or json: one JSON object per line (time, level, pipeline, event, fields); env CDC_LOG_FORMAT",
)
METRICS_PORT = click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="serve Prometheus metrics at http://127.0.0.1:PORT/metrics (default: metrics.port of the pipeline file, else off)",
)


def load(path: Path, check_state_dir: bool = True, upgrade: bool = True):
    from sinks.registry import load_pipeline

    pipeline = load_pipeline(path)
    logsetup.set_pipeline(pipeline.name)
    if check_state_dir:  # every verb stops here (exit 2) rather than failing later with an OSError
        pipeline.check_state_dir()
        if upgrade:  # docs/upgrades.md: an older state is stamped in place, a newer one refused (exit 5)
            from pipelines.upgrade import upgrade_state

            with logsetup.to_stderr():  # notes beside the verb's own answer
                upgrade_state(pipeline)
    return pipeline
