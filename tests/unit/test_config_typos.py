"""Unknown keys in the pipeline file get the key they most likely meant (cdc/ground/pipeline_file.py
keys_at + difflib), through the real `cdc validate` (exit 2, `error:` and `fix:`, no traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import cdc

pytestmark = pytest.mark.unit

FILE = """\
name: shop
source:
  postgres:
    dsn: postgresql://u:secret@127.0.0.1:1/db
    tabels: [public.t]
stat_dir: .cdc/shop
sinks:
  - name: lake
    delta: {path: lake, mdoe: scd2}
  - name: cache
    redis: {url: "redis://127.0.0.1:6379/0", tables: [public.t], tll: 60}
spark: {mastr: "local[2]"}
zzzz: 1
"""


def test_typos_get_did_you_mean(tmp_path: Path) -> None:
    path = tmp_path / "shop.yml"
    path.write_text(FILE)
    run = cdc("validate", path)
    assert run.code == 2, run
    text = run.out + run.err
    for line in (
        "(top level): unknown key 'stat_dir' (did you mean 'state_dir'?)",
        "sinks.0.delta: unknown key 'mdoe' (did you mean 'mode'?)",
        "source.postgres: unknown key 'tabels' (did you mean 'tables'?)",
        "sinks.1.redis: unknown key 'tll' (did you mean 'ttl'?)",
        "spark: unknown key 'mastr' (did you mean 'master'?)",
        "(top level): unknown key 'zzzz'\n",  # nothing close: no guess
    ):
        assert line in text, (line, text)
    assert "error:" in text and "fix:" in text
    assert "Traceback" not in text and "secret" not in text


def test_bad_delta_table_feature_values_name_the_key(tmp_path: Path) -> None:
    """`on_type_change` and `column_mapping` (README "Reading the lake") take only their documented
    values: anything else is exit 2 naming the key and the values it takes."""
    path = tmp_path / "shop.yml"
    path.write_text(
        FILE.replace(
            "delta: {path: lake, mdoe: scd2}", "delta: {path: lake, on_type_change: widn, column_mapping: id}"
        )
        .replace("tabels", "tables")
        .replace("stat_dir", "state_dir")
        .replace(", tll: 60", "")
        .replace("mastr", "master")
        .replace("zzzz: 1\n", "")
    )
    run = cdc("validate", path)
    text = run.out + run.err
    assert run.code == 2, text
    assert (
        "sinks.0.delta.on_type_change: Input should be 'rewrite', 'widen' or 'stop' (got 'widn')" in text
    ), text
    assert "sinks.0.delta.column_mapping: Input should be 'auto' or 'name' (got 'id')" in text, text
    assert "fix:" in text and "Traceback" not in text and "secret" not in text


@pytest.mark.parametrize(
    "uri", ["s3://bucket/lake", "s3a://bucket/lake", "file:///srv/lake", "abfss://c@a/lake"]
)
def test_a_directory_given_as_a_uri_is_refused_not_made_a_local_folder(tmp_path: Path, uri: str) -> None:
    """A Delta lake and a tantivy index are written with file-system calls: `s3://bucket/lake`
    would become the local folder `s3:/bucket/lake` under the pipeline file's directory. Exit 2
    naming the key, before anything is written."""
    path = tmp_path / "shop.yml"
    path.write_text(
        FILE.replace("delta: {path: lake, mdoe: scd2}", f"delta: {{path: '{uri}'}}")
        .replace("tabels", "tables")
        .replace("stat_dir: .cdc/shop", f"state_dir: '{uri}'\nlog: {{local: {{path: '{uri}'}}}}")
        .replace(
            'redis: {url: "redis://127.0.0.1:6379/0", tables: [public.t], tll: 60}',
            f"search: {{tables: [public.t], path: '{uri}'}}",
        )
        .replace("mastr", "master")
        .replace("zzzz: 1\n", "")
    )
    run = cdc("validate", path)
    text = run.out + run.err
    assert run.code == 2, text
    for key in ("sinks.0.delta.path", "sinks.1.search.path", "state_dir", "log.local.path"):
        assert f"{key}: {uri!r} is a URI: this directory must be on a local or shared" in text, text
    assert "fix:" in text and "Traceback" not in text and "secret" not in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shop.yml"]  # no folder named s3: etc.
