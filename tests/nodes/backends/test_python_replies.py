"""What becomes of a python model's requests once execute() returned or raised, as Triton 2.51's
qa suites check it (L0_backend_python response_sender, decoupled, lifecycle,
request_rescheduling): responses sent after execute returned (from a thread or an async task),
the decoupled "must return None" rule, per-request errors in a batch, errors in Triton's words,
request rescheduling back into the queue, iterative sequences without a correlation id, and
BLS errors. Every path ends: responses, an error, or the final flag."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import FlowserveError
from flowserve.core.types import InferRequest

HEAD = "import threading, time, asyncio, json\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n"
IO = """
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def _model(repo: Path, name: str, body: str, config: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(HEAD + textwrap.dedent(body))
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n{IO}\n{textwrap.dedent(config)}'
    )


def _out(value: int) -> str:
    return f'pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([[{value}]], np.int32))])'


def _in(value: int) -> dict[str, np.ndarray]:
    return {"IN": np.array([[value]], np.int32)}


async def _stream(engine: flowserve.Engine, model: str, value: int, **parameters: object) -> list[int]:
    request = InferRequest(model, _in(value), parameters=dict(parameters))
    out = [int(r.outputs["OUT"][0, 0]) async for r in engine.stream_request(request)]
    return out


DECOUPLED = "model_transaction_policy { decoupled: true }"


async def test_decoupled_responses_after_execute_returned_thread_and_async_task(tmp_path: Path) -> None:
    send_later = f"""
        def later(sender):
            time.sleep(0.2)
            sender.send({_out(2)})
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """
    _model(
        tmp_path,
        "threaded",
        send_later
        + f"""
        class TritonPythonModel:
            def execute(self, requests):
                for r in requests:
                    r.get_response_sender().send({_out(1)})
                    threading.Thread(target=later, args=(r.get_response_sender(),), daemon=True).start()
                return None
        """,
        DECOUPLED,
    )
    _model(
        tmp_path,
        "async_task",
        f"""
        class TritonPythonModel:
            def initialize(self, args):
                self.tasks = set()

            async def execute(self, requests):
                async def later(sender):
                    await asyncio.sleep(0.2)  # runs after execute returned: the loop lives on
                    sender.send({_out(2)})
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

                for r in requests:
                    r.get_response_sender().send({_out(1)})
                    task = asyncio.create_task(later(r.get_response_sender()))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                return None
        """,
        DECOUPLED,
    )
    _model(
        tmp_path,
        "final_only_later",
        """
        class TritonPythonModel:
            def execute(self, requests):
                for r in requests:
                    sender = r.get_response_sender()
                    threading.Timer(
                        0.2, sender.send, kwargs={"flags": pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL}
                    ).start()
                return None
        """,
        DECOUPLED,
    )
    engine = await flowserve.Engine.start(tmp_path)
    try:
        assert await asyncio.wait_for(_stream(engine, "threaded", 0), 10) == [1, 2]
        assert await asyncio.wait_for(_stream(engine, "async_task", 0), 10) == [1, 2]
        assert await asyncio.wait_for(_stream(engine, "final_only_later", 0), 10) == []
    finally:
        await engine.stop()


async def test_a_sender_dropped_without_the_final_flag_ends_the_request_with_an_error(
    tmp_path: Path,
) -> None:
    # Triton's client waits for ever when a model lets go of a request's sender before the final
    # flag (the thread meant to answer ended or died); here the request ends with an error naming the model
    _model(
        tmp_path,
        "dies",
        f"""
        def answer(sender):
            sender.send({_out(1)})
            # ... and the thread ends (as when it dies: its frames, the sender's last holder, go)

        class TritonPythonModel:
            def execute(self, requests):
                for r in requests:
                    threading.Thread(target=answer, args=(r.get_response_sender(),), daemon=True).start()
                return None
        """,
        DECOUPLED,
    )
    forgets = """
        class TritonPythonModel:
            def execute(self, requests):
                for r in requests:
                    r.get_response_sender()
                return [None for _ in requests]
    """
    _model(tmp_path, "forgets", forgets)  # non-decoupled: asks for the sender, returns None, never sends
    _model(tmp_path, "forgets_batched", forgets, "dynamic_batching { }")
    engine = await flowserve.Engine.start(tmp_path)
    received: list[int] = []
    try:
        request = InferRequest("dies", _in(0))

        async def read() -> None:
            async for r in engine.stream_request(request):
                received.append(int(r.outputs["OUT"][0, 0]))

        with pytest.raises(FlowserveError, match="model 'dies' released a request's response sender"):
            await asyncio.wait_for(read(), 10)
        assert received == [1]  # what was sent before still arrived
        with pytest.raises(FlowserveError, match="model 'forgets' released a request's response sender"):
            await asyncio.wait_for(engine.infer("forgets", _in(0)), 10)
        with pytest.raises(FlowserveError, match="model 'forgets_batched' released"):
            await asyncio.wait_for(engine.infer("forgets_batched", _in(0)), 10)
        with pytest.raises(FlowserveError, match="model 'dies' released"):  # and again: nothing stuck
            await asyncio.wait_for(_stream(engine, "dies", 0), 10)
    finally:
        await engine.stop()


