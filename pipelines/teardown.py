"""`cdc teardown`: remove what the pipeline created (followers' data is never touched)."""

from __future__ import annotations

import shutil
from collections.abc import Callable

from psycopg2 import sql

from cdc.source import _slot, connect
from pipelines.config import Pipeline
from pipelines.errors import SourceError


def run_teardown(pipeline: Pipeline, drop_slot: bool, say: Callable[[str], None]) -> None:
    if drop_slot:
        conn = connect(pipeline.source.postgres.dsn, application_name="cdc teardown")
        try:
            slot = _slot(conn, pipeline.slot)
            with conn.cursor() as cur:
                if slot is not None:
                    if slot[2] is not None:
                        raise SourceError(
                            f"replication slot {pipeline.slot} is in use by process {slot[2]}",
                            "stop `cdc stream`/`cdc run` for this pipeline first",
                        )
                    cur.execute("SELECT pg_drop_replication_slot(%s)", (pipeline.slot,))
                    say(f"dropped replication slot {pipeline.slot}")
                cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (pipeline.publication,))
                if cur.fetchone():
                    cur.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(pipeline.publication)))
                    say(f"dropped publication {pipeline.publication}")
        finally:
            conn.close()
    if pipeline.log_config.local is not None:
        log_dir = pipeline.local_log_path
        if (log_dir / "log.db").exists():
            shutil.rmtree(log_dir)
            say(f"deleted the log at {log_dir}")
    checkpoints = pipeline.state_path / "checkpoints"
    if checkpoints.exists():
        shutil.rmtree(checkpoints)
        say(f"deleted follower checkpoints at {checkpoints}")
    if not drop_slot:
        say(
            f"kept replication slot {pipeline.slot} and publication {pipeline.publication} on the source: the slot "
            "holds back WAL until it is dropped (`cdc teardown --drop-slot`)"
        )
    say("followers' data (Delta tables, indexes, caches) was left in place")
