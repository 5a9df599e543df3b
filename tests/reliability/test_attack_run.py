"""Two attacks from an outside run against ``flowserve serve`` (default flags and ``--workers 2``),
each with a good client answered promptly meanwhile, over HTTP and gRPC with tritonclient:

- a system shared-memory region whose object the client shrinks (``ftruncate``) after
  registering it: reading an input from it or writing an output into it touched a mapped page
  past the object's end, SIGBUS, and the process died (``Fatal Python error: Bus error``;
  Triton 2.51 dies too). Now: INVALID_ARGUMENT naming the region, the tensor, the span and the
  object's size now, and the server lives, also while the size flips under a stream of requests.
- one request of 20 million empty BYTES elements (76 MiB, within every other limit) held the
  event loop for about 15 s. Now: refused before any element is decoded (the per-request bound
  ``--max-bytes-elements-per-request``, naming model, tensor and flag), and BYTES decoding
  below the bound runs in a worker thread.

The server runs in a subprocess, so a crash is a failed test, not a dead pytest.
"""

from __future__ import annotations

import functools
import http.client
import itertools
import json
import os
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, start_server
from tests.reliability.goodclient import PROTOCOLS, ROW, Prober, connect, good_inputs

pytestmark = pytest.mark.slow

CRASHED = ("Fatal Python error", "Bus error", "died", "killed by signal")


@pytest.fixture(scope="module", params=["default", "workers"])
def served(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """``flowserve serve`` with default flags (shared memory is on by default), or with
    ``--workers 2``; only the models these tests use are loaded."""
    workers = ("--workers", "2") if request.param == "workers" else ()
    server = start_server(
        *workers, "--model-control-mode=explicit", "--load-model=simple", "--load-model=identity_string",
        timeout=180.0,
    )  # fmt: skip
    try:
        yield server
    finally:
        assert server.stop(60.0) == 0, server.log()[-4000:]


def assert_alive(served: ServerProcess, protocol: str) -> None:
    """The server (every worker) still answers, and nothing crashed on the way."""
    assert served.process.poll() is None, served.log()[-4000:]
    client = connect(served, protocol)
    try:
        for _ in range(4):  # new connections: with --workers 2, most likely both workers
            result = client.infer("simple", good_inputs(PROTOCOLS[protocol]))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ROW - ROW)
    finally:
        client.close()
    log = served.log()
    assert not any(word in log for word in CRASHED), log[-4000:]


def refused(call: Callable[[], object], protocol: str, code: str) -> str:
    """The message of the error ``call`` fails with, having checked its status."""
    with pytest.raises(InferenceServerException) as err:
        call()
    http_status = {"INVALID_ARGUMENT": "400", "RESOURCE_EXHAUSTED": "413"}[code]
    assert err.value.status() == (http_status if protocol == "http" else f"StatusCode.{code}"), err.value
    return str(err.value.message())


# ------------------------------------------------------------------ item 4: a truncated region


class Region:
    """A client's system shared-memory region (tritonclient.utils.shared_memory), registered
    with the server, that the client can shrink or grow under it."""

    def __init__(self, client: Any, byte_size: int) -> None:
        self.name = f"trunc-{uuid.uuid4().hex[:12]}"
        self.key = self.name
        self.byte_size = byte_size
        self.handle = shm.create_shared_memory_region(self.name, f"/{self.key}", byte_size)
        self.client = client
        client.register_system_shared_memory(self.name, f"/{self.key}", byte_size)

    def resize(self, size: int) -> None:
        fd = os.open(f"/dev/shm/{self.key}", os.O_RDWR)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.client.unregister_system_shared_memory(self.name)
        shm.destroy_shared_memory_region(self.handle)


@pytest.fixture(params=list(PROTOCOLS))
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def client(served: ServerProcess, protocol: str) -> Iterator[Any]:
    c = connect(served, protocol)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def region(client: Any) -> Iterator[Region]:
    r = Region(client, 2 * ROW.nbytes)
    try:
        yield r
    finally:
        r.close()


def shm_inputs(module: ModuleType, region: Region) -> list[Any]:
    """INPUT0 and INPUT1 read from ``region`` (at offsets 0 and 64)."""
    inputs = []
    for i, name in enumerate(("INPUT0", "INPUT1")):
        tensor = module.InferInput(name, [1, 16], "INT32")
        tensor.set_shared_memory(region.name, ROW.nbytes, offset=i * ROW.nbytes)
        inputs.append(tensor)
    return inputs


def shm_outputs(module: ModuleType, region: Region) -> list[Any]:
    """OUTPUT0 and OUTPUT1 written into ``region`` (at offsets 0 and 64)."""
    outputs = []
    for i, name in enumerate(("OUTPUT0", "OUTPUT1")):
        out = module.InferRequestedOutput(name)
        out.set_shared_memory(region.name, ROW.nbytes, offset=i * ROW.nbytes)
        outputs.append(out)
    return outputs


