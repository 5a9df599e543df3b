"""Dynamic batching of python models: requests grouped into one ``execute(requests)`` as
Triton groups them, each keeping its own parameters; for a decoupled model, each request's
responses on its own stream."""

from __future__ import annotations

import asyncio
import queue
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import FlowserveError
from flowserve.core.types import InferRequest
from tests.conftest import ServerProcess

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT / "tests" / "models" / "decoupled_batched"


def _repo(tmp_path: Path, delay_us: int) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(MODEL, repo / "decoupled_batched")
    config = repo / "decoupled_batched" / "config.pbtxt"
    config.write_text(config.read_text().replace("400000", str(delay_us)))
    return repo


def _request(value: int, tag: int | None = None) -> InferRequest:
    parameters = {"tag": tag} if tag is not None else {}
    return InferRequest("decoupled_batched", {"IN": np.array([[value]], np.int32)}, parameters=parameters)


async def _collect(engine: flowserve.Engine, request: InferRequest) -> list[tuple[int, int, int]]:
    return [
        (int(r.outputs["OUT"][0, 0]), int(r.outputs["SIZE"][0, 0]), int(r.outputs["TAG"][0, 0]))
        async for r in engine.stream_request(request)
    ]


async def test_streams_that_arrive_together_run_as_one_execute_after_the_queue_delay(tmp_path: Path) -> None:
    engine = await flowserve.Engine.start(_repo(tmp_path, 200_000))
    try:
        got = await asyncio.gather(*(_collect(engine, _request(v, tag=v + 100)) for v in (1, 2, 3)))
        # three requests (under the preferred 8) waited for the delay, then ran as one batch;
        # each stream got its own two responses (the second sent after execute returned)
        assert got == [[(v, 3, v + 100), (10 * v, 3, v + 100)] for v in (1, 2, 3)]
        stats = engine.registry.get("decoupled_batched").stats
        for _ in range(500):  # counted once execute() returned, which may be after the last response
            if stats.execution_count:
                break
            await asyncio.sleep(0.01)
        assert stats.inference_count == 3 and stats.execution_count == 1
    finally:
        await engine.stop()


async def test_the_preferred_batch_size_runs_at_once_without_waiting_for_the_delay(tmp_path: Path) -> None:
    engine = await flowserve.Engine.start(_repo(tmp_path, 60_000_000))  # a minute of delay
    try:
        got = await asyncio.wait_for(
            asyncio.gather(*(_collect(engine, _request(v)) for v in range(8))), timeout=30
        )
        assert [sizes for stream in got for (_, sizes, _) in stream] == [8] * 16
    finally:
        await engine.stop()


async def test_an_error_response_fails_only_its_own_stream(tmp_path: Path) -> None:
    engine = await flowserve.Engine.start(_repo(tmp_path, 200_000))
    try:
        results = await asyncio.gather(
            _collect(engine, _request(5)), _collect(engine, _request(-1)), return_exceptions=True
        )
        assert results[0] == [(5, 2, -1), (50, 2, -1)]
        assert isinstance(results[1], FlowserveError) and "negative input -1" in str(results[1])
    finally:
        await engine.stop()


async def test_a_caller_that_leaves_while_queued_is_dropped_from_the_batch(tmp_path: Path) -> None:
    engine = await flowserve.Engine.start(_repo(tmp_path, 300_000))
    try:
        leaving = asyncio.ensure_future(_collect(engine, _request(7)))
        await asyncio.sleep(0.05)
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert await _collect(engine, _request(4)) == [(4, 1, -1), (40, 1, -1)]
    finally:
        await engine.stop()


def test_grouped_over_one_grpc_stream_with_tritonclient(server: ServerProcess) -> None:
    import tritonclient.grpc as grpcclient

    results: queue.Queue[object] = queue.Queue()

    def callback(store: queue.Queue[object], result: object, error: object) -> None:
        store.put(error if error is not None else result)

    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(callback=partial(callback, results))
        for value in (1, 2, 3):
            inp = grpcclient.InferInput("IN", [1, 1], "INT32")
            inp.set_data_from_numpy(np.array([[value]], np.int32))
            client.async_stream_infer("decoupled_batched", [inp], request_id=str(value))
        got = []
        for _ in range(6):
            item = results.get(timeout=30)
            assert not isinstance(item, Exception), item
            got.append(
                (item.get_response().id, int(item.as_numpy("OUT")[0, 0]), int(item.as_numpy("SIZE")[0, 0]))
            )  # type: ignore[attr-defined]
        client.stop_stream()
    assert sorted(got) == sorted(
        [(str(v), v, 3) for v in (1, 2, 3)] + [(str(v), 10 * v, 3) for v in (1, 2, 3)]
    )


