"""A running `cdc run` / continuous `cdc apply` follows the tables the pipeline file names now:
a table added to `source.postgres.tables` and snapshotted beside it with
`cdc snapshot --tables` is applied from the next round, with no restart. (The stream child
captures such a table already: the snapshot registers it in the log before it joins the
publication, cdc/stream/relations.py.) Other changes of the file need a restart; that is said once per change.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from cdc.ground.errors import CdcError
from sinks.registry import load_pipeline

logger = logging.getLogger(__name__)


def _stamp(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def follow_file_tables(job: Any) -> None:
    """Take `job.pipeline`'s source tables (and their table_options) from the file when it changed
    since the last round; `job` is the apply job (pipeline)."""
    stamp = _stamp(job.pipeline.file)
    seen = getattr(job, "_file_stamp", None)
    job._file_stamp = stamp
    if seen is None or stamp is None or stamp == seen:
        return  # the first round, or no change: the pipeline as loaded
    try:
        new = load_pipeline(job.pipeline.file)
    except CdcError as exc:
        logger.warning(f"the pipeline file changed but cannot be read ({exc.problem}); going on as before")
        return
    old = job.pipeline
    rest = new.model_copy(update={"source": old.source, "file": old.file, "base_dir": old.base_dir})
    if rest != old:
        logger.warning("the pipeline file changed (sinks, views or settings): restart to use those changes")
    if new.source == old.source:
        return
    postgres = old.source.postgres
    kept = new.source.postgres.model_copy(
        update={"tables": postgres.tables, "table_options": postgres.table_options}
    )
    if kept != postgres:
        logger.warning("the pipeline file's source changed beyond its tables: restart to use it")
        return
    job.pipeline = old.model_copy(update={"source": new.source})
    logger.info(f"pipeline file: following tables {', '.join(new.source.postgres.tables)} from now on")
