"""The base state of the derived views: an internal Delta follower (`_views`) of every table the
views read, at `<state_dir>/views/base/<schema>/<table>`.

It is applied by the apply job's own machinery (`ApplyJob._run_sink` with a synthetic delta sink:
its own checkpoint `checkpoints/_views.json`, pending/applied cuts, idempotent MERGEs, markers, and
`_cdc_cuts` recording every base table's Delta version per cut), so the view stage reads each base
table exactly as of a cut with Delta time travel. Its tables have Change Data Feed on, so the keys
a cut changed are read from the feed at a cost that grows with the changes. The disk cost is one
more copy of each table the views read (plus the feed's change files until `cdc maintain` vacuums).
It is no user sink: `cdc status` and `cdc verify` list only the pipeline file's sinks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyspark.sql import SparkSession

from cdc.ground.config import Pipeline, SinkConfig
from cdc.ground.tables import TableName
from pipelines.views.state import BASE_SINK, base_path
from sinks.delta.settings import DeltaSettings
from sinks.registry import SinkConfigModel

CDF_DEFAULT = "spark.databricks.delta.properties.defaults.enableChangeDataFeed"
CDF_PROPERTY = "delta.enableChangeDataFeed"


def base_sink_config(pipeline: Pipeline, tables: list[TableName]) -> SinkConfig:
    """The synthetic delta sink of the base tables (constructed, not validated: its name starts
    with `_` so no pipeline file can name a sink like it)."""
    settings = DeltaSettings.model_construct(
        path=str(base_path(pipeline.state_path)),
        tables=sorted(str(t) for t in tables),
        views=[],
    )
    return SinkConfigModel.model_construct(name=BASE_SINK, delta=settings)


@contextlib.contextmanager
def change_data_feed(spark: SparkSession) -> Iterator[None]:
    """Tables the base follower creates (or re-creates for a rebuild) take Change Data Feed on."""
    before = spark.conf.get(CDF_DEFAULT, None)
    spark.conf.set(CDF_DEFAULT, "true")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(CDF_DEFAULT)
        else:
            spark.conf.set(CDF_DEFAULT, before)
