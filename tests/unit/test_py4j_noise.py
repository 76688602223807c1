"""A driver JVM that died leaves py4j's tracebacks out of a verb's output (pipelines/spark.py
_quiet_py4j_network_errors): py4j logs every command that fails on a dead connection on the root
logger. Real py4j, sending to a port that resets each connection. The whole verb is
tests/integration/test_driver_out_of_memory.py."""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading

import pytest
from py4j.java_gateway import GatewayClient, GatewayParameters
from py4j.protocol import Py4JError, get_return_value

from pipelines import spark as spark_module

pytestmark = pytest.mark.unit


@pytest.fixture
def dead_jvm_port():
    """A port that accepts a connection and resets it, as a JVM that is dying does."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(5)

    def reset_every_connection() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()

    thread = threading.Thread(target=reset_every_connection, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    server.close()


def _send_to(port: int) -> None:
    client = GatewayClient(gateway_parameters=GatewayParameters(address="127.0.0.1", port=port))
    with pytest.raises(Py4JError):  # the caller still gets the failure
        get_return_value(client.send_command("c\nt\nnanoTime\ne\n"), client)


def _py4j_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("Exception while sending command")]


@pytest.fixture
def root_filters():
    """The root logger without the filter (a Spark session of this test session may have added it)."""
    root = logging.getLogger()
    before = list(root.filters)
    root.filters[:] = [f for f in before if not isinstance(f, spark_module._Py4jNetworkNoise)]
    yield root
    root.filters[:] = before


def test_py4j_logs_a_dead_connection_on_the_root_logger(
    caplog, root_filters, monkeypatch, dead_jvm_port
) -> None:
    monkeypatch.delenv("CDC_DEBUG", raising=False)
    caplog.set_level(logging.INFO)
    _send_to(dead_jvm_port)
    assert _py4j_records(caplog)  # what the filter is for: without it the record reaches stderr


def test_the_filter_drops_it_and_nothing_else(caplog, root_filters, monkeypatch, dead_jvm_port) -> None:
    monkeypatch.delenv("CDC_DEBUG", raising=False)
    caplog.set_level(logging.INFO)
    spark_module._quiet_py4j_network_errors()
    spark_module._quiet_py4j_network_errors()  # once per process, however many sessions
    assert sum(isinstance(f, spark_module._Py4jNetworkNoise) for f in root_filters.filters) == 1
    _send_to(dead_jvm_port)
    logging.error("something else")
    assert not _py4j_records(caplog)
    assert "something else" in [r.getMessage() for r in caplog.records]


def test_cdc_debug_keeps_it(caplog, root_filters, monkeypatch, dead_jvm_port) -> None:
    monkeypatch.setenv("CDC_DEBUG", "1")
    caplog.set_level(logging.INFO)
    spark_module._quiet_py4j_network_errors()
    _send_to(dead_jvm_port)
    assert _py4j_records(caplog)
