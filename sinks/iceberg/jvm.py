"""Iceberg's Java API through the Spark session's catalog, for what needs no Spark job: a table's
current snapshot and its summary, the snapshot list, maintenance actions (SparkActions)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _jvm(spark: SparkSession) -> Any:
    return cast(Any, spark.sparkContext._jvm)


def activate(spark: SparkSession) -> None:
    """Make `spark` this thread's active session in the JVM: Spark looks a catalog's settings up in
    the active session's conf (SQLConf.get), which outside a query may be another session's."""
    _jvm(spark).org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def spark_catalog(spark: SparkSession, catalog: str) -> Any:
    """The session's SparkCatalog plugin named `catalog` (registered by sinks/iceberg/catalog.py)."""
    activate(spark)
    return spark._jsparkSession.sessionState().catalogManager().catalog(catalog)


def table(spark: SparkSession, catalog: str, namespace: str, name: str) -> Any | None:
    """The org.apache.iceberg.Table, refreshed (a cached one may be stale); None: no such table."""
    jvm = _jvm(spark)
    plugin = spark_catalog(spark, catalog)
    ns = cast(Any, spark.sparkContext._gateway).new_array(jvm.java.lang.String, 1)
    ns[0] = namespace
    ident = jvm.org.apache.spark.sql.connector.catalog.Identifier.of(ns, name)
    if not plugin.tableExists(ident):
        return None
    loaded = plugin.loadTable(ident).table()
    loaded.refresh()
    return loaded


def tables(spark: SparkSession, catalog: str) -> list[tuple[str, str]]:
    """(namespace, table) of every table in the catalog (one namespace level, as the sink makes)."""
    plugin = spark_catalog(spark, catalog)
    found = []
    for ns in plugin.listNamespaces():
        for ident in plugin.listTables(ns):
            found.append((".".join(str(part) for part in ns), str(ident.name())))
    return sorted(found)


def summary(snapshot: Any) -> dict[str, str]:
    """A snapshot's summary as a dict."""
    return {str(k): str(v) for k, v in dict(snapshot.summary()).items()}


def actions(spark: SparkSession) -> Any:
    """org.apache.iceberg.spark.actions.SparkActions for this session."""
    activate(spark)
    return _jvm(spark).org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession)
