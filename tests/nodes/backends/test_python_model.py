"""Triton's python backend, in-process: model.py runs unchanged (add_sub, BLS sync and async,
auto_complete_config), a batch reaches execute() as N requests, errors name the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flowserve.core.errors import FlowserveError
from flowserve.nodes.backends import autocompletions, pb_utils
from flowserve.runtime.registry import State
from flowserve.spec.repository import scan_model

TESTS = Path(__file__).resolve().parents[2] / "models"

COUNTING = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        n = len(requests)
        return [
            pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("N", np.full((r.inputs()[0].as_numpy().shape[0], 1), n, np.int32))
            ])
            for r in requests
        ]
"""
COUNTING_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def ab() -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    return a, np.full((2, 16), 3, np.int32)


async def test_triton_add_sub_runs_unchanged(bk) -> None:
    a, b = ab()
    async with bk.engine_for(bk.BUNDLED) as engine:
        out = await engine.infer("simple", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


async def test_batch_reaches_execute_as_n_requests(bk, tmp_path: Path) -> None:
    bk.write_model(tmp_path, "counting", COUNTING_CONFIG, {"1/model.py": COUNTING.encode()})
    async with bk.engine_for(tmp_path) as engine:
        node = bk.backend_node(engine, "counting")
        instance = node.pool.instances[0]
        batch = [{"X": np.zeros((rows, 2), np.float32)} for rows in (1, 3, 2)]
        results = node.execute_batch(instance, batch)
        single = await engine.infer("counting", {"X": np.zeros((2, 2), np.float32)})
    assert [r["N"].shape for r in results] == [(1, 1), (3, 1), (2, 1)]
    assert all((r["N"] == 3).all() for r in results)  # one execute() call saw 3 requests
    assert (single["N"] == 1).all()


async def test_bls_exec_calls_another_model(bk) -> None:
    a, b = ab()
    async with bk.engine_for(bk.BUNDLED, TESTS) as engine:
        out = await engine.infer("python_bls", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)


async def test_bls_async_exec(bk) -> None:
    a, b = ab()
    async with bk.engine_for(bk.BUNDLED, TESTS) as engine:
        out = await engine.infer("python_bls_async", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], b - a)


async def test_bls_error_comes_back_in_the_response(bk, tmp_path: Path) -> None:
    source = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            resp = pb_utils.InferenceRequest(
                model_name="no_such_model", requested_output_names=["Y"], inputs=r.inputs()
            ).exec()
            msg = resp.error().message() if resp.has_error() else ""
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("MSG", np.array([msg.encode()], dtype=object))
            ]))
        return out
"""
    config = """
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "MSG" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
    bk.write_model(tmp_path, "bls_missing", config, {"1/model.py": source.encode()})
    async with bk.engine_for(tmp_path) as engine:
        out = await engine.infer("bls_missing", {"X": np.zeros(1, np.float32)})
    assert b"no_such_model" in out["MSG"][0]


def test_bls_outside_an_engine_is_a_clear_error() -> None:
    pb_utils.set_link(None, default=True)
    request = pb_utils.InferenceRequest(model_name="simple", inputs=[], requested_output_names=[])
    response = request.exec()
    assert response.has_error() and "BLS works only inside" in response.error().message()


async def test_auto_complete_config_without_config_file(bk) -> None:
    spec = scan_model(TESTS / "python_autocomplete", autocompletions()).models["python_autocomplete"]
    assert spec.max_batch_size == 4 and spec.batching is not None
    assert [(t.name, t.datatype, t.dims) for t in spec.inputs] == [("INPUT0", "FP32", (4,))]
    x = np.ones((2, 4), np.float32)
    async with bk.engine_for(TESTS) as engine:
        out = await engine.infer("python_autocomplete", {"INPUT0": x})
    np.testing.assert_array_equal(out["OUTPUT0"], x * 2)


def test_auto_complete_config_errors_name_the_model(bk, tmp_path: Path) -> None:
    source = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(2)
        return config

    def execute(self, requests):
        return []
"""
    model_dir = bk.write_model(tmp_path, "too_small", "max_batch_size: 8\n", {"1/model.py": source.encode()})
    scan = scan_model(model_dir, autocompletions())
    text = "; ".join(str(i) for i in scan.issues)
    assert "too_small" in scan.failed
    assert "model 'too_small'" in text and "auto_complete_config" in text and "max_batch_size 8" in text


async def test_execute_errors_name_the_model(bk) -> None:
    async with bk.engine_for(TESTS) as engine:
        with pytest.raises(FlowserveError) as info:
            await engine.infer("failing", {"INPUT0": np.array([-1], np.int32)})
    # Triton's words: the model's instance ('<model>_<group>_<index>') and what it raised
    assert str(info.value) == (
        "Failed to process the request(s) for model 'failing_0_0', message: ValueError: negative input"
    )


async def test_broken_initialize_fails_alone(bk, tmp_path: Path) -> None:
    bk.copy_bundled(tmp_path, "simple")
    (tmp_path / "broken").mkdir()
    for rel in ("config.pbtxt", "1/model.py"):
        target = tmp_path / "broken" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((TESTS / "broken" / rel).read_bytes())
    a, b = ab()
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "broken")
        assert state is State.UNAVAILABLE
        assert "model 'broken'" in reason and "broken on purpose" in reason
        out = await engine.infer("simple", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)


def test_model_config_rules() -> None:
    config = pb_utils.ModelConfig({"name": "m", "max_batch_size": 0, "input": [], "output": []})
    config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]})
    config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]})  # same again: fine
    with pytest.raises(ValueError, match="dims"):
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [3]})
    with pytest.raises(ValueError, match="unsupported properties"):
        config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1], "colour": "red"})
    config.set_dynamic_batching()
    assert config.as_dict()["dynamic_batching"] == {}
    assert len(config.as_dict()["input"]) == 1
