"""Triton's triton_python_backend_utils, whole: the names model.py files use, custom metrics,
Logger, BLS streams/timeouts/parameters, the response sender's contract, args and sys.path as
Triton's stub sets them, TritonError codes, DLPack, outputs of another dtype than declared."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from flowserve.core.errors import (
    AlreadyExists,
    Cancelled,
    FlowserveError,
    InternalError,
    InvalidArgument,
    NotFound,
    Unavailable,
    Unsupported,
)
from flowserve.core.types import InferRequest
from flowserve.nodes.backends import pb_utils
from flowserve.observability.metrics import _custom, exposition
from tests.conftest import ServerProcess

TESTS = Path(__file__).resolve().parents[2] / "models"

PUBLIC = (
    "TritonError",
    "TritonModelException",
    "Tensor",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "ResponseIterator",
    "Logger",
    "LogLevel",
    "MetricFamily",
    "Metric",
    "MetricKind",
    "PreferredMemory",
    "InferenceTrace",
    "ModelConfig",
    "MemoryType",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_MEMORY_CPU_PINNED",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITON_STRING_TO_NUMPY",
    "serialize_byte_tensor",
    "deserialize_bytes_tensor",
    "get_input_tensor_by_name",
    "get_output_tensor_by_name",
    "get_input_config_by_name",
    "get_output_config_by_name",
    "using_decoupled_model_transaction_policy",
    "triton_to_numpy_type",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "load_model",
    "unload_model",
    "is_model_ready",
    "get_model_dir",
)


def test_every_public_name_of_triton_python_backend_utils() -> None:
    missing = [n for n in PUBLIC if not hasattr(pb_utils, n)]
    assert missing == []
    assert [pb_utils.Logger.INFO, pb_utils.Logger.WARNING, pb_utils.Logger.ERROR, pb_utils.Logger.VERBOSE]
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2
    assert pb_utils.numpy_to_triton_type(np.float32) == 11 and pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.using_decoupled_model_transaction_policy(
        {"model_transaction_policy": {"decoupled": True}}
    )
    assert not pb_utils.using_decoupled_model_transaction_policy({})
    data = np.array([b"ab", b"", b"xyz"], dtype=object)
    assert pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(data)).tolist() == data.tolist()
    assert pb_utils.get_input_config_by_name({"input": []}, "X") is None
    with pytest.raises(pb_utils.TritonModelException, match=r"PreferredMemory.*GPU"):
        pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU)
    pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
    with pytest.raises(TypeError, match="model_name"):
        pb_utils.InferenceRequest(inputs=[], requested_output_names=[])


def test_custom_metric_rules_and_exposition() -> None:
    counter = pb_utils.MetricFamily("t_counter", "a counter", pb_utils.MetricFamily.COUNTER)
    c = counter.Metric(labels={"a": "1"})
    c.increment(2)
    with pytest.raises(pb_utils.TritonModelException, match="increment"):
        c.increment(-1)
    with pytest.raises(pb_utils.TritonModelException, match="set"):
        c.set(3)
    with pytest.raises(pb_utils.TritonModelException, match="Unexpected buckets"):
        counter.Metric(buckets=[1.0])
    assert counter.Metric(labels={"a": "1"}).value() == 2  # same labels: the same series
    hist = pb_utils.MetricFamily("t_hist", "a histogram", pb_utils.MetricFamily.HISTOGRAM)
    with pytest.raises(pb_utils.TritonModelException, match="Missing required buckets"):
        hist.Metric()
    h = hist.Metric(labels={"b": "x"}, buckets=[1, 5])
    for v in (0.5, 3, 7):
        h.observe(v)
    with pytest.raises(pb_utils.TritonModelException, match="value"):
        h.value()
    text = exposition(_custom()).decode()
    assert '# TYPE t_counter counter\nt_counter{a="1"} 2' in text
    assert 't_hist_bucket{b="x",le="1"} 1' in text and 't_hist_bucket{b="x",le="5"} 2' in text
    assert 't_hist_bucket{b="x",le="+Inf"} 3' in text and 't_hist_count{b="x"} 3' in text
    del c, counter
    import gc

    gc.collect()
    assert "t_counter" not in exposition(_custom()).decode()  # gone with its last holder


@pytest.mark.parametrize(
    "dtype",
    [
        *("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32"),
        *("float64", "uint16", "uint32", "uint64", "complex64"),
    ],
)
def test_dlpack_round_trip_for_every_torch_dtype(dtype: str) -> None:
    torch = pytest.importorskip("torch")
    t_dtype = getattr(torch, dtype, None)
    if t_dtype is None:
        pytest.skip(f"torch has no {dtype}")
    try:
        t = (torch.arange(6) % 2).to(t_dtype).reshape(2, 3)
    except (RuntimeError, TypeError):
        pytest.skip(f"torch cannot make {dtype} here")
    if dtype == "complex64":
        with pytest.raises(FlowserveError):  # Triton has no complex datatype
            pb_utils.Tensor.from_dlpack("T", t).triton_dtype()
        return
    for source in (t, torch.utils.dlpack.to_dlpack(t)):
        tensor = pb_utils.Tensor.from_dlpack("T", source)
        assert tensor.shape() == [2, 3]
        back = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
        assert back.dtype == t_dtype and torch.equal(back, t)
        again = torch.from_dlpack(tensor)  # __dlpack__ / __dlpack_device__
        assert torch.equal(again, t)
    if dtype == "bfloat16":
        assert pb_utils.Tensor.from_dlpack("T", t).triton_dtype() == 14
    with pytest.raises(pb_utils.TritonModelException, match="BYTES"):
        pb_utils.Tensor("S", np.array([b"a"], dtype=object)).to_dlpack()


def test_from_dlpack_of_a_tensor_carries_the_new_name_and_shares_its_memory() -> None:
    source = pb_utils.Tensor("A", np.arange(3, dtype=np.float32))
    renamed = pb_utils.Tensor.from_dlpack("B", source)
    assert renamed.name() == "B" and source.name() == "A"
    assert np.shares_memory(renamed.as_numpy(), source.as_numpy())
    with pytest.raises(pb_utils.TritonModelException, match=r"'S'.*BYTES"):
        pb_utils.Tensor.from_dlpack("T", pb_utils.Tensor("S", np.array([b"a"], dtype=object)))
    torch = pytest.importorskip("torch")
    held = pb_utils.Tensor.from_dlpack("C", torch.arange(3))
    again = pb_utils.Tensor.from_dlpack("D", held)
    assert again.name() == "D" and held.name() == "C"
    assert again.as_numpy().tolist() == [0, 1, 2]


def test_bf16_has_no_numpy_form_as_in_triton() -> None:
    # Triton's qa identity_bf16 model expects as_numpy() on a BF16 tensor to raise this
    message = "tensor dtype is bf16 and cannot be converted to numpy"
    served = pb_utils.Tensor._of("IN", np.ones(2, dtype=ml_dtypes.bfloat16))  # as the server hands it
    with pytest.raises(pb_utils.TritonModelException) as caught:
        served.as_numpy()
    assert message in str(caught.value).lower() and "'IN'" in str(caught.value)
    renamed = pb_utils.Tensor.from_dlpack("OUT", served)  # the DLPack path works without torch
    assert renamed.triton_dtype() == 14 and renamed.shape() == [2]
    torch = pytest.importorskip("torch")
    back = torch.utils.dlpack.from_dlpack(served.to_dlpack())
    assert back.dtype == torch.bfloat16 and back.tolist() == [1.0, 1.0]
    made = pb_utils.Tensor.from_dlpack("T", torch.ones(2, dtype=torch.bfloat16))
    with pytest.raises(pb_utils.TritonModelException, match="BF16"):
        made.as_numpy()


async def test_model_sees_triton_args_path_argv_and_utils(bk, caplog) -> None:
    caplog.set_level(logging.INFO, logger="flowserve.python_model")
    async with bk.engine_for(TESTS) as engine:
        out = await engine.infer(
            "python_surface", {"X": np.ones(3, np.float32)}, parameters={"p": "v", "n": 3}
        )
        text = exposition(_custom()).decode()
    np.testing.assert_array_equal(out["Y"], np.full(3, 2, np.float32))  # the sibling module ran
    report = json.loads(out["REPORT"][0])
    args = report["args"]
    version_dir = TESTS / "python_surface" / "1"
    assert args["model_instance_name"] == "python_surface_0_0"
    assert args["model_name"] == "python_surface" and args["model_version"] == "1"
    assert args["model_repository"] == str(version_dir.parent)
    assert args["model_instance_kind"] == "CPU" and args["model_instance_device_id"] == "0"
    assert json.loads(args["model_config"])["name"] == "python_surface"
    # in-process (the API in an application): the application's own command line stays; the
    # server processes give models the stub's [""] (test_a_served_model_never_sees_the_command_line)
    assert report["argv"] == sys.argv and sys.argv != [""]
    assert report["model_module"] is True
    assert report["init_bls"] == "BLS is only supported during the 'execute' function."
    assert report["init_dir"] == report["dir"] == str(version_dir)
    assert report["decoupled"] is False
    assert report["ready"] is True and report["ready_missing"] is False
    assert report["parameters"] == {"p": "v", "n": 3}
    assert report["dtype"] == 11
    assert 'surface_requests{model="python_surface",version="1"} 1' in text
    assert 'surface_last{model="python_surface"} 3' in text
    assert 'surface_size_bucket{model="python_surface",le="4"} 1' in text
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "flowserve.python_model"]
    assert (logging.INFO, "surface info") in messages and (logging.WARNING, "surface warn") in messages
    assert all(r.filename == "model.py" for r in caplog.records if r.getMessage().startswith("surface"))


async def test_bls_exec_decoupled_streams_every_response(bk) -> None:
    async with bk.engine_for(TESTS) as engine:
        sync = await engine.infer("python_bls_stream", {"IN": np.array([4, 5, 6], np.int32)})
        asynchronous = await engine.infer(
            "python_bls_stream", {"IN": np.array([1, 2], np.int32)}, parameters={"async": True}
        )
    # three data responses, then the final one (empty: the model sent a bare final flag)
    assert (int(sync["SUM"][0]), int(sync["COUNT"][0])) == (15, 4)
    assert (int(asynchronous["SUM"][0]), int(asynchronous["COUNT"][0])) == (3, 3)


BLS_TIMEOUT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            timeout = int(r.get_input_tensor_by_name("T").as_numpy()[0])
            resp = pb_utils.InferenceRequest(
                model_name="slow", inputs=[pb_utils.Tensor("X", np.zeros(1, np.float32))],
                requested_output_names=["X"], timeout=timeout, parameters={"tag": "bls"},
            ).exec()
            msg = resp.error().message() if resp.has_error() else "ok:" + str(resp.output_tensors()[0].as_numpy()[0])
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("MSG", np.array([msg.encode()], dtype=object))
            ]))
        return out
"""
SLOW = """
import json, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.3)
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                "X", np.array([len(json.loads(r.parameters()).get("tag", ""))], np.float32))])
            for r in requests
        ]
"""


