"""What `cdc teardown` removes of the captured data, and what it says is left (docs/reference/cli.md).

Everything under state_dir is the pipeline's own (the log, the kafka staging log and its
snapshot segments, checkpoints, the view stage's base and outputs, Spark and verify scratch,
locks) except a follower's data that a sink keeps there (a Delta path or tantivy index under
state_dir): all the rest goes, so no captured row stays behind. A local log outside state_dir
(`log.local.path`) goes too. Kafka topics are deleted only when asked (`--delete-topics`), with
the pipeline's own Kafka security settings; otherwise they are named as left.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from kafka.errors import KafkaError

from cdc.ground.config import Pipeline
from cdc.ground.errors import CdcError, LogError, UsageError
from cdc.ground.log_config import KafkaLog
from sinks.delta.settings import DeltaSettings
from sinks.iceberg.settings import IcebergSettings
from sinks.search.settings import SearchSettings

logger = logging.getLogger(__name__)


def follower_paths(pipeline: Pipeline) -> dict[str, Path]:
    """sink name -> the directory that holds its data on this machine (Delta, Iceberg, tantivy)."""
    out: dict[str, Path] = {}
    for sink in pipeline.sinks:
        settings = sink.settings
        if isinstance(settings, DeltaSettings):
            out[sink.name] = pipeline.path(settings.path).resolve()
        elif isinstance(settings, IcebergSettings):
            # its warehouse, or the SQLite catalog of a warehouse elsewhere
            from sinks.iceberg.catalog import sqlite_file, warehouse

            local = "://" not in settings.warehouse
            if local or settings.catalog.type == "sqlite":
                out[sink.name] = Path(warehouse(settings, pipeline)) if local else sqlite_file(sink, pipeline)
        elif isinstance(settings, SearchSettings) and settings.engine == "tantivy":
            out[sink.name] = (
                pipeline.path(settings.path) if settings.path else pipeline.state_path / "search"
            ).resolve()
    return out


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def remove_captured(pipeline: Pipeline) -> None:
    """Delete the log (and the staging log) and everything of the pipeline's under state_dir,
    keeping followers' directories; say what went."""
    state = pipeline.state_path.resolve()
    log_dir = pipeline.local_log_path.resolve()
    kind = (
        "log"
        if pipeline.log_config.local is not None
        else "staging log (what `cdc stream` publishes to Kafka)"
    )
    if (log_dir / "log.db").exists() or (log_dir / "segments").exists():
        shutil.rmtree(log_dir)
        logger.info(f"deleted the {kind} at {log_dir} (its database and snapshot segment files)")
    if not state.is_dir():
        return
    keep = [p for p in follower_paths(pipeline).values() if _inside(p, state)]
    own = None
    if _inside(Path(pipeline.file).resolve(), state):
        # state_dir also holds the pipeline file (`state_dir: .`): other files of the user's may be
        # there too, so only the entries cdc writes go, and the others are named as left
        own = [p for p in state.iterdir() if p.name in OWN_ENTRIES or p.name.startswith(OWN_PREFIXES)]
    removed = _remove_tree(state, keep, own)
    if removed:
        logger.info(f"deleted under {state}: {', '.join(sorted(removed))}")
    if own is not None:
        others = sorted(p.name for p in state.iterdir() if not any(_inside(p.resolve(), k) for k in keep))
        if others:
            logger.info(
                f"left under {state}, which also holds the pipeline file, what cdc did not write: {', '.join(others)}"
            )
    if not keep and state.is_dir() and not any(state.iterdir()):
        state.rmdir()


# What cdc writes directly under state_dir (README Security "What is stored where"), for a
# state_dir shared with the pipeline file; anything else there is the user's.
OWN_ENTRIES = frozenset(
    {
        "log",
        "staging",
        "checkpoints",
        "views",
        "spark",
        "locks",
        "debezium",
        "chunked",
        "errors",
        "serve",
        "rebase.json",
        "rebase.tmp",
        "ddl.json",
        "search",
    }
)
OWN_PREFIXES = ("verify-", "cdc-code-")


