"""A streaming client that does not read costs only itself, on a real `flowserve serve`: a gRPC
ModelStreamInfer whose client keeps a zero flow-control window on the bundled decoupled graph
`repeat` (one instance) neither blocks another client of that graph nor holds the shutdown."""

from __future__ import annotations

import queue
import struct
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from tests.h2raw import DATA, HEADERS, RawClient, frame, grpc_message, request_headers

pytestmark = pytest.mark.slow

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
INITIAL_WINDOW_SIZE = 4


def repeat_request(x: np.ndarray, n: int) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="repeat", id="slow")
    for name, array in (("x", x), ("n", np.array([n], np.int32))):
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = name, "INT32"
        tensor.shape.extend(array.shape)
        request.raw_input_contents.append(array.tobytes())
    return bytes(request.SerializeToString())


def stream_repeat(url: str, n: int, timeout: float) -> list[int]:
    """``index`` of every response of one `repeat` request over tritonclient's stream."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        x = grpcclient.InferInput("x", [4], "INT32")
        x.set_data_from_numpy(np.arange(4, dtype=np.int32))
        count = grpcclient.InferInput("n", [1], "INT32")
        count.set_data_from_numpy(np.array([n], np.int32))
        client.async_stream_infer("repeat", [x, count])
        got = []
        for _ in range(n):
            answer = answers.get(timeout=timeout)
            assert not isinstance(answer, Exception), answer
            got.append(int(answer.as_numpy("index")[0]))
        return got
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def test_a_grpc_stream_with_a_zero_window_blocks_no_one(server_factory: Any) -> None:
    proc = server_factory.start(listeners="http,grpc")
    stalled = RawClient(proc.grpc_port, timeout=10)
    try:
        # a client that grants no window: the server can send it nothing at all
        stalled.handshake(struct.pack(">HL", INITIAL_WINDOW_SIZE, 0))
        body = grpc_message(repeat_request(np.zeros(1024, np.int32), 3000))
        stalled.send(frame(HEADERS, 0x4, 1, request_headers(STREAM_INFER)))
        stalled.send(b"".join(frame(DATA, 0, 1, body[i : i + 16384]) for i in range(0, len(body), 16384)))
        time.sleep(0.5)  # the graph's one instance takes the stalled request first
        started = time.monotonic()
        assert stream_repeat(proc.grpc_url, 3, timeout=20) == [0, 1, 2]
        assert time.monotonic() - started < 10  # served beside the stalled stream, not after it
    finally:
        stalled.close()
    started = time.monotonic()
    assert proc.stop() == 0
    assert time.monotonic() - started < 15  # nothing left running for the gone client
