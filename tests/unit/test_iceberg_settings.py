"""The `iceberg` sink kind's settings (issue 39): the embedded SQLite catalog by default, its file
next to the lake, JDBC and REST catalogs by configuration, and what it refuses (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc.ground.errors import PipelineFileError
from sinks.iceberg.catalog import catalog_properties, pyiceberg_properties
from sinks.registry import parse_pipeline, sink_factory

pytestmark = pytest.mark.unit


def _pipeline(iceberg: dict, tmp_path: Path, **sink):
    return parse_pipeline(
        {
            "name": "p",
            "source": {"postgres": {"dsn": "dbname=x", "tables": ["public.t"]}},
            "sinks": [{"name": "ice", "iceberg": iceberg, **sink}],
        },
        base_dir=tmp_path,
    )


def test_default_catalog_is_a_sqlite_file_next_to_the_lake_that_pyiceberg_reads(tmp_path: Path) -> None:
    pipeline = _pipeline({"warehouse": "lake"}, tmp_path)
    sink = pipeline.sinks[0]
    assert sink.kind == "iceberg" and sink.settings.write_mode == "merge-on-read"
    lake = (tmp_path / "lake").resolve()
    props = catalog_properties(sink, pipeline)
    assert props == {
        "warehouse": str(lake),
        "catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        "uri": f"jdbc:sqlite:{lake / 'catalog.db'}",
        "jdbc.schema-version": "V1",
    }
    assert pyiceberg_properties(sink, pipeline)["uri"] == f"sqlite:///{lake / 'catalog.db'}"
    assert sink_factory("iceberg").__module__ == "sinks.iceberg.sink"


def test_jdbc_and_rest_catalogs_pass_their_settings_through(tmp_path: Path) -> None:
    jdbc = {"type": "jdbc", "uri": "jdbc:postgresql://127.0.0.1/cat", "user": "u", "password": "pw"}
    pipeline = _pipeline(
        {"warehouse": "s3://bucket/lake", "catalog": jdbc | {"properties": {"s3.endpoint": "x"}}}, tmp_path
    )
    props = catalog_properties(pipeline.sinks[0], pipeline)
    assert props["uri"] == jdbc["uri"] and props["jdbc.user"] == "u" and props["jdbc.password"] == "pw"
    assert props["warehouse"] == "s3://bucket/lake" and props["s3.endpoint"] == "x"
    rest = _pipeline(
        {"warehouse": "lake", "catalog": {"type": "rest", "uri": "http://127.0.0.1:8181"}}, tmp_path
    )
    assert catalog_properties(rest.sinks[0], rest)["type"] == "rest"


def test_pyiceberg_opens_the_sqlite_postgresql_and_rest_catalogs(tmp_path: Path) -> None:
    """`cdc sql` and the cut readers open the sink's catalog with pyiceberg: the JDBC URL on
    PostgreSQL becomes SQLAlchemy's (credentials quoted), another database is refused."""
    jdbc = {"type": "jdbc", "uri": "jdbc:postgresql://127.0.0.1:5433/cat", "user": "u@x", "password": "p/w:"}
    pg = _pipeline({"warehouse": "lake", "catalog": jdbc}, tmp_path)
    props = pyiceberg_properties(pg.sinks[0], pg)
    assert props["uri"] == "postgresql+psycopg2://u%40x:p%2Fw%3A@127.0.0.1:5433/cat", props
    assert props["type"] == "sql" and props["warehouse"] == f"file://{(tmp_path / 'lake').resolve()}"
    other = _pipeline({"warehouse": "lake", "catalog": jdbc | {"uri": "jdbc:mysql://h/db"}}, tmp_path)
    with pytest.raises(ValueError, match="PostgreSQL and SQLite only"):
        pyiceberg_properties(other.sinks[0], other)
    rest = _pipeline(
        {
            "warehouse": "s3://b/l",
            "catalog": {"type": "rest", "uri": "http://h:8181", "properties": {"token": "t"}},
        },
        tmp_path,
    )
    assert pyiceberg_properties(rest.sinks[0], rest) == {
        "type": "rest",
        "uri": "http://h:8181",
        "warehouse": "s3://b/l",
        "token": "t",
    }


def test_the_cut_record_of_a_warehouse_on_an_object_store_keeps_its_uri() -> None:
    from sinks.delta.cuts import cuts_path

    assert cuts_path("s3://bucket/lake/") == "s3://bucket/lake/_cdc_cuts"
    assert cuts_path("/abs/lake") == "/abs/lake/_cdc_cuts"


def test_commit_conflicts_are_told_from_other_iceberg_errors() -> None:
    from sinks.iceberg.conflicts import is_conflict

    assert is_conflict(RuntimeError("org.apache.iceberg.exceptions.CommitFailedException: base changed"))
    assert is_conflict(
        RuntimeError(
            "org.apache.iceberg.exceptions.ValidationException: Cannot commit, missing data files: [x]"
        )
    )
    assert is_conflict(RuntimeError("ValidationException: Found conflicting files that can contain records"))
    assert not is_conflict(
        RuntimeError("org.apache.iceberg.exceptions.ValidationException: Cannot find field 'x'")
    )


