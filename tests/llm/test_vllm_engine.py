"""The vLLM engine. Without vLLM (here) a model that selects it fails to load with a message that
says what to do, and 'auto' picks transformers. With a fake ``vllm`` package
(:mod:`tests.llm.fake_vllm`: vLLM 0.33's API surface) the engine's own logic runs on the CPU:
model.json as Triton's vLLM backend takes it, the engine built off the event loop with the
OpenAI server's usage context, delta outputs, cancellation freeing the sequence, errors naming
the model, load reporting, shutdown. On a GPU machine with vLLM installed (``-m gpu``), the tiny
model generates through the real vLLM."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import InvalidArgument, ResourceExhausted, Unavailable, Unsupported
from flowserve.core.types import InferRequest
from flowserve.nodes.backends._support import gpu_count
from flowserve.nodes.llm.backend import make_engine
from flowserve.nodes.llm.engine import Ranked, Sampling, Tokens
from flowserve.nodes.llm.params import engine_config
from flowserve.nodes.llm.vllm_engine import VllmEngine, _token_logprobs, engine_arguments, vllm_installed
from tests.llm import fake_vllm
from tests.llm.fake_vllm import TEXT
from tests.llm.tinymodel import write_llm_model

# --- without vLLM ---


@pytest.mark.skipif(vllm_installed(), reason="vLLM is installed here")
async def test_without_vllm_the_vllm_engine_says_what_to_do(tmp_path: Path) -> None:
    config = engine_config("chat", {"engine": "vllm", "model": "weights"}, tmp_path)
    engine = make_engine("chat", config)
    assert isinstance(engine, VllmEngine)
    with pytest.raises(Unsupported, match=r"model 'chat': .*vLLM is not installed.*'engine': 'transformers'"):
        await engine.start()
    auto = make_engine("chat", engine_config("chat", {"engine": "auto", "model": "weights"}, tmp_path))
    assert auto.name == "transformers"


@pytest.mark.skipif(vllm_installed(), reason="vLLM is installed here")
async def test_a_vllm_model_fails_alone_and_the_server_serves_the_rest(
    tiny_model: Path, tmp_path: Path
) -> None:
    write_llm_model(tmp_path, "on_vllm", tiny_model, engine="vllm")
    write_llm_model(tmp_path, "on_transformers", tiny_model)
    engine = await flowserve.Engine.start(tmp_path)
    try:
        assert engine.registry.has("on_transformers")
        assert not engine.registry.has("on_vllm")
    finally:
        await engine.stop()


# --- on the fake vllm package ---


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    fake_vllm.install(monkeypatch)
    return fake_vllm


def _engine(tmp_path: Path, **doc: Any) -> VllmEngine:
    config = engine_config("chat", {"engine": "vllm", "model": "fake/opt", **doc}, tmp_path)
    engine = make_engine("chat", config)
    assert isinstance(engine, VllmEngine)
    return engine


async def _all(engine: VllmEngine, request_id: str, prompt: str, sampling: Sampling) -> list[Tokens]:
    return [t async for t in engine.generate(request_id, engine.tokenizer.encode(prompt), sampling)]


def test_model_json_as_triton_vllm_backend_users_write_it(
    fake: Any, caplog: pytest.LogCaptureFixture
) -> None:
    doc = {
        "engine": "vllm",  # flowserve's own keys stay out
        "max_tokens": 64,
        "model": "facebook/opt-125m",
        "enforce_eager": "true",  # strings, as in Triton's samples
        "enable_lora": "false",  # a non-empty string is true: converted, not passed on
        "gpu_memory_utilization": "0.5",
        "max_num_seqs": "8",
        "dtype": "half",  # a Literal of strings: unchanged
        "disable_log_requests": True,  # older vLLM (and Triton samples): now enable_log_requests
        "resolve_model_relative_to_config_file": True,  # Triton's vLLM backend (2024)
        "page_size": 16,  # the transformers engine's (model.json for "auto")
        "max_model_len": None,
    }
    with caplog.at_level(logging.WARNING, "flowserve.llm"):
        args = engine_arguments("chat", doc, fake.AsyncEngineArgs)
    assert args == {
        "model": "facebook/opt-125m",
        "enforce_eager": True,
        "enable_lora": False,
        "gpu_memory_utilization": 0.5,
        "max_num_seqs": 8,
        "dtype": "half",
        "enable_log_requests": False,
        "max_model_len": None,
    }
    fake.AsyncEngineArgs(**args)
    text = caplog.text
    assert "'disable_log_requests' is 'enable_log_requests'" in text
    assert "ignores model.json 'resolve_model_relative_to_config_file', 'page_size'" in text


def test_an_unknown_or_malformed_model_json_key_names_the_model_and_the_key(fake: Any) -> None:
    with pytest.raises(
        InvalidArgument,
        match=r"model 'chat': model.json 'gpu_memory_utilisation' is not an engine argument of vLLM .*did you mean 'gpu_memory_utilization'",
    ):
        engine_arguments("chat", {"model": "m", "gpu_memory_utilisation": 0.5}, fake.AsyncEngineArgs)
    with pytest.raises(
        InvalidArgument, match=r"model 'chat': model.json 'enforce_eager' must be bool, got 'yes'"
    ):
        engine_arguments("chat", {"model": "m", "enforce_eager": "yes"}, fake.AsyncEngineArgs)
    with pytest.raises(
        InvalidArgument, match=r"model 'chat': model.json 'disable_log_requests' must be true or false"
    ):
        engine_arguments("chat", {"model": "m", "disable_log_requests": "maybe"}, fake.AsyncEngineArgs)


async def test_the_engine_is_built_off_the_event_loop_as_vllm_serve_builds_it(
    fake: Any, tmp_path: Path
) -> None:
    engine = _engine(tmp_path, gpu_memory_utilization=0.3)
    await engine.start()
    try:
        (llm,) = fake.ENGINES
        assert llm.created_in is not threading.current_thread()  # a worker thread: the loop ran on
        assert llm.loop_at_init is None  # vLLM then starts its output handler lazily ...
        assert llm.loop is asyncio.get_running_loop()  # ... here, at get_supported_tasks
        assert llm.usage_context == fake.UsageContext.OPENAI_API_SERVER  # vllm serve's batch defaults
        assert llm.vllm_config.max_num_seqs == 1024
        assert llm.engine_args.gpu_memory_utilization == 0.3
        assert len(llm.stat_loggers) == 1
        import os

        assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
        assert engine.tokenizer is llm.tokenizer
    finally:
        await engine.stop()
    assert llm.shut_down


async def test_a_model_vllm_does_not_generate_with_or_a_bad_argument_fails_the_load(
    fake: Any, tmp_path: Path
) -> None:
    engine = _engine(tmp_path, model="fake/embed-model")
    with pytest.raises(
        InvalidArgument, match=r"model 'chat': vLLM loads 'fake/embed-model' for embed, not text generation"
    ):
        await engine.start()
    assert fake.ENGINES[-1].shut_down
    with pytest.raises(
        Unavailable,
        match=r"model 'chat': the vLLM engine failed to start \(ValueError: gpu_memory_utilization",
    ):
        await _engine(tmp_path, gpu_memory_utilization=1.5).start()


async def test_a_load_cancelled_while_vllm_builds_stops_the_engine_it_built(
    fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = fake.AsyncLLM.from_engine_args.__func__

    def slow(cls: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.2)  # loading the weights
        return build(cls, *args, **kwargs)

    monkeypatch.setattr(fake.AsyncLLM, "from_engine_args", classmethod(slow))
    start = asyncio.ensure_future(_engine(tmp_path).start())
    await asyncio.sleep(0.05)
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    for _ in range(100):
        if fake.ENGINES and fake.ENGINES[0].shut_down:
            break
        await asyncio.sleep(0.01)
    assert fake.ENGINES[0].shut_down


async def test_deltas_stream_each_token_once_with_the_request_sampling(fake: Any, tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    await engine.start()
    try:
        sampling = Sampling(max_tokens=12, temperature=0, top_k=0, seed=7, logprobs=0)
        chunks = await _all(engine, "r-1", "hello", sampling)
        ids = [i for c in chunks for i in c.ids]
        assert engine.tokenizer.decode(ids) == TEXT[:12]  # no token twice (CUMULATIVE would repeat)
        assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
        assert chunks[-1].reason == "length"
        assert [p for c in chunks for p in c.logprobs or ()] == [-0.1] * 12
        (params,) = fake.ENGINES[0].params
        assert params.output_kind == fake.RequestOutputKind.DELTA
        assert (params.n, params.max_tokens, params.seed, params.top_k) == (1, 12, 7, 0)
        assert params.detokenize is False and params.logprobs == 0 and params.stop == []
        assert fake.ENGINES[0].prompts == [{"prompt_token_ids": engine.tokenizer.encode("hello")}]
        # the end of sequence: reason "stop"; no log-probabilities unless asked for
        chunks = await _all(engine, "r-2", "hi", Sampling(max_tokens=100, temperature=0))
        assert engine.tokenizer.decode([i for c in chunks for i in c.ids], skip_special_tokens=True) == TEXT
        assert chunks[-1].reason == "stop" and all(c.logprobs is None for c in chunks)
        assert fake.ENGINES[0].abort_calls == 0  # a finished request's stream ends: nothing to abort
    finally:
        await engine.stop()


def test_vllm_logprobs_become_each_tokens_value_rank_and_likeliest(fake: Any) -> None:
    """vLLM's per-position ``{token id: Logprob}`` holds the N most likely and the sampled token
    (with its own rank when it is not one of them): the token's value and rank, the N best."""
    logprob = fake_vllm.Logprob
    positions = [
        {5: logprob(-0.1, 1), 7: logprob(-2.5, 2)},  # the sampled token is the likeliest
        {3: logprob(-0.3, 1), 4: logprob(-1.9, 2), 9: logprob(-4.0, 6)},  # sampled 9, ranked 6th
    ]
    values, ranked = _token_logprobs([5, 9], positions, 2)
    assert values == [-0.1, -4.0]
    assert ranked == [Ranked(1, ((5, -0.1), (7, -2.5))), Ranked(6, ((3, -0.3), (4, -1.9)))]
    assert _token_logprobs([5], positions[:1], 0) == ([-0.1], [Ranked(1, ())])