async def test_decoupled_execute_must_return_none(tmp_path: Path) -> None:
    _model(
        tmp_path,
        "returns",
        f"""
        class TritonPythonModel:
            def execute(self, requests):
                if requests[0].get_input_tensor_by_name("IN").as_numpy()[0, 0] == 1:
                    sender = requests[0].get_response_sender()  # closed first: the error goes nowhere
                    sender.send({_out(7)}, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return [{_out(0)} for _ in requests]
        """,
        DECOUPLED,
    )
    engine = await flowserve.Engine.start(tmp_path)
    try:
        with pytest.raises(FlowserveError) as caught:
            await asyncio.wait_for(_stream(engine, "returns", 0), 10)
        assert caught.value.message == (
            "Python model 'returns_0_0' is using the decoupled mode and the execute function must return None."
        )
        assert await asyncio.wait_for(_stream(engine, "returns", 1), 10) == [7]
    finally:
        await engine.stop()


async def test_non_decoupled_answer_sent_after_return_or_before_a_returned_one(tmp_path: Path) -> None:
    _model(
        tmp_path,
        "answers",
        f"""
        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    how = int(r.get_input_tensor_by_name("IN").as_numpy()[0, 0])
                    sender = r.get_response_sender() if how in (1, 2) else None
                    if how == 1:  # sent later, from a thread; execute returns None for it
                        threading.Timer(0.2, sender.send, args=({_out(21)},), kwargs={{"flags": 1}}).start()
                        out.append(None)
                    elif how == 2:  # sent now: the response returned for it is dropped
                        sender.send({_out(22)}, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                        out.append({_out(99)})
                    elif how == 3:  # neither: an error, not a wait
                        out.append(None)
                    else:
                        out.append({_out(20)})
                return out
        """,
    )
    engine = await flowserve.Engine.start(tmp_path)
    try:
        for how, want in ((0, 20), (1, 21), (2, 22)):
            got = await asyncio.wait_for(engine.infer("answers", _in(how)), 10)
            assert int(got["OUT"][0, 0]) == want
        with pytest.raises(FlowserveError, match="returned None for request 0 of 1"):
            await asyncio.wait_for(engine.infer("answers", _in(3)), 10)
    finally:
        await engine.stop()


async def test_a_batch_fails_request_by_request_and_errors_read_as_triton_words(tmp_path: Path) -> None:
    _model(
        tmp_path,
        "some_fail",
        """
        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    value = r.get_input_tensor_by_name("IN").as_numpy()
                    if value[0, 0] < 0:
                        out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                            "error code: INVALID_ARG", pb_utils.TritonError.INVALID_ARG)))
                    else:
                        out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
                return out
        """,
        "dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 2000000 }",
    )
    _model(
        tmp_path,
        "raises",
        """
        class TritonPythonModel:
            def execute(self, requests):
                lorem_ipsum
        """,
    )
    engine = await flowserve.Engine.start(tmp_path)
    try:
        got = await asyncio.gather(
            *(engine.infer("some_fail", _in(v)) for v in (-1, 5, -3)), return_exceptions=True
        )
        assert isinstance(got[0], FlowserveError) and isinstance(got[2], FlowserveError)
        assert got[0].message == "error code: INVALID_ARG"  # the model's words, no prefix
        assert got[0].code.name == "INVALID_ARG"
        assert isinstance(got[1], dict) and int(got[1]["OUT"][0, 0]) == 5
        assert engine.registry.get("some_fail").stats.execution_count == 1  # one execute for the three
        with pytest.raises(FlowserveError) as caught:
            await engine.infer("raises", _in(0))
        assert caught.value.message == (
            "Failed to process the request(s) for model 'raises_0_0', message: "
            "NameError: name 'lorem_ipsum' is not defined"
        )
    finally:
        await engine.stop()


