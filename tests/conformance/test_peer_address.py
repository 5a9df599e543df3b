"""The client address each front end puts on a request (InferRequest.peer), which a stateful
model's sequence slots are shared by (flowserve/nodes/sequence.py)."""

from __future__ import annotations

import pytest

from flowserve.frontends.grpc.http2 import CallContext, grpc_peer
from flowserve.frontends.grpc.service import peer_host
from flowserve.frontends.http.app import client_address


class _Context:
    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:127.0.0.2:50123", "127.0.0.2"),
        ("ipv6:[::1]:50123", "::1"),
        ("ipv6:%5B::1%5D:50123", "::1"),  # grpcio percent-encodes the brackets
        ("unix:/tmp/s.sock", "unix:/tmp/s.sock"),
        ("", ""),
    ],
)
def test_grpc_peer_host(peer: str, host: str) -> None:
    assert peer_host(_Context(peer)) == host


def test_the_native_grpc_transport_gives_peer_as_grpcio_does() -> None:
    assert grpc_peer(("10.1.2.3", 4567)) == "ipv4:10.1.2.3:4567"
    assert grpc_peer(("fe80::1", 4567, 0, 0)) == "ipv6:[fe80::1]:4567"
    assert grpc_peer(None) == ""
    context = CallContext([])
    assert context.peer() == "" and peer_host(context) == ""
    context.peer_address = grpc_peer(("10.1.2.3", 4567))
    assert peer_host(context) == "10.1.2.3"
    assert peer_host(object()) == ""  # a context without peer()


def test_http_client_address() -> None:
    assert client_address({"client": ("127.0.0.2", 5555)}) == "127.0.0.2"
    assert client_address({"client": None}) == ""
    assert client_address({}) == ""