async def test_bls_timeout_is_enforced_and_parameters_reach_the_model(bk, tmp_path: Path) -> None:
    bk.write_model(
        tmp_path,
        "bls_timeout",
        'backend: "python"\ninput [ { name: "T" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        'output [ { name: "MSG" data_type: TYPE_STRING dims: [ 1 ] } ]\n',
        {"1/model.py": BLS_TIMEOUT.encode()},
    )
    bk.write_model(
        tmp_path,
        "slow",
        'backend: "python"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n',
        {"1/model.py": SLOW.encode()},
    )
    async with bk.engine_for(tmp_path) as engine:
        late = await engine.infer("bls_timeout", {"T": np.array([20_000], np.int64)})
        fine = await engine.infer("bls_timeout", {"T": np.array([0], np.int64)})
    assert b"timeout" in late["MSG"][0]
    assert fine["MSG"][0] == b"ok:3.0"  # parameters={"tag": "bls"} reached the called model


SENDER = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            n = int(r.get_input_tensor_by_name("IN").as_numpy()[0])
            if n < 0:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative", pb_utils.TritonError.INVALID_ARG)),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for i in range(n):
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            self.cancelled = r.is_cancelled()  # the stream is being read
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            errors = []
            for call in (lambda: sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL),
                         lambda: sender.send(), lambda: sender.send(None, flags=8)):
                try:
                    call()
                except pb_utils.TritonModelException as exc:
                    errors.append(str(exc))
            self.errors = errors
        return None