def _remove_tree(directory: Path, keep: list[Path], only: list[Path] | None = None) -> list[str]:
    """Remove every entry of `directory` (or of `only`) except the `keep` directories (and the
    ones holding them)."""
    removed = []
    for entry in sorted(directory.iterdir() if only is None else only):
        path = entry if entry.is_symlink() else entry.resolve()
        if any(_inside(path, k) for k in keep):
            continue  # a follower's own data
        if any(_inside(k, path) for k in keep):
            removed += [f"{entry.name}/{name}" for name in _remove_tree(entry, keep)]
            continue
        is_dir = entry.is_dir() and not entry.is_symlink()
        if is_dir:
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed.append(entry.name + ("/" if is_dir else ""))
    return removed


@dataclass
class Topics:
    """The pipeline's Kafka topics as found before anything was deleted."""

    cfg: KafkaLog
    prefix: str
    servers: str
    names: list[str] | None  # None: they could not be listed (why)
    why: str = ""


def find_topics(pipeline: Pipeline, delete: bool) -> Topics | None:
    """With `log: kafka`, the topics `<prefix>.*` (None for another log). Runs before teardown
    changes anything: with `delete`, a broker it cannot reach or sign in to stops it there (exit
    3 or 4, nothing changed); without, the topics are then named by their prefix only."""
    cfg = pipeline.log_config.kafka
    if cfg is None:
        if delete:
            raise UsageError(
                "--delete-topics: this pipeline has no Kafka log (log: local)", "leave --delete-topics out"
            )
        return None
    prefix = cfg.topic_prefix or pipeline.name
    servers = (
        cfg.bootstrap_servers if isinstance(cfg.bootstrap_servers, str) else ",".join(cfg.bootstrap_servers)
    )
    if cfg.format == "debezium":
        if delete:
            raise UsageError(
                f"--delete-topics: the topics {prefix}.* are Debezium's (log.kafka.format: debezium), not this pipeline's",
                "leave --delete-topics out; delete them with Kafka's own tools if Debezium no longer needs them",
            )
        return Topics(cfg, prefix, servers, None, "they are Debezium's, not this pipeline's")
    from cdc.log.kafka.client import admin, connecting

    try:
        client = admin(cfg)  # the pipeline's own security settings (README Security)
        try:
            with connecting(cfg):
                names = sorted(t for t in client.list_topics() if t.startswith(prefix + "."))
        finally:
            client.close()
    except CdcError as exc:
        if delete:
            raise
        return Topics(cfg, prefix, servers, None, f"they could not be listed: {exc.problem}")
    return Topics(cfg, prefix, servers, names)


def finish_topics(topics: Topics | None, delete: bool) -> None:
    """Delete the topics found (`delete`), or say they are left, with their names and broker."""
    if topics is None:
        return
    if topics.names is None:
        logger.info(f"left the Kafka topics {topics.prefix}.* at {topics.servers} ({topics.why})")
        return
    if not topics.names:
        logger.info(f"no topics {topics.prefix}.* in Kafka at {topics.servers}")
        return
    listed = ", ".join(topics.names)
    if not delete:
        logger.info(
            f"left {len(topics.names)} Kafka topic(s) at {topics.servers}, holding the captured rows: {listed} "
            "(delete them with `cdc teardown --delete-topics`)"
        )
        return
    from cdc.log.kafka.client import admin

    client = admin(topics.cfg)
    try:
        client.delete_topics(topics.names, timeout_ms=30_000)
    except KafkaError as exc:
        raise LogError(
            f"Kafka refused to delete the topics {listed}: {type(exc).__name__}: {exc}",
            f"grant this pipeline's Kafka user DELETE on the topics {topics.prefix}.* (or have an admin delete "
            "them), then run `cdc teardown --delete-topics` again",
        ) from None
    finally:
        client.close()
    logger.info(f"deleted {len(topics.names)} Kafka topic(s) at {topics.servers}: {listed}")


def left_in_place(pipeline: Pipeline) -> str:
    """The followers' data teardown never touches, and where it is."""
    local = follower_paths(pipeline)
    parts = []
    for sink in pipeline.sinks:
        if sink.name in local:
            parts.append(f"{sink.name} at {local[sink.name]}")
        else:
            parts.append(f"{sink.name} ({sink.kind}, in its own server)")
    return "followers' data was left in place: " + ("; ".join(parts) if parts else "none configured")