@pytest.mark.parametrize("direction", ["input", "output"])
@pytest.mark.parametrize("size", [0, 100])
def test_a_truncated_region_is_a_clear_error_not_a_crash(
    served: ServerProcess, protocol: str, client: Any, region: Region, direction: str, size: int
) -> None:
    """Shrunk to nothing, or to 100 bytes (inside the first page, where a mapping would read
    zeros past the end rather than fault): the second tensor's span (bytes 64 to 128) is past
    the end either way, and the answer says so."""
    module = PROTOCOLS[protocol]
    shm.set_shared_memory_region(region.handle, [ROW, ROW])
    region.resize(size)

    def attack(c: Any) -> object:
        if direction == "input":
            return c.infer("simple", shm_inputs(module, region))
        return c.infer("simple", good_inputs(module), outputs=shm_outputs(module, region))

    with Prober(served, protocol):
        for _ in range(4):  # a new connection each time: with --workers 2, most likely both workers
            attacker = connect(served, protocol)
            try:
                message = refused(functools.partial(attack, attacker), protocol, "INVALID_ARGUMENT")
            finally:
                attacker.close()
            tensor = "INPUT0" if size == 0 else "INPUT1"
            tensor = tensor if direction == "input" else tensor.replace("INPUT", "OUTPUT")
            assert f"tensor '{tensor}'" in message and f"region '{region.name}'" in message, message
            assert f"is {size} bytes now" in message and "byte_size 64" in message, message
    assert_alive(served, protocol)
    region.resize(region.byte_size)  # grown again: the region works as before
    shm.set_shared_memory_region(region.handle, [ROW, 2 * ROW])
    result = client.infer("simple", shm_inputs(module, region))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 3 * ROW)


def test_a_region_whose_size_flips_under_requests_never_crashes(
    served: ServerProcess, protocol: str, client: Any, region: Region
) -> None:
    """The race a size check alone leaves open: the object shrinks between the check and the
    copy. A thread flips the size as fast as it can while requests read inputs from the region
    and write outputs into it: each is answered (with whatever the region held) or refused with
    a clear INVALID_ARGUMENT, and the server lives."""
    module = PROTOCOLS[protocol]
    out = Region(client, 2 * ROW.nbytes)
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            for r in (region, out):
                r.resize(0)
                r.resize(r.byte_size)

    flipper = threading.Thread(target=flip, daemon=True)
    answers = errors = 0
    try:
        with Prober(served, protocol):
            flipper.start()
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                try:
                    client.infer("simple", shm_inputs(module, region), outputs=shm_outputs(module, out))
                    answers += 1
                except InferenceServerException as exc:
                    assert "INVALID_ARGUMENT" in str(exc.status()) or exc.status() == "400", exc
                    assert "past its end" in str(exc.message()), exc
                    errors += 1
    finally:
        stop.set()
        flipper.join(10)
        out.close()
    assert answers + errors > 10, (answers, errors)
    assert_alive(served, protocol)


# ------------------------------------------------------------------ item 7: many BYTES elements

ATTACK_ELEMENTS = 20_000_000  # empty BYTES elements: 76 MiB of length prefixes
LIMIT_FLAG = "--max-bytes-elements-per-request"
DEFAULT_LIMIT = 4 * 1024 * 1024


def bytes_header(count: int, blob: int) -> bytes:
    doc = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "BYTES",
                "shape": [1, count],
                "parameters": {"binary_data_size": blob},
            }
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    return json.dumps(doc).encode()


def post_infer(
    served: ServerProcess, body: bytes, header_length: int | None
) -> tuple[int, dict[str, str], bytes]:
    """identity_string over a fresh HTTP connection: (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", served.http_port, timeout=120)
    headers = {"Content-Type": "application/octet-stream"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    try:
        conn.request("POST", "/v2/models/identity_string/infer", body=body, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def grpc_stub(served: ServerProcess) -> tuple[grpc.Channel, Any]:
    options = [("grpc.max_send_message_length", 1 << 30), ("grpc.max_receive_message_length", 1 << 30)]
    channel = grpc.insecure_channel(served.grpc_url, options=options)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def grpc_bytes_request(count: int, raw: bytes | None) -> Any:
    """identity_string with ``count`` BYTES elements: ``raw`` as raw_input_contents, or (None)
    that many empty elements as typed bytes_contents."""
    msg = service_pb2.ModelInferRequest(model_name="identity_string")
    tensor = msg.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, count])
    if raw is None:
        tensor.contents.bytes_contents.extend(itertools.repeat(b"", count))
    else:
        msg.raw_input_contents.append(raw)
    return msg


def assert_names_the_limit(message: str, count: int | None) -> None:
    """The refusal names model, tensor, the limit and its flag; ``count`` None: typed contents,
    refused from a count of the message's fields before it was parsed (fields.py)."""
    if count is None:
        assert "model 'identity_string', tensor 'INPUT0'" in message, message
        assert f"more than {DEFAULT_LIMIT + (1 << 16)} protobuf fields" in message, message
    else:
        assert "model 'identity_string', input 'INPUT0'" in message, message
        assert f"holds {count} BYTES elements" in message, message
    assert f"limit of {DEFAULT_LIMIT} BYTES elements per request" in message or (
        f"limit of {DEFAULT_LIMIT} per request" in message
    ), message
    assert f"({LIMIT_FLAG})" in message, message