"""
RESCHEDULE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.steps = {}

    def execute(self, requests):
        for r in requests:
            key = id(r)
            step = self.steps.get(key, 0)
            self.steps[key] = step + 1
            sender = r.get_response_sender()
            sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", np.array([step], np.int32))]))
            if step < 2:
                r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
DECOUPLED = """
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


async def test_response_sender_contract_and_reschedule(bk, tmp_path: Path) -> None:
    bk.write_model(tmp_path, "sender", DECOUPLED, {"1/model.py": SENDER.encode()})
    bk.write_model(tmp_path, "again", DECOUPLED, {"1/model.py": RESCHEDULE.encode()})
    async with bk.engine_for(tmp_path) as engine:
        got = [
            r.outputs["OUT"].tolist()
            async for r in engine.stream_request(InferRequest("sender", {"IN": np.array([3], np.int32)}))
        ]
        model = bk.instance_of(engine, "sender").model
        with pytest.raises(FlowserveError, match="negative") as info:
            _ = [
                r
                async for r in engine.stream_request(InferRequest("sender", {"IN": np.array([-1], np.int32)}))
            ]
        assert info.value.code is InvalidArgument.code  # the TritonError's code, for HTTP and gRPC
        steps = [
            r.outputs["OUT"].tolist()
            async for r in engine.stream_request(InferRequest("again", {"IN": np.array([0], np.int32)}))
        ]
    assert got == [[0], [1], [2]]
    assert model.errors == [
        "Unable to send response. Response sender has been closed.",
        "Inference Response object must be provided when the response flags is set to zero.",
        "Unable to send response. Unsupported flag provided.",
    ]
    assert model.cancelled is False
    assert steps == [[0], [1], [2]]  # execute ran three times for one request