def test_an_iceberg_sink_follows_derived_views_and_drops_columns_in_scd1(tmp_path: Path) -> None:
    from cdc.ground.config import sink_tables, sink_views
    from cdc.ground.tables import TableName

    pipeline = parse_pipeline(
        {
            "name": "p",
            "source": {"postgres": {"dsn": "dbname=x", "tables": ["public.t"]}},
            "views": [{"name": "v", "sql": "SELECT id, x FROM public.t", "key": ["id"]}],
            "sinks": [
                {"name": "ice", "dropped_columns": "drop", "iceberg": {"warehouse": "w", "views": ["v"]}}
            ],
        },
        base_dir=tmp_path,
    )
    sink = pipeline.sinks[0]
    assert sink_views(sink) == ["v"] and sink_tables(sink, [TableName("public", "t")]) == []
    assert sink.dropped_columns == "drop"


def test_a_table_may_have_its_own_write_mode(tmp_path: Path) -> None:
    """table_options.<table>.write_mode overrides the sink's write_mode for that table only, beside
    the options every kind has (keys parsed as SQL names)."""
    from cdc.ground.tables import TableName
    from sinks.iceberg.writemode import write_properties

    options = {"public.t": {"write_mode": "copy-on-write", "mask": {"a": "null"}}}
    pipeline = parse_pipeline(
        {
            "name": "p",
            "source": {"postgres": {"dsn": "dbname=x", "tables": ["public.t", "public.u", "public.v"]}},
            "sinks": [
                {"name": "ice", "iceberg": {"warehouse": "w", "table_options": options | {"public.u": {}}}},
                {
                    "name": "cow",
                    "iceberg": {
                        "warehouse": "c",
                        "write_mode": "copy-on-write",
                        "table_options": {'"public".v': {"write_mode": "merge-on-read"}},
                    },
                },
            ],
        },
        base_dir=tmp_path,
    )
    ice, cow = (s.settings for s in pipeline.sinks)
    t, u, v = (TableName("public", n) for n in "tuv")
    assert [ice.write_mode_for(x) for x in (t, u, v)] == ["copy-on-write", "merge-on-read", "merge-on-read"]
    assert [cow.write_mode_for(x) for x in (t, u, v)] == ["copy-on-write", "copy-on-write", "merge-on-read"]
    opts = ice.options_for(t)
    assert opts is not None and opts.mask == {"a": "null"}  # the shared options still apply
    # the table's write mode shapes no value: changing it rebuilds nothing (the apply job rebuilds a
    # table whose shape record changed), a mask still does
    from sinks.shaping import shape_record

    assert shape_record(pipeline.sinks[1], v) == "" and shape_record(pipeline.sinks[0], u) == ""
    assert shape_record(pipeline.sinks[0], t) == '{"mask": {"a": "null"}}'
    assert write_properties("copy-on-write") == {
        "write.merge.mode": "copy-on-write",
        "write.update.mode": "copy-on-write",
        "write.delete.mode": "copy-on-write",
    }


@pytest.mark.parametrize(
    ("iceberg", "sink", "said"),
    [
        ({"warehouse": "w", "catalog": {"type": "jdbc"}}, {}, "needs `uri`"),
        ({"warehouse": "w", "catalog": {"uri": "jdbc:sqlite:x"}}, {}, "give no `uri`"),
        (
            {"warehouse": "w", "catalog": {"type": "rest", "uri": "http://h", "user": "u"}},
            {},
            "for catalog type jdbc",
        ),
        ({"warehouse": "w", "views": ["v", "v"]}, {}, "named twice"),
        ({"warehouse": "w", "views": ["v"]}, {}, "unknown view"),
        ({"warehouse": "w", "mode": "scd2"}, {"dropped_columns": "drop"}, "scd2 keeps every version"),
        ({"warehouse": "w", "write_mode": "fast"}, {}, "write_mode"),
        (
            {"warehouse": "w", "table_options": {"public.t": {"write_mode": "fast"}}},
            {},
            r"table_options\.public\.t\.write_mode: Input should be 'merge-on-read' or 'copy-on-write'",
        ),
        (
            {"warehouse": "w", "table_options": {"public.x": {"write_mode": "copy-on-write"}}},
            {},
            "table public.x is not among this sink's tables",
        ),
        ({"warehouse": "w", "mode": "scd3"}, {}, "mode"),
        ({}, {}, "warehouse"),
    ],
)
def test_bad_settings_are_refused(iceberg: dict, sink: dict, said: str, tmp_path: Path) -> None:
    with pytest.raises(PipelineFileError, match=said):
        _pipeline(iceberg, tmp_path, **sink)


def test_teardown_keeps_the_warehouse_and_the_sqlite_catalog_of_a_remote_warehouse(tmp_path: Path) -> None:
    from pipelines.teardown_data import remove_captured

    pipeline = parse_pipeline(
        {
            "name": "p",
            "source": {"postgres": {"dsn": "dbname=x", "tables": ["public.t"]}},
            "state_dir": "st",
            "sinks": [
                {"name": "ice", "iceberg": {"warehouse": "st/ice"}},
                {"name": "far", "iceberg": {"warehouse": "s3://bucket/lake"}},
            ],
        },
        base_dir=tmp_path,
    )
    state = tmp_path / "st"
    for rel in ("ice/catalog.db", "ice/public/t/data/x.parquet", "far-catalog.db", "checkpoints/ice.json"):
        (state / rel).parent.mkdir(parents=True, exist_ok=True)
        (state / rel).write_bytes(b"row")
    remove_captured(pipeline)
    left = sorted(str(p.relative_to(state)) for p in state.rglob("*") if p.is_file())
    assert left == ["far-catalog.db", "ice/catalog.db", "ice/public/t/data/x.parquet"], left