async def test_a_slow_consumer_gets_the_merged_deltas(fake: Any, tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    await engine.start()
    try:
        got: list[int] = []
        async for chunk in engine.generate("slow", [104, 105], Sampling(max_tokens=20, temperature=0)):
            got.extend(chunk.ids)
            await asyncio.sleep(fake.STEP_S * 4)  # vLLM merges the deltas that wait meanwhile
        assert engine.tokenizer.decode(got) == TEXT[:20]
    finally:
        await engine.stop()


async def test_the_same_seed_gives_the_same_tokens(fake: Any, tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    await engine.start()
    try:
        sampling = Sampling(max_tokens=16, temperature=0.8, seed=3)
        a, b = await asyncio.gather(_all(engine, "a", "x", sampling), _all(engine, "b", "x", sampling))
        assert [i for c in a for i in c.ids] == [i for c in b for i in c.ids]
    finally:
        await engine.stop()


async def test_closing_the_stream_aborts_the_request_and_frees_its_blocks(fake: Any, tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    await engine.start()
    llm = fake.ENGINES[0]
    try:
        stream = engine.generate("gone", [104, 105], Sampling(max_tokens=200, temperature=0))
        async for chunk in stream:
            if chunk.ids:
                break
        assert llm.live == 1
        await asyncio.sleep(fake.STEP_S * 3)
        load = engine.load()
        assert load.running == 1 and load.kv_cache_usage > 0
        await stream.aclose()  # the client went away (or a stop string matched)
        assert llm.live == 0 and llm.aborted == ["gone"]
        assert engine.load() == type(load)()  # no stats after the abort: nothing in the engine
        # cancelled while waiting for a token: the same
        task = asyncio.ensure_future(_all(engine, "cancelled", "x", Sampling(max_tokens=200, temperature=0)))
        await asyncio.sleep(fake.STEP_S * 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert llm.live == 0 and "cancelled" in llm.aborted
    finally:
        await engine.stop()


async def test_vllm_errors_name_the_model(fake: Any, tmp_path: Path) -> None:
    engine = _engine(tmp_path, max_model_len=64)
    await engine.start()
    llm = fake.ENGINES[0]
    try:
        with pytest.raises(
            InvalidArgument,
            match=r"model 'chat': vLLM refuses the sampling parameters: temperature must be in \[0, 2\], got 3.0",
        ):
            await _all(engine, "hot", "x", Sampling(temperature=3.0))
        with pytest.raises(
            InvalidArgument,
            match=r"model 'chat': vLLM refuses the request: VLLMValidationError: The decoder prompt \(length 80\) is longer",
        ):
            await _all(engine, "long", "x" * 80, Sampling())
        stream = engine.generate("dies", [104], Sampling(max_tokens=200, temperature=0))
        await stream.__anext__()
        llm.kill()
        with pytest.raises(Unavailable, match=r"model 'chat': the vLLM engine died"):
            await stream.__anext__()
        overflow = type("QueueOverflowError", (fake.VLLMServerError,), {})
        assert isinstance(engine._error(overflow("queue full")), ResourceExhausted)
    finally:
        await engine.stop()


async def test_stop_ends_the_streams_in_flight(fake: Any, tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    await engine.start()
    llm = fake.ENGINES[0]
    chunks: list[Tokens] = []

    async def consume() -> None:
        async for chunk in engine.generate("inflight", [104], Sampling(max_tokens=10_000, temperature=0)):
            chunks.append(chunk)

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(fake.STEP_S * 5)
    await engine.stop()
    await asyncio.wait_for(task, 1)  # ended, not waiting forever for tokens
    assert chunks[-1].finished and chunks[-1].reason == "abort"
    assert llm.shut_down and llm.live == 0
    with pytest.raises(Unavailable, match="model 'chat': the engine is not running"):
        await _all(engine, "late", "x", Sampling())


async def test_a_generation_model_on_the_fake_vllm_serves_triton_requests(fake: Any, tmp_path: Path) -> None:
    write_llm_model(tmp_path, "tiny", Path("fake/opt"), engine="vllm", enforce_eager="true")
    server = await flowserve.Engine.start(tmp_path)
    try:
        assert server.registry.has("tiny")
        llm = fake.ENGINES[0]
        params = {"temperature": 0, "max_tokens": 30, "stop": ["fox"]}
        inputs = {
            "text_input": np.array([b"hello world"], dtype=object),
            "stream": np.array([True]),
            "sampling_parameters": np.array([json.dumps(params).encode()], dtype=object),
            "return_finish_reason": np.array([True]),
            "return_num_input_tokens": np.array([True]),
        }
        responses = [r async for r in server.stream_request(InferRequest("tiny", inputs))]
        text = b"".join(r.outputs["text_output"][0] for r in responses).decode()
        assert text == "the quick brown "  # the node applies the stop string ...
        assert responses[-1].outputs["finish_reason"][0] == b"stop"
        assert int(responses[-1].outputs["num_input_tokens"][0]) == len("hello world")
        assert len(llm.aborted) == 1 and llm.live == 0  # ... and closes the stream: vLLM aborts
    finally:
        await server.stop()
    assert fake.ENGINES[0].shut_down


# --- on a GPU with vLLM ---


@pytest.mark.gpu
async def test_generation_on_vllm(tiny_model: Path, tmp_path: Path) -> None:
    if not vllm_installed() or gpu_count() == 0:
        pytest.skip("needs vLLM and an NVIDIA GPU")
    write_llm_model(
        tmp_path,
        "tiny",
        tiny_model,
        engine="vllm",
        gpu_memory_utilization=0.2,
        enforce_eager=True,
        max_model_len=256,
    )
    engine = await flowserve.Engine.start(tmp_path)
    try:
        params = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}
        inputs = {
            "text_input": np.array([b"hello world"], dtype=object),
            "stream": np.array([True]),
            "sampling_parameters": np.array([json.dumps(params).encode()], dtype=object),
            "return_finish_reason": np.array([True]),
            "return_num_output_tokens": np.array([True]),
            "return_cumulative_logprob": np.array([True]),
        }
        responses = [r async for r in engine.stream_request(InferRequest("tiny", inputs))]
        assert sum(int(r.outputs["num_output_tokens"][0]) for r in responses) == 8
        assert responses[-1].outputs["finish_reason"][0] == b"length"
        assert float(responses[-1].outputs["cumulative_logprob"][0]) <= 0
    finally:
        await engine.stop()
