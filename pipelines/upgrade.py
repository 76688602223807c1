"""Bringing a pipeline's state_dir to this release's formats, and back (docs/upgrades.md).

Runs at the start of every verb that reads the state (pipelines/cli/common.py `load`) and as
`cdc upgrade`. State records cdc 0.1.0 wrote carry no `format` key (state format 0); format 1 is
the same record with the key, so the migration stamps them in place: idempotent (a stamped record
is left alone), atomic per file (write_record). A record from a newer cdc stops everything with
FormatTooNew (exit 5) before anything is written. `--rollback` takes the stamps out again, for
going back to 0.1.0, which refuses records with keys it does not know.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

from cdc.ground.config import Pipeline
from cdc.ground.errors import UsageError
from cdc.ground.formats import FORMATS, LOCAL_LOG, RELEASES, STATE, VERSION, check_version
from cdc.ground.private import private_open
from pipelines.checkpoints import STATE_KEY, WRITER_KEY, checkpoint_dir, write_record
from pipelines.views.state import views_dir

logger = logging.getLogger(__name__)

ROLLBACK_TO = "0.1.0"  # the one older release whose formats `cdc upgrade --rollback` writes


def state_records(state_path: Path) -> Iterator[tuple[Path, dict]]:
    """Every versioned JSON record under state_dir (follower checkpoints, view-stage states)."""
    for directory in (checkpoint_dir(state_path), views_dir(state_path)):
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # its own loader says what is wrong with it, with the fix
            if isinstance(data, dict):
                yield path, data


def upgrade_state(pipeline: Pipeline) -> int:
    """Stamp 0.1.0's records with state format 1; FormatTooNew if any is newer. Returns how many
    were migrated (0: nothing to do, nothing said)."""
    records = list(state_records(pipeline.state_path))
    for path, data in records:  # check all first: a newer record anywhere changes nothing
        check_version(STATE, data.get(STATE_KEY), f"state file {path}", data.get(WRITER_KEY))
    old = [(path, data) for path, data in records if data.get(STATE_KEY) is None]
    for path, data in old:
        write_record(path.parent, path, data)
    if old:
        logger.info(
            f"upgraded {len(old)} state file(s) under {pipeline.state_path} from state format 0 (cdc {ROLLBACK_TO}) "
            f"to {STATE.version} (cdc {VERSION}), in place; `cdc upgrade --rollback` undoes it"
        )
    return len(old)


def rollback_state(pipeline: Pipeline) -> int:
    """Take the stamps out, so cdc 0.1.0 reads the records again; refuses when anything is in a
    format 0.1.0 cannot read."""
    target = RELEASES[ROLLBACK_TO]
    records = list(state_records(pipeline.state_path))
    for path, data in records:
        check_version(STATE, data.get(STATE_KEY), f"state file {path}", data.get(WRITER_KEY))
    log_format = _local_log_format(pipeline)
    if log_format is not None and log_format > target[LOCAL_LOG.name]:
        raise UsageError(
            f"the log at {pipeline.local_log_path} is in local_log format {log_format}; cdc {ROLLBACK_TO} reads "
            f"{target[LOCAL_LOG.name]}",
            "keep this release, or start the pipeline over under the older one (`cdc teardown`, `cdc snapshot`)",
        )
    stamped = [(path, data) for path, data in records if STATE_KEY in data or WRITER_KEY in data]
    for path, data in stamped:
        plain = {k: v for k, v in data.items() if k not in (STATE_KEY, WRITER_KEY)}
        _write_plain(path, plain)
    logger.info(
        f"rolled back {len(stamped)} state file(s) under {pipeline.state_path} to state format 0: cdc {ROLLBACK_TO} "
        "reads this state_dir now (its log, markers and Kafka records need no change)"
    )
    return len(stamped)


def _write_plain(path: Path, data: dict) -> None:
    """write_record without the stamp (the format cdc 0.1.0 wrote), atomically."""
    import os

    tmp = path.with_suffix(".tmp")
    with private_open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _local_log_format(pipeline: Pipeline) -> int | None:
    import sqlite3

    db = pipeline.local_log_path / "log.db"
    if not db.exists():
        return None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT v FROM meta WHERE k = 'format'").fetchone()
    except sqlite3.OperationalError:
        return None
    finally:
        conn.close()
    return check_version(LOCAL_LOG, row[0] if row else None, f"the log at {pipeline.local_log_path}")


def describe(pipeline: Pipeline) -> None:
    """What `cdc upgrade` found, format by format (after upgrading)."""
    logger.info(f"cdc {VERSION} writes " + ", ".join(f"{f.name} {f.version}" for f in FORMATS))
    versions = sorted({data.get(STATE_KEY, 0) for _, data in state_records(pipeline.state_path)})
    logger.info(
        f"state under {pipeline.state_path}: format {', '.join(map(str, versions)) if versions else '- (no records yet)'}"
    )
    log_format = _local_log_format(pipeline)
    where = "staging log" if pipeline.log_config.local is None else "log"
    logger.info(
        f"{where} at {pipeline.local_log_path}: "
        + (f"format {log_format}" if log_format is not None else "none yet")
    )
