"""System shared memory: register/status/unregister, inputs read from and outputs written to
regions (tritonclient.utils.shared_memory), for a model, an ensemble and a YAML graph."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

pytestmark = pytest.mark.slow

CASES: dict[str, tuple[tuple[str, str], Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]]] = {
    "simple": (("INPUT0", "INPUT1"), lambda a, b: {"OUTPUT0": a + b, "OUTPUT1": a - b}),
    "simple_ensemble": (("INPUT0", "INPUT1"), lambda a, b: {"OUTPUT0": 2 * a, "OUTPUT1": 2 * b}),
    "fanout": (("a", "b"), lambda a, b: {"total": 5 * a - b, "sum": a + b}),
}


class Regions:
    """Creates client regions, registers them, and removes everything afterwards."""

    def __init__(self, client: httpclient.InferenceServerClient) -> None:
        self.client = client
        self.handles: list[tuple[str, Any]] = []

    def create(self, byte_size: int, register: bool = True) -> tuple[str, Any]:
        name = f"http-{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(name, f"/{name}", byte_size)
        self.handles.append((name, handle))
        if register:
            self.client.register_system_shared_memory(name, f"/{name}", byte_size)
        return name, handle

    def close(self) -> None:
        registered = {r["name"] for r in self.client.get_system_shared_memory_status()}
        for name, handle in self.handles:
            if name in registered:
                self.client.unregister_system_shared_memory(name)
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions(client: httpclient.InferenceServerClient) -> Iterator[Regions]:
    r = Regions(client)
    try:
        yield r
    finally:
        r.close()


@pytest.mark.parametrize("model", list(CASES))
def test_inputs_and_outputs_in_shared_memory(
    client: httpclient.InferenceServerClient, regions: Regions, model: str
) -> None:
    names, expect = CASES[model]
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 7, dtype=np.int32)
    # both inputs in one region, the second at an offset
    in_name, in_handle = regions.create(a.nbytes * 2)
    shm.set_shared_memory_region(in_handle, [a])
    shm.set_shared_memory_region(in_handle, [b], offset=a.nbytes)
    expected = expect(a, b)
    out_regions = {n: regions.create(v.nbytes) for n, v in expected.items()}
    inputs = []
    for i, (name, value) in enumerate(zip(names, (a, b), strict=True)):
        t = httpclient.InferInput(name, [2, 16], "INT32")
        t.set_shared_memory(in_name, value.nbytes, offset=i * a.nbytes)
        inputs.append(t)
    outputs = []
    for name, (region, _) in out_regions.items():
        o = httpclient.InferRequestedOutput(name, binary_data=False)
        o.set_shared_memory(region, expected[name].nbytes)
        outputs.append(o)
    result = client.infer(model, inputs, outputs=outputs)
    for name, want in expected.items():
        out = result.get_output(name)
        assert out["shape"] == [2, 16] and out["datatype"] == "INT32"
        assert "data" not in out
        got = shm.get_contents_as_numpy(out_regions[name][1], np.int32, [2, 16])
        np.testing.assert_array_equal(got, want)


def test_bytes_through_shared_memory(client: httpclient.InferenceServerClient, regions: Regions) -> None:
    data = np.array([[b"one", b"", "dr\u00e9i".encode()]], dtype=np.object_)
    serialized = serialize_byte_tensor(data)  # one object holding the length-prefixed bytes
    size = len(serialized.item())
    in_name, in_handle = regions.create(size)
    shm.set_shared_memory_region(in_handle, [serialized])
    out_name, out_handle = regions.create(size + 16)
    tensor = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
    tensor.set_shared_memory(in_name, size)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    output.set_shared_memory(out_name, size + 16)
    result = client.infer("identity_string", [tensor], outputs=[output])
    assert result.get_output("OUTPUT0")["shape"] == [1, 3]
    got = shm.get_contents_as_numpy(out_handle, np.object_, [1, 3])
    assert got.tolist() == data.tolist()


def test_status_and_unregister(client: httpclient.InferenceServerClient, regions: Regions) -> None:
    first, _ = regions.create(64)
    second, _ = regions.create(128)
    status = {r["name"]: r for r in client.get_system_shared_memory_status()}
    assert status[first] == {"name": first, "key": f"/{first}", "offset": 0, "byte_size": 64}
    assert status[second]["byte_size"] == 128
    assert client.get_system_shared_memory_status(second) == [status[second]]
    client.unregister_system_shared_memory(first)
    names = {r["name"] for r in client.get_system_shared_memory_status()}
    assert first not in names and second in names
    with pytest.raises(InferenceServerException) as err:
        client.get_system_shared_memory_status(first)
    assert err.value.status() == "404" and first in err.value.message()
    client.unregister_system_shared_memory()  # all of them
    assert client.get_system_shared_memory_status() == []


def test_register_errors(client: httpclient.InferenceServerClient, regions: Regions) -> None:
    name, _ = regions.create(64)
    with pytest.raises(InferenceServerException) as err:
        client.register_system_shared_memory(name, f"/{name}", 64)
    assert err.value.status() == "400" and "already registered" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.register_system_shared_memory("other", f"/{name}", 65)
    assert err.value.status() == "400" and "exceeds" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.register_system_shared_memory("missing", "/no-such-key-for-flowserve", 8)
    assert err.value.status() == "400" and "no-such-key-for-flowserve" in err.value.message()


def test_unregistered_and_too_small_regions(
    client: httpclient.InferenceServerClient, regions: Regions
) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    small, _ = regions.create(32)
    big, big_handle = regions.create(64)
    shm.set_shared_memory_region(big_handle, [a])

    def inputs(region0: str, size0: int) -> list[httpclient.InferInput]:
        t0 = httpclient.InferInput("INPUT0", [1, 16], "INT32")
        t0.set_shared_memory(region0, size0)
        t1 = httpclient.InferInput("INPUT1", [1, 16], "INT32")
        t1.set_data_from_numpy(a)
        return [t0, t1]

    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", inputs("never-registered", 64))
    assert err.value.status() == "404"
    assert "never-registered" in err.value.message() and "INPUT0" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", inputs(small, 64))
    assert err.value.status() == "400"
    assert small in err.value.message() and "INPUT0" in err.value.message()
    # the region is big enough but the byte size given does not match the shape
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", inputs(big, 32))
    assert err.value.status() == "400" and "INPUT0" in err.value.message()
    output = httpclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory(small, 32)
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", inputs(big, 64), outputs=[output])
    assert err.value.status() == "400"
    assert "OUTPUT0" in err.value.message() and small in err.value.message()
    # and with the right sizes it works
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
    output.set_shared_memory(big, 64)
    client.infer("simple", inputs(big, 64), outputs=[output])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(big_handle, np.int32, [1, 16]), 2 * a)


def test_cuda_shared_memory_unsupported(client: httpclient.InferenceServerClient) -> None:
    # registering is UNSUPPORTED; there are never regions to list or unregister, so clients
    # that clean up every kind of region (perf_analyzer's UnregisterAllSharedMemory) succeed
    with pytest.raises(InferenceServerException) as err:
        client.register_cuda_shared_memory("gpu", b"aGFuZGxl", 0, 64)
    assert err.value.status() == "501"
    assert "CUDA shared memory is not supported" in err.value.message()
    assert client.get_cuda_shared_memory_status() == []
    with pytest.raises(InferenceServerException) as err:
        client.get_cuda_shared_memory_status("gpu")
    assert err.value.status() == "404" and "'gpu'" in err.value.message()
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("gpu")


async def test_aio_shared_memory(server: Any) -> None:
    name = f"http-aio-{uuid.uuid4().hex[:8]}"
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    handle = shm.create_shared_memory_region(name, f"/{name}", a.nbytes * 2)
    try:
        shm.set_shared_memory_region(handle, [a, a])
        async with aiohttpclient.InferenceServerClient(server.http_url) as client:
            await client.register_system_shared_memory(name, f"/{name}", a.nbytes * 2)
            try:
                status = await client.get_system_shared_memory_status(name)
                assert status[0]["byte_size"] == a.nbytes * 2
                inputs = []
                for i, input_name in enumerate(("INPUT0", "INPUT1")):
                    t = aiohttpclient.InferInput(input_name, [1, 16], "INT32")
                    t.set_shared_memory(name, a.nbytes, offset=i * a.nbytes)
                    inputs.append(t)
                result = await client.infer("simple", inputs)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
            finally:
                await client.unregister_system_shared_memory(name)
    finally:
        shm.destroy_shared_memory_region(handle)


def test_shared_memory_disabled(server_factory: Any) -> None:
    plain = server_factory.start("--allow-shm=false", listeners="http")
    client = httpclient.InferenceServerClient(plain.http_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.get_system_shared_memory_status()
        assert err.value.status() == "501" and "--allow-shm" in err.value.message()
    finally:
        client.close()
