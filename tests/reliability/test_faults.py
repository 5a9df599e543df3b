"""Faults: a node that raises, hangs past the request timeout, returns the wrong shape or dtype,
or a model that fails to load, is reported with its name over HTTP and gRPC, and the other
requests and models keep being served."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

StatusCode = grpc.StatusCode
# the module's server keeps Triton's strict readiness (its fails_to_load model keeps it not ready)
STRICT_READINESS = True


@pytest.fixture(scope="module")
def http(module_server: Any) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(module_server.http_url, network_timeout=60)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def grpcc(module_server: Any) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(module_server.grpc_url)
    try:
        yield c
    finally:
        c.close()


def fp32(module: Any, name: str, values: list[float]) -> Any:
    t = module.InferInput(name, [len(values)], "FP32")
    t.set_data_from_numpy(np.array(values, np.float32))
    return t


def http_error(
    client: httpclient.InferenceServerClient, model: str, name: str, values: list[float], **kw: Any
) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, [fp32(httpclient, name, values)], **kw)
    return str(info.value.status()), info.value.message()


def grpc_error(
    client: grpcclient.InferenceServerClient, model: str, name: str, values: list[float], **kw: Any
) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, [fp32(grpcclient, name, values)], **kw)
    return str(info.value.status()), info.value.message()


def add_sub_ok(client: Any, module: Any) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for n in ("INPUT0", "INPUT1"):
        t = module.InferInput(n, [1, 16], "INT32")
        t.set_data_from_numpy(a)
        inputs.append(t)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def test_node_that_raises_is_named(http: Any, grpcc: Any) -> None:
    status, message = http_error(http, "faults", "x", [-1.0])
    assert (
        status == "500"
        and message == "in graph 'faults', node 'check': ValueError: negative values are not allowed"
    )
    status, message = grpc_error(grpcc, "faults", "x", [-1.0])
    assert status == str(StatusCode.INTERNAL) and "node 'check'" in message and "negative" in message
    np.testing.assert_array_equal(
        http.infer("faults", [fp32(httpclient, "x", [0.0, 5.0])]).as_numpy("y"), [0, 5]
    )


def test_a_repository_model_output_shape_and_dtype_are_served_as_returned(http: Any) -> None:
    """Triton does not check a backend's output shape or dtype against its config: a model that
    returns [3] where it declares [4] is served as returned (flowserve logs a warning once)."""
    result = http.infer("wrong_shape", [fp32(httpclient, "INPUT0", [0.0, 1.0, 2.0, 3.0])])
    assert result.as_numpy("OUTPUT0").shape == (3,)
    # and its dtype: FP64 where FP32 is declared (a narrowing; a widening is cast to the declared)
    wide = http.infer("wrong_dtype", [fp32(httpclient, "INPUT0", [0.0, 1.0, 2.0, 3.0])])
    assert wide.as_numpy("OUTPUT0").dtype == np.float64


@pytest.mark.parametrize(
    "model,name,values,fragments",
    [
        ("faults", "x", [1.0], ("in graph 'faults', node 'shape'", "has dtype int64, declared float32")),
        ("faults", "x", [2.0], ("in graph 'faults', node 'shape'", "has shape [1, 1], declared rank 1")),
    ],
)
def test_wrong_output_dtype_or_shape_is_named(
    http: Any, grpcc: Any, model: str, name: str, values: list[float], fragments: tuple[str, ...]
) -> None:
    for status, message, code in (
        (*http_error(http, model, name, values), "500"),
        (*grpc_error(grpcc, model, name, values), str(StatusCode.INTERNAL)),
    ):
        assert status == code, message
        for fragment in fragments:
            assert fragment in message, message
    add_sub_ok(http, httpclient)


def test_node_hanging_past_the_timeout(http: Any, grpcc: Any) -> None:
    """The request ``timeout`` (us) bounds the whole request, not just the start of a node: a
    node still running at the deadline is abandoned with UNAVAILABLE naming it, at once, while
    other requests go on. Its instance stays busy until the hung call returns."""
    hang_s = 3.0
    started = time.monotonic()
    status, message = http_error(http, "faults", "x", [100 + hang_s], timeout=300_000)
    waited = time.monotonic() - started
    assert status == "503", message
    assert "in graph 'faults', node 'nap'" in message and "request timeout expired (300000 us)" in message
    assert waited < 2.0, waited
    # other requests and models keep being served while the node's thread is still asleep
    add_sub_ok(grpcc, grpcclient)
    # the one instance of 'nap' is still busy: a request with a deadline gives up in time...
    status, message = grpc_error(grpcc, "faults", "x", [0.0], timeout=200_000)
    assert status == str(StatusCode.UNAVAILABLE) and "node 'nap'" in message, message
    # ...and once the hung call returns, the node serves again
    time.sleep(max(0.0, started + hang_s + 0.3 - time.monotonic()))
    np.testing.assert_array_equal(http.infer("faults", [fp32(httpclient, "x", [7.0])]).as_numpy("y"), [7.0])


def test_model_hanging_past_the_timeout(grpcc: Any, http: Any) -> None:
    started = time.monotonic()
    status, message = grpc_error(grpcc, "slow", "INPUT0", [2.0], timeout=250_000)
    assert status == str(StatusCode.UNAVAILABLE) and "in model 'slow'" in message and "timeout" in message, (
        message
    )
    assert time.monotonic() - started < 1.5
    add_sub_ok(http, httpclient)
    time.sleep(max(0.0, started + 2.2 - time.monotonic()))
    result = http.infer("slow", [fp32(httpclient, "INPUT0", [0.01])])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.array([0.01], np.float32))


def test_concurrent_requests_unaffected_by_a_failing_one(http: Any, module_server: Any) -> None:
    """Failing, hanging and good requests at once: each gets its own answer."""
    results: dict[str, Any] = {}

    def call(key: str, values: list[float], timeout: int | None = None) -> None:
        c = httpclient.InferenceServerClient(module_server.http_url, network_timeout=60)
        try:
            results[key] = (
                c.infer("faults", [fp32(httpclient, "x", values)], timeout=timeout).as_numpy("y").tolist()
            )
        except InferenceServerException as exc:
            results[key] = exc.message()
        finally:
            c.close()

    threads = [
        threading.Thread(target=call, args=("bad", [-5.0])),
        threading.Thread(target=call, args=("good", [4.0, 2.0])),
        threading.Thread(target=call, args=("dtype", [1.0])),
        threading.Thread(target=call, args=("good2", [9.0])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results["good"] == [4.0, 2.0] and results["good2"] == [9.0]
    assert "node 'check'" in results["bad"] and "node 'shape'" in results["dtype"]


def test_model_that_fails_to_load_leaves_others_up(
    http: Any, grpcc: Any, module_server: Any, rel: Any
) -> None:
    assert not http.is_model_ready("fails_to_load") and not grpcc.is_model_ready("fails_to_load")
    # strict readiness (Triton's default): the server is not ready while a model failed to load,
    # and the models that loaded serve
    assert not http.is_server_ready() and not grpcc.is_server_ready()
    assert http.is_server_live() and http.is_model_ready("add_sub") and grpcc.is_model_ready("slow")
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["fails_to_load"]["state"] == "UNAVAILABLE"
    assert "fails to load on purpose" in index["fails_to_load"]["reason"]
    status, message = http_error(http, "fails_to_load", "INPUT0", [1.0])
    assert status == "503" and "'fails_to_load'" in message and "fails to load on purpose" in message
    status, message = grpc_error(grpcc, "fails_to_load", "INPUT0", [1.0])
    assert status == str(StatusCode.UNAVAILABLE) and "fails to load on purpose" in message
    # loading it again fails again, and still leaves the others serving
    code, body = rel.post(module_server.http_port, "/v2/repository/models/fails_to_load/load", b"{}")
    assert code == 400 and "fails to load on purpose" in json.dumps(body)
    add_sub_ok(grpcc, grpcclient)
