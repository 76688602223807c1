"""`cdc verify`'s report: a follower's verdict (SinkVerdict, its tables' TableVerdicts) and the
lines printed for it, each difference with the command that brings or repairs it.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass, field

from cdc.ground.config import Pipeline
from cdc.ground.lsn import format_lsn
from pipelines.verify_compare import TableVerdict

logger = logging.getLogger(__name__)


@dataclass
class SinkVerdict:
    sink: str
    follower_lsn: int = 0
    tables: list[TableVerdict] = field(default_factory=list)
    behind: str | None = None
    error: str | None = None
    dropped: list[str] = field(default_factory=list)  # tables gone from the source: reported, not compared

    @property
    def identical(self) -> bool:
        return self.error is None and self.behind is None and all(t.identical for t in self.tables)


def _print(verdicts: list[SinkVerdict], pipeline: Pipeline | None = None) -> None:
    for v in verdicts:
        if v.error:
            logger.info(f"sink {v.sink}: ERROR {v.error}")
            continue
        for line in v.dropped:
            logger.info(f"sink {v.sink}: {line}")
        if v.behind:
            logger.info(
                f"sink {v.sink}: NOT VERIFIED, follower at {format_lsn(v.follower_lsn)} is behind: {v.behind}"
            )
            continue
        for t in v.tables:
            mark = "identical" if t.identical else "DIFFERENT"
            extra = (
                f" ({t.excused} row(s) inserted or deleted after the verification point, counted in)"
                if t.excused and t.keyless
                else f" ({t.excused} key(s) changed after the verification point, excused)"
                if t.excused
                else ""
            )
            logger.info(
                f"sink {v.sink}: {t.table}: {mark}: source {t.source_rows:,} rows, follower {t.follower_rows:,}{extra}"
            )
            if t.not_compared:
                logger.info(
                    f"    not compared: generated column(s) {', '.join(t.not_compared)}: PostgreSQL does not publish them "
                    "(before 18; on 18 the publication keeps publish_generated_columns = none), so followers do not have them"
                )
            if t.missing_columns:
                tables = shlex.quote(t.table)
                snap = (
                    pipeline.command("snapshot", "--tables", tables)
                    if pipeline
                    else f"cdc snapshot PIPELINE --tables {tables}"
                )
                logger.info(
                    f"    column(s) the follower does not have: {', '.join(t.missing_columns)} (added in the source; the log "
                    f"learns of a new column with the table's next change; `{snap}` brings it at once, then "
                    f"`{pipeline.command('apply', '--once', '--sink', v.sink) if pipeline else 'cdc apply PIPELINE --once'}`)"
                )
            apply_cmd = (
                pipeline.command("apply", "--once", "--sink", v.sink)
                if pipeline
                else "cdc apply PIPELINE --once"
            )
            if t.pending_columns:
                logger.info(
                    f"    column(s) the follower does not have: "
                    f"{', '.join(f'{n} (added in the source, in the log at {format_lsn(lsn)}, not applied yet)' for n, lsn in t.pending_columns)}; "
                    f"not compared until then. `{apply_cmd}` brings it (or wait for `cdc run`); no rebuild is needed"
                )
            if t.pending_renames:
                logger.info(
                    f"    column(s) the follower has under their old name: "
                    f"{', '.join(f'{o} (renamed in the source: {o} -> {n}, in the log at {format_lsn(lsn)}, not applied yet)' for o, n, lsn in t.pending_renames)}; "
                    f"their values were compared under the old name. `{apply_cmd}` brings the rename "
                    "(or wait for `cdc run`); no rebuild is needed"
                )
            if t.renamed_columns:
                logger.info(
                    f"    column(s) the follower has under their old name: "
                    f"{', '.join(f'{o} (now {n})' for o, n in t.renamed_columns)}; their values were compared "
                    "under the old name. The column was renamed in the source after the table's last change "
                    "the log has: the table's next change (at once with `cdc ddl install`, which brings a "
                    f"DDL to the log at its commit) brings the rename to the log, and `"
                    f"{pipeline.command('apply', '--once', '--sink', v.sink) if pipeline else 'cdc apply PIPELINE --once'}`"
                    " to the follower; no rebuild is needed"
                )
            if not t.identical and (t.missing or t.extra or t.different):
                logger.info(
                    f"    missing {t.missing:,}, extra {t.extra:,}, different {t.different:,}; first keys:"
                )
                for s in t.samples:
                    logger.info(f"      {s}")
                if pipeline is not None:  # rows lost or changed behind the tool's back (README Operations)
                    logger.info(
                        f"  fix: if the follower lost or changed rows itself, rebuild it: "
                        f"`{pipeline.command('reset', '--sink', v.sink, '--rebuild', '--yes')}`, "
                        f"then `{pipeline.command('apply', '--once', '--sink', v.sink)}`"
                    )
    ok = all(v.identical for v in verdicts)
    logger.info("verify: all followers identical to the source" if ok else "verify: differences found")
