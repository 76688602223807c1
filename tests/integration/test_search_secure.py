"""The search sink against an OpenSearch node with the real security plugin (issue 24 item 3;
README Security): https with a CA made at test time, HTTP basic auth with the password from
${ENV}, and client-certificate sign-in. The settings reach the driver's index management, the
executors' bulk writes (apply) and scroll reads (verify), and `cdc search`; an independent
opensearch-py reader sees the source's rows; no task function shipped to the executors holds
the password (they read it from their environment, issue 24 item 4). A wrong password or an untrusted CA is exit 3
naming the setting, with no secret printed. `aws_sigv4`: every request checked by a proxy that
recomputes its SigV4 signature (not Amazon: no network here)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from cdc.ground.errors import EngineSettingError
from cdc.ground.tables import TableName
from sinks.registry import load_pipeline, make_sink
from sinks.search.query import run_search
from snapshot.runner import run_snapshot
from tests.fixtures.certs import make_certs
from tests.fixtures.opensearch_secure import PASSWORD, USER, SecureOpenSearch, secure_opensearch  # noqa: F401
from tests.fixtures.readers import opensearch_docs
from tests.fixtures.sigv4_proxy import SigV4Proxy, sigv4_proxy
from tests.fixtures.spark_tasks import shipped_tasks
from tests.harness import apply_once, cdc, source_rows, sql, stream_changes, verify, write_pipeline

pytestmark = [pytest.mark.integration]

ENV = "CDC_TEST_OS_PASSWORD"


def search_sink(node: SecureOpenSearch, name: str, **security: str | bool) -> dict:
    return {
        "name": name,
        "search": {
            "engine": "opensearch",
            "tables": ["public.items"],
            "hosts": [node.url],
            "index_prefix": f"sec_{name}",
            "replicas": 0,
            **security,
        },
    }


def independent_docs(node: SecureOpenSearch, index: str) -> dict[str, dict]:
    """The index's documents read by opensearch-py with its own TLS and basic-auth settings."""
    from opensearchpy import OpenSearch, helpers

    client = OpenSearch(
        [node.url], http_auth=(USER, PASSWORD), ca_certs=str(node.certs / "ca.crt"), timeout=60
    )
    try:
        client.indices.refresh(index=index)
        return {
            h["_id"]: h["_source"]
            for h in helpers.scan(client, index=index, query={"query": {"match_all": {}}})
        }
    finally:
        client.close()


