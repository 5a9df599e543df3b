"""The vLLM engine: without vLLM (here) a model that selects it fails to load with a message
that says what to do, and 'auto' picks transformers; on a GPU machine with vLLM installed
(``-m gpu``), the tiny model generates through it as through the transformers engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import Unsupported
from flowserve.core.types import InferRequest
from flowserve.nodes.backends._support import gpu_count
from flowserve.nodes.llm.backend import make_engine
from flowserve.nodes.llm.params import engine_config
from flowserve.nodes.llm.vllm_engine import VllmEngine, vllm_installed
from tests.llm.tinymodel import write_llm_model


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
