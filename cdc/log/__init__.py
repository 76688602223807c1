"""Log backends (DESIGN.md §6). `open_log` picks the one the pipeline file names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipelines.errors import UsageError

if TYPE_CHECKING:
    from cdc.log.local import LocalLog
    from pipelines.config import Pipeline


def open_log(pipeline: Pipeline, *, readonly: bool = False) -> LocalLog:
    config = pipeline.log_config
    if config.local is not None:
        from cdc.log.local import LocalLog

        return LocalLog(pipeline.local_log_path, config.local.synchronous, readonly=readonly)
    raise UsageError("the kafka log backend is not available yet", "use `log: {local: {}}`")
