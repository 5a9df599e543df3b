"""What the official tritonclient examples check (the client repository's src/python/examples:
simple_*_infer_client, *_health_metadata, *_model_control, *_sequence_*, *_string_*,
grpc_explicit_*_content_client, simple_grpc_custom_repeat...), asserted with tritonclient against
a real ``flowserve serve``: the bundled repository plus the example models of tests/models
(Triton's docs/examples/model_repository models as Python models), and, for model control, an
explicit-mode server over a repository of its own.

The scripts themselves are run from outside (they are not part of this repository); each
behaviour they test is asserted here.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import BUNDLED_GRAPHS, BUNDLED_REPOSITORY, TEST_MODELS, ServerProcess, start_server

EXAMPLE_MODELS = (
    "simple_string",
    "simple_identity",
    "simple_int8",
    "simple_sequence",
    "simple_dyna_sequence",
    "simple_string_dyna_sequence",
    "repeat_int32",
)

# A Python model whose config declares batched dims [1] (so [batch, 1]) and which answers [1]:
# Triton serves what the model returned, and so does flowserve, with a warning.
SHORT_OUTPUT_CONFIG = """
name: "short_output"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
SHORT_OUTPUT_PY = b"""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.reshape(-1)[:1] + 1)]))
        return out
"""

# Triton's "simple" add/sub whose tensors come from auto_complete_config: a config override that
# names none (simple_*_model_control.py loads it with '{"max_batch_size":"16"}') still serves.
ADD_SUB_PY = b"""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        have = config.as_dict()
        names = {t["name"] for t in have.get("input", []) + have.get("output", [])}
        for name in ("INPUT0", "INPUT1"):
            if name not in names:
                config.add_input({"name": name, "data_type": "TYPE_INT32", "dims": [16]})
        for name in ("OUTPUT0", "OUTPUT1"):
            if name not in names:
                config.add_output({"name": name, "data_type": "TYPE_INT32", "dims": [16]})
        return config

    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return out
"""
ADD_SUB_CONFIG = '{"backend": "python", "max_batch_size": 8}'


@pytest.fixture(scope="module")
def examples_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("examples")
    for name in EXAMPLE_MODELS:
        (root / name).symlink_to(TEST_MODELS / name, target_is_directory=True)
    (root / "short_output" / "1").mkdir(parents=True)
    (root / "short_output" / "config.pbtxt").write_text(SHORT_OUTPUT_CONFIG)
    (root / "short_output" / "1" / "model.py").write_bytes(SHORT_OUTPUT_PY)
    return root


@pytest.fixture(scope="module")
def served(examples_repo: Path) -> Iterator[ServerProcess]:
    """The README's default server (every bundled model and graph) plus the example models."""
    proc = start_server(
        "--allow-shm", repositories=(BUNDLED_REPOSITORY, examples_repo), graphs=(BUNDLED_GRAPHS,)
    )
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def http(served: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(served.http_url)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def grpcc(served: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(served.grpc_url)
    try:
        yield c
    finally:
        c.close()


def _message(call: Any) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.message())


def _simple_inputs(module: Any) -> list[Any]:
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(np.ones_like(data))
    return inputs


# ---------------------------------------------------------------- health and metadata


def test_server_metadata_names_the_protocol(http: Any, grpcc: Any) -> None:
    """simple_*_health_metadata.py: ``metadata.name == "triton"``; flowserve says who it is in
    the extensions, and its own version."""
    meta = http.get_server_metadata()
    assert meta["name"] == "triton" and meta["version"]
    assert "flowserve" in meta["extensions"] and "model_repository" in meta["extensions"]
    gmeta = grpcc.get_server_metadata()
    assert gmeta.name == "triton" and gmeta.version == meta["version"]
    assert "flowserve" in gmeta.extensions
    assert http.is_server_ready() and grpcc.is_server_ready()
    assert grpcc.get_model_metadata("simple", headers={"test": "1", "dummy": "2"}).name == "simple"
    assert grpcc.get_model_config("simple").config.name == "simple"


def test_unknown_model_and_version_use_tritons_words(http: Any, grpcc: Any) -> None:
    """The examples test ``"Request for unknown model" in ex.message()`` (metadata and infer)."""
    unknown = "Request for unknown model: 'wrong_model_name' is not found"
    assert unknown in _message(lambda: http.get_model_metadata("wrong_model_name"))
    assert unknown in _message(lambda: grpcc.get_model_metadata("wrong_model_name"))
    assert unknown in _message(lambda: http.infer("wrong_model_name", _simple_inputs(httpclient)))
    assert unknown in _message(lambda: grpcc.infer("wrong_model_name", _simple_inputs(grpcclient)))
    version = "Request for unknown model: 'simple' version 7 is not found"
    assert version in _message(lambda: http.get_model_metadata("simple", "7"))
    assert version in _message(lambda: grpcc.infer("simple", _simple_inputs(grpcclient), model_version="7"))


# ---------------------------------------------------------------- the example models


def test_string_and_int8_examples(http: Any, grpcc: Any) -> None:
    """simple_*_string_infer_client.py and grpc_explicit_*_content_client.py."""
    in0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    in1 = np.ones((1, 16), dtype=np.int32)
    strings = []
    for values in (in0, in1):
        t = httpclient.InferInput(f"INPUT{len(strings)}", [1, 16], "BYTES")
        t.set_data_from_numpy(
            np.array([str(v).encode() for v in values.flatten()], dtype=np.object_).reshape(1, 16)
        )
        strings.append(t)
    result = http.infer("simple_string", strings)
    assert [int(v) for v in result.as_numpy("OUTPUT0").flatten()] == list((in0 + in1).flatten())
    assert [int(v) for v in result.as_numpy("OUTPUT1").flatten()] == list((in0 - in1).flatten())

    identity = grpcclient.InferInput("INPUT0", [1, 16], "BYTES")
    words = np.array([str(i).encode() for i in range(16)], dtype=np.object_).reshape(1, 16)
    identity.set_data_from_numpy(words)
    np.testing.assert_array_equal(grpcc.infer("simple_identity", [identity]).as_numpy("OUTPUT0"), words)

    int8 = []
    for i, values in enumerate((in0.astype(np.int8), in1.astype(np.int8))):
        t = grpcclient.InferInput(f"INPUT{i}", [1, 16], "INT8")
        t.set_data_from_numpy(values)
        int8.append(t)
    result = grpcc.infer("simple_int8", int8)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), (in0 + in1).astype(np.int8))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), (in0 - in1).astype(np.int8))


