"""The Iceberg catalog of a sink, for Spark and for pyiceberg.

Spark: a catalog plugin named after the sink (`SELECT * FROM lake.public.t` for a sink `lake`),
set as runtime SQL confs of the session the sink writes with, so a session that never meets an
Iceberg sink carries no Iceberg conf (the jars are only on the class path). Catalog types:

* sqlite (default, no server): Iceberg's JDBC catalog in the SQLite file `<warehouse>/catalog.db`
  (`<state_dir>/<sink>-catalog.db` when the warehouse is a URI). Its tables (`iceberg_tables`,
  `iceberg_namespace_properties`, schema V1) are the ones pyiceberg's SqlCatalog reads.
* jdbc: the same catalog on a database given by `uri` (PostgreSQL: jdbc:postgresql://host/db).
* rest: an Iceberg REST catalog at `uri`.
`properties` pass through as they are (object stores: io-impl, s3.*).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from sinks.iceberg.settings import IcebergSettings, iceberg_settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc.ground.config import Pipeline, SinkConfig

JDBC_CATALOG = "org.apache.iceberg.jdbc.JdbcCatalog"


def warehouse(settings: IcebergSettings, pipeline: Pipeline) -> str:
    """The warehouse as Iceberg takes it: a URI as given, a path made absolute (relative to the pipeline file)."""
    if "://" in settings.warehouse:
        return settings.warehouse
    return str(pipeline.path(settings.warehouse).resolve())


def sqlite_file(config: SinkConfig, pipeline: Pipeline) -> Path:
    settings = iceberg_settings(config)
    if "://" in settings.warehouse:
        return pipeline.state_path.resolve() / f"{config.name}-catalog.db"
    return Path(warehouse(settings, pipeline)) / "catalog.db"


def catalog_properties(config: SinkConfig, pipeline: Pipeline) -> dict[str, str]:
    """Iceberg catalog properties (the same keys Spark takes after `spark.sql.catalog.<name>.`)."""
    settings = iceberg_settings(config)
    cat = settings.catalog
    props = {"warehouse": warehouse(settings, pipeline)}
    if cat.type == "rest":
        props |= {"type": "rest", "uri": cat.uri or ""}
    else:
        uri = f"jdbc:sqlite:{sqlite_file(config, pipeline)}" if cat.type == "sqlite" else cat.uri or ""
        # V1: the catalog table has iceberg_type (tables and views), as pyiceberg's SqlCatalog makes it
        props |= {"catalog-impl": JDBC_CATALOG, "uri": uri, "jdbc.schema-version": "V1"}
        if cat.user:
            props["jdbc.user"] = cat.user
        if cat.password:
            props["jdbc.password"] = cat.password
    return props | cat.properties


SPARK_CATALOG = "org.apache.iceberg.spark.SparkCatalog"


def register(spark: SparkSession, config: SinkConfig, pipeline: Pipeline) -> str:
    """Make the sink's catalog known to this session; returns its name (the sink's: it is also the
    catalog name Iceberg's JDBC catalog stores with every table, which pyiceberg must be given)."""
    name = config.name
    if iceberg_settings(config).catalog.type == "sqlite":
        sqlite_file(config, pipeline).parent.mkdir(parents=True, exist_ok=True)
    key = f"spark.sql.catalog.{name}"
    wanted = {f"{key}.{prop}": value for prop, value in catalog_properties(config, pipeline).items()}
    had = {k: v for k, v in spark.conf.getAll.items() if k.startswith(f"{key}.")}
    if spark.conf.get(key, None) == SPARK_CATALOG and had == wanted:
        return name
    loaded = spark.conf.get(key, None) is not None
    for stale in had.keys() - wanted.keys():
        spark.conf.unset(stale)
    for prop, value in wanted.items():
        spark.conf.set(prop, value)
    spark.conf.set(key, SPARK_CATALOG)  # last: the plugin loads with all its properties
    if loaded:
        # the session knew this name with other settings (another pipeline file in this process, a
        # test session): Spark keeps a loaded catalog, so its catalogs are loaded again on next use
        spark._jsparkSession.sessionState().catalogManager().reset()
    return name


def pyiceberg_properties(config: SinkConfig, pipeline: Pipeline) -> dict[str, str]:
    """Properties of pyiceberg's `load_catalog(<sink name>, **props)` for the same catalog: sqlite
    (SqlCatalog on the file), jdbc on PostgreSQL (SqlCatalog through psycopg2) and rest (RestCatalog,
    `properties` passed as they are). Raises ValueError for a JDBC database pyiceberg cannot open."""
    settings = iceberg_settings(config)
    cat = settings.catalog
    where = warehouse(settings, pipeline)
    location = where if "://" in where else f"file://{where}"
    if cat.type == "rest":
        return {"type": "rest", "uri": cat.uri or "", "warehouse": location} | cat.properties
    if cat.type == "sqlite":
        uri = f"sqlite:///{sqlite_file(config, pipeline)}"
    else:
        jdbc = cat.uri or ""
        if not jdbc.startswith("jdbc:postgresql://"):
            raise ValueError(
                f"catalog uri {jdbc}: pyiceberg reads JDBC catalogs on PostgreSQL and SQLite only"
            )
        auth = ""
        if cat.user:
            auth = (
                quote(cat.user, safe="") + (f":{quote(cat.password, safe='')}" if cat.password else "") + "@"
            )
        uri = "postgresql+psycopg2://" + auth + jdbc.removeprefix("jdbc:postgresql://")
    return {"type": "sql", "uri": uri, "warehouse": location} | cat.properties


def pyiceberg_catalog(config: SinkConfig, pipeline: Pipeline):
    """The sink's catalog opened with pyiceberg, under the sink's name (the catalog name Iceberg's
    JDBC catalog stored with every table)."""
    from pyiceberg.catalog import load_catalog

    return load_catalog(config.name, **pyiceberg_properties(config, pipeline))
