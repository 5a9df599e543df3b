"""Crash isolation: a Python node that calls os._exit, segfaults or hangs, run as an isolated
(process) instance, fails only the request it was running, named, and is replaced; the server
and the other requests and models go on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(module_server: Any) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(module_server.http_url, network_timeout=60)
    try:
        yield c
    finally:
        c.close()


def x(value: float, module: Any = httpclient) -> list[Any]:
    t = module.InferInput("x", [1], "FP32")
    t.set_data_from_numpy(np.array([value], np.float32))
    return [t]


def pid(client: Any) -> int:
    result = client.infer("crash", x(0.0))
    np.testing.assert_array_equal(result.as_numpy("y"), [0.0])
    return int(result.as_numpy("pid")[0])


@pytest.mark.parametrize("value,how", [(3.0, "exit code 3"), (11.0, "killed by signal SIGSEGV")])
def test_crashing_node_is_named_and_replaced(
    client: httpclient.InferenceServerClient, module_server: Any, value: float, how: str
) -> None:
    before = pid(client)
    with pytest.raises(InferenceServerException) as info:
        client.infer("crash", x(value))
    assert info.value.status() == "500"
    message = info.value.message()
    assert message.startswith("in graph 'crash', node 'boom': its isolated worker process died"), message
    assert how in message
    assert client.is_server_live() and module_server.process.poll() is None
    after = pid(client)  # a fresh child serves the next request
    assert after != before
    with grpcclient.InferenceServerClient(module_server.grpc_url) as g:
        np.testing.assert_array_equal(g.infer("crash", x(5.0, grpcclient)).as_numpy("y"), [5.0])


def test_hung_isolated_node_is_killed_at_the_deadline(client: httpclient.InferenceServerClient) -> None:
    before = pid(client)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        client.infer("crash", x(130.0), timeout=300_000)
    assert info.value.status() == "503" and "node 'boom'" in info.value.message()
    assert time.monotonic() - started < 2
    # unlike a thread, the child is killed: the instance is back at once, in a new process
    started = time.monotonic()
    assert pid(client) != before
    assert time.monotonic() - started < 30