ECHO_CONFIG = """
name: "param_echo"
backend: "python"
max_batch_size: 4
dynamic_batching { max_queue_delay_microseconds: 200000 }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "TAG" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "SIZE" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""

ECHO_MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            tag = int(json.loads(request.parameters() or "{}").get("tag", -1))
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("TAG", np.array([[tag]], np.int32)),
                pb_utils.Tensor("SIZE", np.array([[len(requests)]], np.int32)),
            ]))
        return out
"""

CALLER_CONFIG = """
name: "bls_param_caller"
backend: "python"
max_batch_size: 0
input [ { name: "TAGS" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "GOT" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""

# three BLS calls at once (async_exec), each with its own parameters, to the batched model
CALLER_MODEL = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            tags = pb_utils.get_input_tensor_by_name(request, "TAGS").as_numpy().tolist()
            calls = [
                pb_utils.InferenceRequest(
                    model_name="param_echo",
                    inputs=[pb_utils.Tensor("IN", np.array([[0]], np.int32))],
                    requested_output_names=["TAG", "SIZE"],
                    parameters={"tag": tag},
                ).async_exec()
                for tag in tags
            ]
            got = []
            for answer in await asyncio.gather(*calls):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                got.append(int(pb_utils.get_output_tensor_by_name(answer, "TAG").as_numpy()[0, 0]))
                got.append(int(pb_utils.get_output_tensor_by_name(answer, "SIZE").as_numpy()[0, 0]))
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("GOT", np.array(got, np.int32))]
            ))
        return responses
"""


def _model(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(code)


async def test_each_request_of_a_batch_keeps_its_parameters_from_clients_and_bls(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _model(repo, "param_echo", ECHO_CONFIG, ECHO_MODEL)
    _model(repo, "bls_param_caller", CALLER_CONFIG, CALLER_MODEL)
    engine = await flowserve.Engine.start(repo)
    try:
        direct = await asyncio.gather(
            *(
                engine.infer_request(
                    InferRequest("param_echo", {"IN": np.array([[0]], np.int32)}, parameters={"tag": t})
                )
                for t in (7, 8, 9)
            )
        )
        assert [(int(r.outputs["TAG"][0, 0]), int(r.outputs["SIZE"][0, 0])) for r in direct] == [
            (7, 3),
            (8, 3),
            (9, 3),
        ]
        answer = await engine.infer_request(
            InferRequest("bls_param_caller", {"TAGS": np.array([4, 5, 6], np.int32)})
        )
        # (tag, batch size) per BLS call: the three calls ran as one batch, each with its tag
        assert answer.outputs["GOT"].tolist() == [4, 3, 5, 3, 6, 3]
    finally:
        await engine.stop()


WAIT_MODEL = """
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        # Triton's execute_cancel pattern: work until the request is cancelled
        start = time.monotonic()
        while time.monotonic() - start < 20 and not all(r.is_cancelled() for r in requests):
            time.sleep(0.01)
        for request in requests:
            path = json.loads(request.parameters())["log"]
            with open(path, "w") as f:
                f.write("cancelled" if request.is_cancelled() else "not cancelled")
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED))
                for _ in requests]
"""


@pytest.mark.parametrize("batching", ["", "dynamic_batching { max_queue_delay_microseconds: 1000 }"])
async def test_a_request_past_its_deadline_is_cancelled_for_the_model(tmp_path: Path, batching: str) -> None:
    config = f"""
name: "wait_cancel"
backend: "python"
max_batch_size: 4
{batching}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""
    repo = tmp_path / "repo"
    _model(repo, "wait_cancel", config, WAIT_MODEL)
    log = tmp_path / "seen.txt"
    engine = await flowserve.Engine.start(repo)
    try:
        request = InferRequest(
            "wait_cancel",
            {"IN": np.array([[1]], np.int32)},
            parameters={"log": str(log), "timeout": 300_000},  # 300 ms
        )
        with pytest.raises(FlowserveError):
            await engine.infer_request(request)
        for _ in range(500):  # execute() notices is_cancelled() and returns
            if log.exists() and log.read_text():
                break
            await asyncio.sleep(0.01)
        assert log.read_text() == "cancelled"
    finally:
        await engine.stop()