async def test_a_rescheduled_request_goes_back_in_the_queue(tmp_path: Path) -> None:
    _model(
        tmp_path,
        "reschedule",
        """
        class TritonPythonModel:
            def initialize(self, args):
                self.seen = []

            def execute(self, requests):
                out = []
                for r in requests:
                    value = int(r.get_input_tensor_by_name("IN").as_numpy()[0, 0])
                    self.seen.append(value)
                    pb_utils.Logger.log_info(f"seen {self.seen}")
                    if value == 1 and self.seen.count(1) == 1:
                        time.sleep(0.3)  # request 2 arrives and waits meanwhile
                        r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                        out.append(None)
                    elif value == 3:  # rescheduled, yet answered: Triton's error
                        r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                        out.append(pb_utils.InferenceResponse([]))
                    else:
                        out.append(pb_utils.InferenceResponse(
                            [pb_utils.Tensor("OUT", np.array([[len(self.seen)]], np.int32))]))
                return out
        """,
    )
    engine = await flowserve.Engine.start(tmp_path)
    try:
        first = asyncio.ensure_future(engine.infer("reschedule", _in(1)))
        await asyncio.sleep(0.1)
        second = await asyncio.wait_for(engine.infer("reschedule", _in(2)), 10)
        again = await asyncio.wait_for(first, 10)
        # request 1 went back in the queue behind request 2: executes saw 1, 2, then 1 again
        assert int(second["OUT"][0, 0]) == 2 and int(again["OUT"][0, 0]) == 3
        with pytest.raises(
            FlowserveError, match="Expected a None object in the execute function return list"
        ):
            await asyncio.wait_for(engine.infer("reschedule", _in(3)), 10)
    finally:
        await engine.stop()


async def test_iterative_sequence_without_a_correlation_id(tmp_path: Path) -> None:
    _model(
        tmp_path,
        "iterative",
        """
        class TritonPythonModel:
            def initialize(self, args):
                self.left = {}

            def execute(self, requests):
                for r in requests:
                    left = self.left.get(id(r), int(r.get_input_tensor_by_name("IN").as_numpy()[0])) - 1
                    self.left[id(r)] = left
                    sender = r.get_response_sender()
                    response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([left], np.int32))])
                    if left <= 0:
                        sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    else:
                        r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                        sender.send(response)
                return None
        """,
        f"{DECOUPLED}\nsequence_batching {{ iterative_sequence: true }}",
    )
    config = tmp_path / "iterative" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: 0"))
    engine = await flowserve.Engine.start(tmp_path)
    try:
        request = InferRequest("iterative", {"IN": np.array([3], np.int32)})
        got = [int(r.outputs["OUT"][0]) async for r in engine.stream_request(request)]
        assert got == [2, 1, 0]
    finally:
        await engine.stop()


async def test_bls_errors_before_the_model_runs_say_error_when_running_inference(tmp_path: Path) -> None:
    _model(
        tmp_path,
        "caller",
        """
        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    called = pb_utils.InferenceRequest(
                        model_name="nowhere", inputs=[], requested_output_names=["OUT"]).exec()
                    message = called.error().message()
                    pb_utils.Logger.log_info(message)
                    ok = message.startswith("Model nowhere - Error when running inference: ")
                    out.append(pb_utils.InferenceResponse(
                        [pb_utils.Tensor("OUT", np.array([[int(ok)]], np.int32))]))
                return out
        """,
    )
    engine = await flowserve.Engine.start(tmp_path)
    try:
        got = await asyncio.wait_for(engine.infer("caller", _in(0)), 10)
        assert int(got["OUT"][0, 0]) == 1
    finally:
        await engine.stop()
