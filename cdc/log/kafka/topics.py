"""Kafka topic names and settings for the `kafka` log backend.

Table topics are `<prefix>.<schema>.<table>` (Debezium's layout). Characters Kafka does not
allow in topic names ([a-zA-Z0-9._-] only), and dots inside a name, are written `_xHH_`
(UTF-8 bytes), so every table has exactly one topic. Table topics are compacted:

  cleanup.policy=compact        the newest record per key survives (deletes: a tombstone)
  min.compaction.lag.ms=1h      records younger than this are never compacted away
  delete.retention.ms=7d        tombstones stay this long: a follower that stops for longer
                                must bootstrap the table again (it is told so)

`<prefix>._cdc_cuts` holds the latest cut (single key) and `<prefix>._cdc_schemas` every
table schema version (key `<table>/<version>`); both compacted.
"""

from __future__ import annotations

import hashlib
import re

from cdc.ground.tables import TableName

TABLE_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": str(3_600_000),
    "delete.retention.ms": str(7 * 86_400_000),
}
META_TOPIC_CONFIG = {"cleanup.policy": "compact"}
_ALLOWED = re.compile(r"[A-Za-z0-9_-]")
MAX_TOPIC = 249


def _part(name: str) -> str:
    return "".join(c if _ALLOWED.fullmatch(c) else "".join(f"_x{b:02x}_" for b in c.encode()) for c in name)


def table_topic(prefix: str, table: TableName) -> str:
    topic = f"{prefix}.{_part(table.schema)}.{_part(table.name)}"
    if len(topic) > MAX_TOPIC:  # keep it unique and legal
        digest = hashlib.sha1(topic.encode()).hexdigest()[:12]
        topic = topic[: MAX_TOPIC - 13] + "-" + digest
    return topic


def cuts_topic(prefix: str) -> str:
    return f"{prefix}._cdc_cuts"


def schemas_topic(prefix: str) -> str:
    return f"{prefix}._cdc_schemas"
