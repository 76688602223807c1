"""The release version and the version of every format cdc keeps on disk (docs/upgrades.md).

One place for both: setup.cfg reads VERSION from here, `cdc --version` prints it with FORMATS,
and each writer stamps its format's number next to what it writes. A reader that finds a number
above its own refuses (FormatTooNew, exit 5) rather than misreading data a newer cdc wrote;
a lower one is migrated forward in place (pipelines/upgrade.py) or read as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc.ground.errors import CdcError, ExitCode

VERSION = "0.2.0"

# The format a stamp-less record is taken to be: everything cdc 0.1.0 wrote.
UNVERSIONED = 0


@dataclass(frozen=True)
class Format:
    name: str
    version: int  # the version this cdc writes and the highest it reads
    what: str


STATE = Format("state", 1, "state_dir JSON records: follower checkpoints, view-stage state (key `format`)")
LOCAL_LOG = Format(
    "local_log", 1, "the local log and the kafka staging log: log.db meta `format`, segment files"
)
KAFKA = Format("kafka", 1, "Kafka topics: records, `_cdc_schemas`, `_cdc_cuts` cut records (key `format`)")
MARKER = Format(
    "marker", 1, "follower markers in the engines (Delta `cdc.follower`, Redis, tantivy, OpenSearch)"
)
DELTA_CUTS = Format(
    "delta_cuts", 1, "the Delta sink's `_cdc_cuts` table: columns `format`, `cdc_version` of each row"
)
FORMATS = (STATE, LOCAL_LOG, KAFKA, MARKER, DELTA_CUTS)

# The formats each release wrote (docs/upgrades.md shows the same table).
# 0.1.0 stamped only the local log; its other formats are 0, the same layouts without the stamp.
RELEASES = {
    "0.1.0": {"state": 0, "local_log": 1, "kafka": 0, "marker": 0, "delta_cuts": 0},
    VERSION: {f.name: f.version for f in FORMATS},
}


class FormatTooNew(CdcError):
    """Data written by a newer cdc, in a format this one cannot read: exit 5."""

    exit_code = ExitCode.FORMAT


def version_line() -> str:
    formats = ", ".join(f"{f.name} {f.version}" for f in FORMATS)
    return f"cdc {VERSION} (formats: {formats})"


def check_version(fmt: Format, found: int | str | None, where: str, writer: str | None = None) -> int:
    """The format number `found` at `where` as an int (None: UNVERSIONED); FormatTooNew when it is
    above what this cdc reads. `writer`: the cdc release that wrote it, when recorded."""
    try:
        number = UNVERSIONED if found is None else int(found)
    except (TypeError, ValueError):
        number = fmt.version + 1  # not a number we wrote: treat as unknown, i.e. newer
    if number > fmt.version:
        by = f"cdc {writer}" if writer else "a newer cdc"
        raise FormatTooNew(
            f"{where} is in {fmt.name} format {found}, written by {by}; this cdc {VERSION} reads "
            f"{fmt.name} format {fmt.version} and older",
            f"run {'cdc ' + writer + ' or newer' if writer else 'the newer cdc that wrote it'} "
            "(`cdc --version` shows the formats a release reads), or start this pipeline over with "
            "`cdc teardown` and `cdc snapshot` (docs/upgrades.md)",
        )
    return number