def _sequence(client: Any, model: str, sequence_id: int | str, values: list[int]) -> list[int]:
    out = []
    for i, value in enumerate(values):
        t = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        t.set_data_from_numpy(np.full([1, 1], value, dtype=np.int32))
        result = client.infer(
            model, [t], sequence_id=sequence_id, sequence_start=i == 0, sequence_end=i == len(values) - 1
        )
        out.append(int(result.as_numpy("OUTPUT")[0][0]))
    return out


def test_sequence_examples(grpcc: Any) -> None:
    """simple_*_sequence_*_client.py, with and without -d (dyna): the expected values are the
    scripts' own."""
    values = [11, 7, 5, 3, 2, 0, 1]
    assert _sequence(grpcc, "simple_sequence", 1000, [0, *values]) == [1, *values]
    assert _sequence(grpcc, "simple_sequence", "a-uuid-like-id", [20, *(-v for v in values)]) == [
        21,
        *(-v for v in values),
    ]
    dyna = _sequence(grpcc, "simple_dyna_sequence", 1001, [100, *(-v for v in values)])
    assert dyna == [101, *(-v for v in values[:-1]), -values[-1] + 1001]
    string = _sequence(grpcc, "simple_string_dyna_sequence", "1002", [20, *(-v for v in values)])
    expected = [20]
    for v in values:
        expected.append(expected[-1] - v)
    expected[-1] += 1002
    assert string == expected


def test_custom_repeat_example(served: ServerProcess) -> None:
    """simple_grpc_custom_repeat.py: repeat_int32 streams one response per element of IN."""
    responses: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(served.grpc_url) as client:
        client.start_stream(callback=lambda result, error: responses.put(error or result))
        inputs = [
            grpcclient.InferInput("IN", [4], "INT32"),
            grpcclient.InferInput("DELAY", [4], "UINT32"),
            grpcclient.InferInput("WAIT", [1], "UINT32"),
        ]
        inputs[0].set_data_from_numpy(np.arange(100, 104, dtype=np.int32))
        inputs[1].set_data_from_numpy(np.full([4], 10, dtype=np.uint32))
        inputs[2].set_data_from_numpy(np.array([10], dtype=np.uint32))
        client.async_stream_infer("repeat_int32", inputs, outputs=[grpcclient.InferRequestedOutput("OUT")])
        got = [responses.get(timeout=20) for _ in range(4)]
        client.stop_stream()
    assert [int(r.as_numpy("OUT")[0]) for r in got] == [100, 101, 102, 103]


def test_python_output_shape_is_served_as_returned(http: Any, served: ServerProcess) -> None:
    """A Python model answering [1] where its config says [batch, 1] is served (as Triton does),
    with one warning in the server log, not refused."""
    for _ in range(2):
        t = httpclient.InferInput("INPUT0", [1, 1], "INT32")
        t.set_data_from_numpy(np.array([[41]], dtype=np.int32))
        out = http.infer("short_output", [t]).as_numpy("OUTPUT0")
        assert out.shape == (1,) and int(out[0]) == 42
    warnings = [line for line in served.log().splitlines() if "short_output" in line and "shape" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], warnings


# ---------------------------------------------------------------- model control (explicit mode)