ERRORS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        code = int(requests[0].get_input_tensor_by_name("C").as_numpy()[0])
        if code < 0:  # answered through the sender, by a non-decoupled model
            requests[0].get_response_sender().send(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", np.array([1.5], np.float16))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        if code == 99:  # FP16 where FP32 is declared
            return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", np.array([2.5], np.float16))])]
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("failed", code))]

    def finalize(self):
        raise RuntimeError("finalize broke")
"""


async def test_triton_error_codes_dtype_cast_and_finalize(bk, tmp_path: Path, caplog) -> None:
    bk.write_model(
        tmp_path,
        "errors",
        'backend: "python"\ninput [ { name: "C" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n',
        {"1/model.py": ERRORS.encode()},
    )
    expected = {
        pb_utils.TritonError.UNKNOWN: FlowserveError,
        pb_utils.TritonError.INTERNAL: InternalError,
        pb_utils.TritonError.NOT_FOUND: NotFound,
        pb_utils.TritonError.INVALID_ARG: InvalidArgument,
        pb_utils.TritonError.UNAVAILABLE: Unavailable,
        pb_utils.TritonError.UNSUPPORTED: Unsupported,
        pb_utils.TritonError.ALREADY_EXISTS: AlreadyExists,
        pb_utils.TritonError.CANCELLED: Cancelled,
    }
    caplog.set_level(logging.WARNING, logger="flowserve.python_model")
    async with bk.engine_for(tmp_path) as engine:
        for code, kind in expected.items():
            with pytest.raises(FlowserveError, match="failed") as info:
                await engine.infer("errors", {"C": np.array([code], np.int32)})
            assert info.value.code is kind.code  # what HTTP and gRPC answer with
        cast = await engine.infer("errors", {"C": np.array([99], np.int32)})
        sent = await engine.infer("errors", {"C": np.array([-1], np.int32)})
    assert cast["Y"].dtype == np.float32 and cast["Y"].tolist() == [2.5]
    assert sent["Y"].tolist() == [1.5]
    text = caplog.text
    assert "returned output 'Y' as float16, declared FP32" in text
    assert "finalize() raised RuntimeError: finalize broke" in text


def test_load_model_without_model_control_is_a_clear_error() -> None:
    pb_utils.set_link(None, default=True)
    with pytest.raises(pb_utils.TritonModelException, match="load_model"):
        pb_utils.load_model("simple")


SIBLING = """
import numpy as np
import common
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", np.array([common.VALUE], np.int32))])
                for r in requests]
"""


async def test_sibling_modules_of_two_models_do_not_collide(bk, tmp_path: Path) -> None:
    config = (
        'backend: "python"\ninput [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    )
    for name, value in (("first", 1), ("second", 2)):
        files = {"1/model.py": SIBLING.encode(), "1/common.py": f"VALUE = {value}\n".encode()}
        bk.write_model(tmp_path, name, config, files)
    async with bk.engine_for(tmp_path) as engine:
        x = {"X": np.zeros(1, np.int32)}
        got = [int((await engine.infer(name, x))["Y"][0]) for name in ("first", "second")]
    assert got == [1, 2]


def test_a_served_model_never_sees_the_command_line(server: ServerProcess) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        x = httpclient.InferInput("X", [3], "FP32")
        x.set_data_from_numpy(np.ones(3, np.float32))
        result = client.infer("python_surface", [x])
    finally:
        client.close()
    report = json.loads(result.as_numpy("REPORT")[0])
    assert report["argv"] == [""]  # as Triton's stub: not the server's flags
