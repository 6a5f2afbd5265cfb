"""A port that is taken gives one clear line (BindError) from every server, never a stack trace."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

from omnistream.service.ports import BindError, in_use_message, listen_socket, port_in_use
from omnistream.service.security import add_port
from omnistream.service.server import start_metrics_http


@pytest.fixture
def busy() -> Iterator[int]:
    """A loopback port something listens on, as another omnistream would."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_port_in_use(busy):
    assert port_in_use("127.0.0.1", busy)
    assert port_in_use("0.0.0.0", busy)  # a wildcard bind would collide with it too
    assert not port_in_use("127.0.0.1", 0)
    with listen_socket("127.0.0.1", 0, "--port") as sock:
        port = sock.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
    assert not port_in_use("127.0.0.1", port)  # closed: free again, TIME_WAIT or not


def test_in_use_message():
    assert in_use_message(8000, "--http-port/--grpc-port", who="omnistream up") == (
        "port 8000 is already in use (another omnistream up still running?): "
        "stop it or pass --http-port/--grpc-port"
    )


def test_listen_socket_on_a_busy_port(busy):
    with pytest.raises(BindError) as info:
        listen_socket("127.0.0.1", busy, "--http-port")
    assert str(info.value) == in_use_message(busy, "another --http-port")


def test_listen_socket_on_an_unusable_address():
    with pytest.raises(BindError, match=r"cannot listen on 192\.0\.2\.1:0 .*--http-port"):
        listen_socket("192.0.2.1", 0, "--http-port")  # TEST-NET-1: not an address of this host


async def test_grpc_add_port_on_a_busy_port(busy):
    server = grpc.aio.server()
    with pytest.raises(BindError) as info:
        add_port(server, f"127.0.0.1:{busy}", None, "--grpc-port")
    assert str(info.value) == in_use_message(busy, "another --grpc-port")
    assert add_port(server, "127.0.0.1:0", None) > 0  # a free one still binds


def test_metrics_on_a_busy_port(busy):
    with pytest.raises(BindError, match=rf"port {busy} is already in use.*--metrics-port"):
        start_metrics_http(busy, registry=CollectorRegistry())