@pytest.fixture
def explicit(tmp_path: Path) -> Iterator[tuple[ServerProcess, Path]]:
    repo = tmp_path / "repo"
    (repo / "simple" / "1").mkdir(parents=True)
    (repo / "simple" / "config.pbtxt").write_text('name: "simple"\nbackend: "python"\nmax_batch_size: 8\n')
    (repo / "simple" / "1" / "model.py").write_bytes(ADD_SUB_PY)
    (repo / "simple_identity").symlink_to(TEST_MODELS / "simple_identity", target_is_directory=True)
    proc = start_server("--model-control-mode=explicit", repositories=(repo,), graphs=())
    try:
        yield proc, repo
    finally:
        proc.stop()


def test_index_lists_what_is_on_disk(explicit: tuple[ServerProcess, Path]) -> None:
    """Never-loaded models are listed by name only (Triton's index), a directory added after
    start is listed, and a loaded then unloaded one says so."""
    proc, repo = explicit
    http = httpclient.InferenceServerClient(proc.http_url)
    grpcc = grpcclient.InferenceServerClient(proc.grpc_url)
    try:
        assert http.get_model_repository_index() == [{"name": "simple"}, {"name": "simple_identity"}]
        models = grpcc.get_model_repository_index().models
        assert [(m.name, m.version, m.state) for m in models] == [
            ("simple", "", ""),
            ("simple_identity", "", ""),
        ]
        (repo / "added_later").symlink_to(TEST_MODELS / "simple_identity", target_is_directory=True)
        assert {"name": "added_later"} in http.get_model_repository_index()
        http.load_model("simple")
        assert http.is_model_ready("simple")
        http.unload_model("simple_identity")  # never loaded: nothing to do, as Triton
        http.unload_model("simple")
        index = {m["name"]: m for m in http.get_model_repository_index()}
        assert index["simple"] == {
            "name": "simple",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "unloaded",
        }
        message = _message(lambda: http.infer("simple", _simple_inputs(httpclient)))
        assert "Request for unknown model: 'simple' has no available versions" in message
        assert "Request for unknown model: 'simple_identity' is not found" in _message(
            lambda: grpcc.get_model_metadata("simple_identity")
        )
    finally:
        http.close()
        grpcc.close()


def test_model_control_example(explicit: tuple[ServerProcess, Path]) -> None:
    """simple_*_model_control.py: an invalid override fails with "failed to load" (and the
    server logs "Invalid config override"); an override naming no tensors is completed; a file
    path with a leading '/' is inside the model directory (Triton's ``file:/1/model.py``); a
    file name the file system refuses is INTERNAL "failed to poll from model repository"."""
    proc, _ = explicit
    http = httpclient.InferenceServerClient(proc.http_url)
    grpcc = grpcclient.InferenceServerClient(proc.grpc_url)
    try:
        http.load_model("simple")
        bad = '"parameters": {"config": {{"max_batch_size": "16"}}}'
        assert "failed to load" in _message(lambda: http.load_model("simple", config=bad))
        assert "failed to load" in _message(lambda: grpcc.load_model("simple", config=bad))
        assert "Invalid config override" in proc.log()
        http.load_model("simple", config='{"max_batch_size":"16"}')
        assert http.get_model_config("simple")["max_batch_size"] == 16
        assert grpcc.get_model_config("simple").config.max_batch_size == 16
        result = http.infer("simple", _simple_inputs(httpclient))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(16).reshape(1, 16) + 1)

        grpcc.load_model("slash", config=ADD_SUB_CONFIG, files={"file:/1/model.py": ADD_SUB_PY})
        assert grpcc.is_model_ready("slash")
        assert grpcc.get_model_config("slash").config.max_batch_size == 8

        with pytest.raises(InferenceServerException) as info:
            grpcc.load_model("simple", config="{}", files={"file:" + "A" * 256: b"a"})
        assert info.value.status() == "StatusCode.INTERNAL"
        assert "failed to poll from model repository" in str(info.value.message())
        assert grpcc.is_server_live() and grpcc.is_model_ready("simple")
        for path in ("../x.py", "/../x.py", "1/../../x.py"):
            with pytest.raises(InferenceServerException) as info:
                grpcc.load_model("evil", config=ADD_SUB_CONFIG, files={f"file:{path}": b""})
            assert "must stay inside the model directory" in str(info.value.message())

        http.unload_model("simple")
        assert not http.is_model_ready("simple")
        assert "failed to load" in _message(lambda: http.load_model("wrong_model_name"))
    finally:
        http.close()
        grpcc.close()


def test_override_file_leading_slash_stays_in_the_model_directory(tmp_path: Path) -> None:
    from flowserve.spec.repository import write_override_files

    target = tmp_path / "m"
    target.mkdir()
    write_override_files("m", target, {"/1/model.py": b"ok", "//config.pbtxt": b"c"})
    assert (target / "1" / "model.py").read_bytes() == b"ok"
    assert (target / "config.pbtxt").read_bytes() == b"c"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