def test_tls_basic_auth_and_client_certificate(
    pg_db: str, spark, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node: SecureOpenSearch = request.getfixturevalue("secure_opensearch")  # imported above: module scope
    shutil.copy(
        node.certs / "ca.crt", tmp_path / "ca.crt"
    )  # relative paths: from the pipeline file's directory
    sql(
        pg_db,
        "CREATE TABLE items (id int PRIMARY KEY, title text)",
        "INSERT INTO items SELECT g, 'hello ' || g FROM generate_series(1, 30) g",
    )
    monkeypatch.setenv(ENV, PASSWORD)
    f = write_pipeline(
        tmp_path,
        pg_db,
        ["public.items"],
        sinks=[
            search_sink(node, "s", username=USER, password=f"${{{ENV}}}", ca_file="ca.crt"),
            search_sink(
                node,
                "m",
                ca_file=str(node.certs / "ca.crt"),
                client_cert=str(node.certs / "client.crt"),
                client_key=str(node.certs / "client.key"),
            ),
        ],
        spark={"conf": {"spark.sql.shuffle.partitions": 2}},
    )
    run_snapshot(load_pipeline(f), progress=False)
    with shipped_tasks(monkeypatch) as shipped:
        apply_once(f, spark)
        sql(pg_db, "UPDATE items SET title = 'changed' WHERE id <= 5", "DELETE FROM items WHERE id > 25")
        stream_changes(f, pg_db)
        apply_once(f, spark)
        expected = {str(k[0]): v["title"] for k, v in source_rows(pg_db, "public.items", ["id"]).items()}
        pipeline = load_pipeline(f)
        code, report = verify(f, spark, "s")  # executors read over TLS with the sink's basic auth
        assert code == 0 and "identical" in report, report
    # issue 24 item 4: the bulk writes and scroll reads the executors ran carried the password's
    # variable (README "Secrets on the executors"), never the password itself
    assert len(shipped.containing("CDC_SECRET_S_PASSWORD")) >= 2, "no bulk write or scroll read was shipped"
    assert not shipped.containing(PASSWORD), "the password is inside a pickled task function"
    for name in ("s", "m"):  # both written over TLS, each with its own sign-in
        index = make_sink(pipeline.sink(name), pipeline, None).index_of(TableName.parse("public.items"))
        docs = independent_docs(node, index)
        assert {k: d["title"] for k, d in docs.items()} == expected
    found = list(run_search(pipeline, "public.items", "changed", "m", 10))  # mTLS from the driver
    assert "5 hit(s)" in found[0], found

    # a wrong password: exit 3 naming the settings, the secret never printed
    wrong = "wrong-" + PASSWORD
    run = cdc("search", f, "public.items", "changed", "--sink", "s", env={ENV: wrong})
    assert run.code == 3, run
    assert f"refused the sign-in of sinks[s].search.username '{USER}' (HTTP 401)" in run.err, run.err
    assert "fix: check sinks[s].search.username and sinks[s].search.password" in run.err, run.err
    assert wrong not in run.out + run.err and PASSWORD not in run.out + run.err and "Traceback" not in run.err

    # a CA that did not sign the node's certificate: exit 3 naming ca_file
    shutil.copy(node.certs / "other.crt", tmp_path / "ca.crt")
    with pytest.raises(EngineSettingError) as bad:
        list(run_search(load_pipeline(f), "public.items", "changed", "s", 10))
    assert bad.value.exit_code == 3
    assert "the node's TLS certificate was refused (" in bad.value.problem, bad.value.problem
    assert f"sinks[s].search.ca_file is {tmp_path / 'ca.crt'}" in bad.value.problem, bad.value.problem
    assert bad.value.fix == "set sinks[s].search.ca_file to the CA that signed the nodes' certificates"
    assert PASSWORD not in str(bad.value)


AKID, SECRET = "AKIDCDCTESTEXAMPLE", "cdc/test+SECRET/key0123456789abcdefEXAMPLE"


def test_aws_sigv4_signs_every_request(
    pg_db: str, spark, opensearch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aws_sigv4: every request of the driver and of the executors reaches a proxy that recomputes
    its SigV4 signature with the test's secret key (tests/fixtures/sigv4_proxy.py). Not Amazon."""
    certs = tmp_path / "certs"
    certs.mkdir()
    ca, _pem, _other = make_certs(certs)  # broker.crt names 127.0.0.1: the proxy's certificate
    env = {"AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET}
    for key in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))  # the environment's keys only
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # the executors' environment, as spark.executorEnv.* gives it on a cluster (README Security)
    executors = spark.sparkContext.environment
    executors.update(env)
    sql(
        pg_db,
        "CREATE TABLE items (id int PRIMARY KEY, title text)",
        "INSERT INTO items SELECT g, 'hello ' || g FROM generate_series(1, 20) g",
    )
    proxy = SigV4Proxy(opensearch.url, AKID, SECRET, "eu-west-1", "es")
    try:
        with sigv4_proxy(proxy, certs / "broker.crt", certs / "broker.key"):
            f = write_pipeline(
                tmp_path,
                pg_db,
                ["public.items"],
                sinks=[
                    {
                        "name": "s",
                        "search": {
                            "engine": "opensearch",
                            "tables": ["public.items"],
                            "hosts": [f"https://127.0.0.1:{proxy.port}"],
                            "index_prefix": "sigv4",
                            "replicas": 0,
                            "ca_file": str(ca),
                            "aws_sigv4": {"region": "eu-west-1", "service": "es"},
                        },
                    }
                ],
                spark={"conf": {"spark.sql.shuffle.partitions": 2}},
            )
            run_snapshot(load_pipeline(f), progress=False)
            apply_once(f, spark)
            code, report = verify(f, spark, "s")
            assert code == 0 and "identical" in report, report
            assert proxy.refused == [] and proxy.verified > 5, (proxy.verified, proxy.refused)
            docs = opensearch_docs(opensearch.url, "sigv4.public.items")  # the node itself, not the proxy
            assert {k: d["title"] for k, d in docs.items()} == {str(i): f"hello {i}" for i in range(1, 21)}

            # verify_certs: false (test clusters only): the proxy's certificate is not checked, no ca_file
            loose = tmp_path / "loose"
            loose.mkdir()
            sink = yaml.safe_load(f.read_text())["sinks"][0]
            del sink["search"]["ca_file"]
            sink["search"]["verify_certs"] = False
            g = write_pipeline(loose, pg_db, ["public.items"], sinks=[sink])
            lines = list(run_search(load_pipeline(g), "public.items", "hello", "s", 5))
            assert "top 5 of 20 hit(s)" in lines[0], lines

            # a secret that does not match: exit 3 naming aws_sigv4, no secret printed
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + SECRET)
            with pytest.raises(EngineSettingError) as bad:
                list(run_search(load_pipeline(f), "public.items", "hello", "s", 5))
            assert bad.value.exit_code == 3
            assert "refused the SigV4-signed request of the AWS identity of sinks[s].search.aws_sigv4" in str(
                bad.value
            )
            assert SECRET not in str(bad.value) and proxy.refused, proxy.refused

            # boto3 not installed (it is optional): exit 3 saying to install it
            monkeypatch.setitem(sys.modules, "boto3", None)
            with pytest.raises(EngineSettingError) as missing:
                list(run_search(load_pipeline(f), "public.items", "hello", "s", 5))
            assert missing.value.exit_code == 3
            assert "sinks[s].search.aws_sigv4 needs the boto3 package" in missing.value.problem
            assert "pip install boto3" in (missing.value.fix or "")
    finally:
        for key in env:
            executors.pop(key, None)


