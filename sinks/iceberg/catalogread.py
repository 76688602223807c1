"""A follower's Iceberg tables read without Spark or a JVM, with pyiceberg: whether a table is in
the catalog, its marker (the table property `cdc.follower`) and the follower's position (the
newest snapshot of its app id with a cut among the current snapshot's ancestors, position.py).
`cdc status`'s self-check of the follower (pipelines/selfcheck.py, docs/follower-iceberg.md).

The catalog is opened read-only in effect: a SQLite catalog file that is not there is not made
(every table is then gone), and pyiceberg is told not to make the catalog's own tables. A REST
catalog is read through pyiceberg's RestCatalog with the sink's `uri` and `properties`. A JDBC
catalog on a database pyiceberg cannot open, or a catalog that does not answer, raises a
SinkError that says the follower is checked by `cdc apply` only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cdc.ground.errors import SinkError
from cdc.ground.secrets import redact
from sinks.iceberg.catalog import pyiceberg_properties, sqlite_file
from sinks.iceberg.position import CUT, follower_snapshot
from sinks.iceberg.settings import iceberg_settings

if TYPE_CHECKING:
    from cdc.ground.config import Pipeline, SinkConfig

ONLY_APPLY = "the follower is checked by `cdc apply` (Spark) only"


class CatalogReader:
    """The sink's catalog opened with pyiceberg on first use; `close()` releases its connections."""

    def __init__(self, config: SinkConfig, pipeline: Pipeline):
        self.config = config
        self.pipeline = pipeline
        self._catalog: Any = None

    def _open(self) -> Any | None:
        """The pyiceberg catalog; None: a SQLite catalog whose file is gone (no table is there)."""
        if self._catalog is not None:
            return self._catalog
        cat = iceberg_settings(self.config).catalog
        if cat.type == "sqlite" and not sqlite_file(self.config, self.pipeline).is_file():
            return None  # opening it would make an empty one
        try:
            props = pyiceberg_properties(self.config, self.pipeline)
        except ValueError as exc:  # a JDBC catalog on a database pyiceberg does not read
            raise SinkError(f"sink {self.config.name}: {exc}", ONLY_APPLY) from None
        from pyiceberg.catalog import load_catalog

        try:
            own_tables = {"init_catalog_tables": "false"} if props["type"] == "sql" else {}
            self._catalog = load_catalog(self.config.name, **props, **own_tables)
        except Exception as exc:
            raise self._unread(exc) from None
        return self._catalog

    def _unread(self, exc: Exception) -> SinkError:
        """The database is down, refuses the user, ...: said, not taken for a loss."""
        first = (str(exc).strip().splitlines() or [""])[0]  # SQLAlchemy adds lines of background
        return SinkError(
            redact(
                f"sink {self.config.name}: pyiceberg could not read the catalog: {type(exc).__name__}: {first}"
            ),
            ONLY_APPLY,
        )

    def load(self, namespace: str, name: str) -> Any | None:
        """The pyiceberg Table; None: not in the catalog."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        catalog = self._open()
        if catalog is None:
            return None
        try:
            return catalog.load_table((namespace, name))
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        except Exception as exc:  # connections are made on first use: a database down shows here
            raise self._unread(exc) from None

    def close(self) -> None:
        if self._catalog is not None:
            self._catalog.close()  # SqlCatalog: its connection pool
            self._catalog = None


def applied_cut(table: Any, app_id: str) -> int | None:
    """The newest cut `app_id` committed to the table's current state (None: none), as
    commit.py applied_cut reads it through Spark."""
    metadata = table.metadata
    by_id = {s.snapshot_id: s for s in metadata.snapshots}

    def summary(snapshot: Any) -> Mapping[str, Any]:
        return {} if snapshot.summary is None else dict(snapshot.summary.additional_properties)

    def lookup(snapshot_id: int) -> tuple[int | None, Mapping[str, Any]] | None:
        snapshot = by_id.get(snapshot_id)
        return None if snapshot is None else (snapshot.parent_snapshot_id, summary(snapshot))

    def kept_newest_first() -> Iterator[tuple[int, Mapping[str, Any]]]:
        for snapshot in reversed(metadata.snapshots):  # commit order, as the Java API lists them
            yield snapshot.snapshot_id, summary(snapshot)

    found = follower_snapshot(metadata.current_snapshot_id, lookup, kept_newest_first, app_id)
    return None if found is None else int(found[1][CUT])
