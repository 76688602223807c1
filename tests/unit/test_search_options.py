"""The search sink's pipeline-file options (sinks/search/settings.py): parsing only, no services."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def test_pipeline_file_search_options(tmp_path: Path) -> None:
    from cdc.ground.errors import PipelineFileError
    from sinks.registry import parse_pipeline

    def parse(search: dict) -> None:
        parse_pipeline(
            {
                "name": "p",
                "source": {"postgres": {"dsn": "x", "tables": ["public.t"]}},
                "sinks": [{"name": "s", "search": search}],
            }
        )

    parse({"tables": ["public.t"], "fields": {"public.t": {"v": "keyword"}}, "gc_deletes": "12h"})
    for bad, expected in (
        ({"tables": ["public.t"], "colour": 1}, "unknown key 'colour'"),
        ({"tables": ["public.t"], "fields": {"public.u": {"v": "text"}}}, "not among this sink's `tables`"),
        ({"tables": ["public.t"], "fields": {"public.t": {"v": "blob"}}}, "fields.public.t.v"),
        ({"tables": ["public.t"], "gc_deletes": "soon"}, "gc_deletes"),
        ({"engine": "opensearch", "tables": ["public.t"]}, "needs `hosts`"),
    ):
        with pytest.raises(PipelineFileError) as exc:
            parse(bad)
        assert expected in str(exc.value), (bad, str(exc.value))


def test_opensearch_security_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """username/password (from ${ENV}, kept out of repr), certificate files relative to the pipeline
    file, and the combinations that are refused (exit 2 naming the keys)."""
    from cdc.ground.errors import PipelineFileError
    from sinks.registry import load_pipeline, parse_pipeline

    os_sink = {"engine": "opensearch", "tables": ["public.t"], "hosts": ["https://h:9200"]}

    def parse(search: dict) -> None:
        parse_pipeline(
            {
                "name": "p",
                "source": {"postgres": {"dsn": "x", "tables": ["public.t"]}},
                "sinks": [{"name": "s", "search": search}],
            }
        )

    monkeypatch.setenv("CDC_UNIT_OS_PW", "pw-from-env-1234")
    (tmp_path / "p.yml").write_text(
        "name: p\nsource: {postgres: {dsn: x, tables: [public.t]}}\nsinks:\n"
        "  - name: s\n    search: {engine: opensearch, tables: [public.t], hosts: ['https://h:9200'],"
        " username: cdc, password: '${CDC_UNIT_OS_PW}', ca_file: certs/ca.crt,"
        " client_cert: c.crt, client_key: c.key}\n"
    )
    settings = load_pipeline(tmp_path / "p.yml").sinks[0].search
    assert settings is not None and settings.password == "pw-from-env-1234"
    assert "pw-from-env-1234" not in repr(settings)
    assert settings.ca_file == str(tmp_path / "certs" / "ca.crt")
    assert settings.client_key == str(tmp_path / "c.key")
    parse(os_sink | {"aws_sigv4": {"region": "eu-west-1", "service": "aoss"}, "verify_certs": False})
    for bad, expected in (
        (os_sink | {"username": "u"}, "username and password go together"),
        (os_sink | {"password": "secret-xyz-987"}, "username and password go together"),
        (os_sink | {"client_cert": "c.crt"}, "client_cert and client_key go together"),
        (os_sink | {"username": "u", "password": "p", "aws_sigv4": {"region": "r"}}, "exclude each other"),
        (os_sink | {"aws_sigv4": {"region": "r", "service": "s3"}}, "aws_sigv4.service"),
        ({"tables": ["public.t"], "username": "u", "password": "p"}, "only for engine opensearch"),
    ):
        with pytest.raises(PipelineFileError) as exc:
            parse(bad)
        assert expected in str(exc.value), (bad, str(exc.value))
        assert "secret-xyz-987" not in str(exc.value)