def test_validate_signs_in_to_opensearch(
    pg_db: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cdc validate` signs in to each OpenSearch sink (issue 34 item 3): ok with the right
    password and with a client certificate, exit 3 naming the setting with a wrong one, no secret."""
    node: SecureOpenSearch = request.getfixturevalue("secure_opensearch")
    sql(pg_db, "CREATE TABLE items (id int PRIMARY KEY, title text)")
    ca = str(node.certs / "ca.crt")
    sinks = [
        search_sink(node, "s", username=USER, password=f"${{{ENV}}}", ca_file=ca),
        search_sink(
            node,
            "m",
            ca_file=ca,
            client_cert=str(node.certs / "client.crt"),
            client_key=str(node.certs / "client.key"),
        ),
    ]
    f = write_pipeline(tmp_path, pg_db, ["public.items"], sinks=sinks)
    monkeypatch.setenv(ENV, PASSWORD)
    run = cdc("validate", f)
    assert run.code == 0, run
    for name in ("s", "m"):
        assert f"ok   sink {name}: OpenSearch at {node.url}: reachable, signed in (version " in run.out, (
            run.out
        )

    wrong = "wrong-" + PASSWORD
    monkeypatch.setenv(ENV, wrong)
    run = cdc("validate", f)
    assert run.code == 3, run
    assert (
        f"FAIL OpenSearch at {node.url} refused the sign-in of sinks[s].search.username {USER!r} (HTTP 401)"
        in run.out
    ), run.out
    assert "fix: check sinks[s].search.username and sinks[s].search.password" in run.out, run.out
    assert "1 problem(s) found" in run.out, run.out  # the certificate sink still signs in
    assert wrong not in run.out + run.err and PASSWORD not in run.out + run.err and "Traceback" not in run.err