@pytest.mark.parametrize("encoding", ["binary", "json"])
def test_http_a_request_of_millions_of_bytes_elements_is_refused_quickly(
    served: ServerProcess, encoding: str
) -> None:
    """20 million empty elements in a binary body (76 MiB); 5 million in a JSON one (its limit
    is 32 MiB): 413 naming model, input and flag, and a good client is answered meanwhile."""
    if encoding == "binary":
        head = bytes_header(ATTACK_ELEMENTS, 4 * ATTACK_ELEMENTS)
        body, length, count = head + bytes(4 * ATTACK_ELEMENTS), len(head), ATTACK_ELEMENTS
    else:
        count = 5_000_000
        data = "[" + ",".join(itertools.repeat('""', count)) + "]"
        body = f'{{"inputs":[{{"name":"INPUT0","datatype":"BYTES","shape":[1,{count}],"data":{data}}}]}}'.encode()
        length = None
    with Prober(served, "http"):
        started = time.monotonic()
        status, _, answer = post_infer(served, body, length)
        took = time.monotonic() - started
    assert status == 413, answer[:300]
    assert_names_the_limit(json.loads(answer)["error"], count)
    assert took < 30, took  # the body's transfer and (JSON) parse, no decoding
    assert_alive(served, "http")


@pytest.mark.parametrize("contents", ["raw", "typed"])
def test_grpc_a_request_of_millions_of_bytes_elements_is_refused_quickly(
    served: ServerProcess, contents: str
) -> None:
    """20 million empty elements as raw_input_contents (76 MiB) or as typed bytes_contents
    (38 MiB, whose parse alone held the GIL for 0.7 s and took 700 MB: refused from a count of
    its fields, in a thread, before it is parsed): RESOURCE_EXHAUSTED naming model, input and
    flag; a good client is answered meanwhile."""
    msg = grpc_bytes_request(ATTACK_ELEMENTS, bytes(4 * ATTACK_ELEMENTS) if contents == "raw" else None)
    channel, stub = grpc_stub(served)
    try:
        with Prober(served, "grpc"), pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(msg, timeout=120)
    finally:
        channel.close()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
    assert_names_the_limit(str(err.value.details()), ATTACK_ELEMENTS if contents == "raw" else None)
    assert_alive(served, "grpc")


def small_elements(count: int) -> bytes:
    """``count`` BYTES elements of 0 to 3 bytes, length-prefixed (not all of one length, so they
    are decoded one step each, not cut out by numpy at once)."""
    lengths = np.arange(count, dtype=np.uint32) % 4
    body = bytearray()
    for length in range(4):
        body += struct.pack("<I", length) + b"abc"[:length]
    cycle = bytes(body)  # the four lengths, in order, repeated
    assert count % 4 == 0 and len(lengths) == count
    return cycle * (count // 4)


BELOW = 2_000_000  # elements under the bound: decoded and encoded in a worker thread


def test_http_millions_of_bytes_elements_under_the_bound_are_decoded_off_the_loop(
    served: ServerProcess,
) -> None:
    """Under the bound, millions of elements are decoded (and the echo encoded) in a worker
    thread: the answer is exact and a good client is answered promptly meanwhile."""
    raw = small_elements(BELOW)
    head = bytes_header(BELOW, len(raw))
    with Prober(served, "http"):
        status, headers, answer = post_infer(served, head + raw, len(head))
    assert status == 200, answer[:300]
    length = int(headers["Inference-Header-Content-Length"])
    assert json.loads(answer[:length])["outputs"][0]["shape"] == [1, BELOW]
    assert answer[length:] == raw
    assert_alive(served, "http")


def test_grpc_millions_of_bytes_elements_under_the_bound_are_decoded_off_the_loop(
    served: ServerProcess,
) -> None:
    raw = small_elements(BELOW)
    channel, stub = grpc_stub(served)
    try:
        with Prober(served, "grpc"):
            response = stub.ModelInfer(grpc_bytes_request(BELOW, raw), timeout=120)
    finally:
        channel.close()
    assert list(response.outputs[0].shape) == [1, BELOW]
    assert response.raw_output_contents[0] == raw
    assert_alive(served, "grpc")
