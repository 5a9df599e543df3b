"""The generation node in-process on the transformers engine with a tiny model built in the
test: streaming, the one-response form, greedy determinism, max_tokens, stop strings, chat
messages, continuous batching of concurrent requests, cancellation, errors and metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

import flowserve
from flowserve.core.errors import FlowserveError
from flowserve.core.types import InferRequest, InferResponse
from flowserve.nodes.backends.pb_utils import custom_metrics
from tests.llm.tinymodel import write_llm_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llm"


RETURNS = ("finish_reason", "num_input_tokens", "num_output_tokens")


def request(
    text: str, stream: bool = True, returns: tuple[str, ...] = RETURNS, **params: object
) -> InferRequest:
    inputs = {
        "text_input": np.array([text.encode()], dtype=object),
        "stream": np.array([stream]),
        "sampling_parameters": np.array([json.dumps(params).encode()], dtype=object),
    }
    inputs.update({f"return_{name}": np.array([True]) for name in returns})
    if not stream:
        inputs["exclude_input_in_output"] = np.array([True])
    return InferRequest("tiny", inputs)


def texts(responses: list[InferResponse]) -> list[str]:
    return [r.outputs["text_output"][0].decode() for r in responses]


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[flowserve.Engine]:
    repo = tmp_path_factory.mktemp("llm-repo")
    write_llm_model(repo, "tiny", tiny_model)
    engine = await flowserve.Engine.start(repo)
    try:
        yield engine
    finally:
        await engine.stop()


def llm_node(engine: flowserve.Engine) -> object:
    servable = engine.registry.get("tiny", "")
    return servable.executor.nodes[0]


async def collect(engine: flowserve.Engine, req: InferRequest) -> list[InferResponse]:
    return [r async for r in engine.stream_request(req)]


async def test_stream_and_single_response_agree_when_greedy(engine: flowserve.Engine) -> None:
    streamed = await collect(engine, request("hello world", temperature=0, max_tokens=12, ignore_eos=True))
    assert len(streamed) > 1
    last = streamed[-1].outputs
    assert last["finish_reason"][0] == b"length"
    assert sum(int(r.outputs["num_output_tokens"][0]) for r in streamed) == 12
    assert all(int(r.outputs["num_input_tokens"][0]) > 0 for r in streamed)
    single = await collect(
        engine, request("hello world", stream=False, temperature=0, max_tokens=12, ignore_eos=True)
    )
    assert len(single) == 1
    assert texts(single)[0] == "".join(texts(streamed))
    assert int(single[0].outputs["num_output_tokens"][0]) == 12


async def test_prompt_is_prepended_unless_excluded(engine: flowserve.Engine) -> None:
    req = request("hello world", stream=False, temperature=0, max_tokens=4, ignore_eos=True)
    del req.inputs["exclude_input_in_output"]
    (full,) = await collect(engine, req)
    assert texts([full])[0].startswith("hello world")


async def test_stop_string_ends_the_text_before_it(engine: flowserve.Engine) -> None:
    (free,) = await collect(
        engine, request("the quick", stream=False, temperature=0, max_tokens=24, ignore_eos=True)
    )
    text = texts([free])[0]
    assert len(text) > 4
    stop = text[2:4]
    (stopped,) = await collect(
        engine, request("the quick", stream=False, temperature=0, max_tokens=24, ignore_eos=True, stop=[stop])
    )
    assert texts([stopped])[0] == text[: text.index(stop)]
    assert stopped.outputs["finish_reason"][0] == b"stop"


async def test_include_stop_str_in_output_and_stop_token_ids(engine: flowserve.Engine) -> None:
    """vLLM's ``include_stop_str_in_output`` (the text ends after the stop string) and
    ``stop_token_ids`` (the first such token ends the sequence and stays in the output)."""
    greedy = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}
    returns = ("logprobs", "num_output_tokens", "finish_reason")
    (free,) = await collect(engine, request("the quick", stream=False, returns=returns, logprobs=0, **greedy))
    text = texts([free])[0]
    ids = [int(next(iter(e))) for e in json.loads(free.outputs["logprobs"][0].decode())]
    assert len(ids) == 12
    stop = text[2:4]
    (kept,) = await collect(
        engine, request("the quick", stream=False, stop=[stop], include_stop_str_in_output=True, **greedy)
    )
    assert texts([kept])[0] == text[: text.index(stop) + len(stop)]
    stop_id = ids[3]
    until = ids.index(stop_id) + 1
    for stream in (False, True):
        stopped = await collect(
            engine,
            request(
                "the quick", stream=stream, returns=returns, logprobs=0, stop_token_ids=[stop_id], **greedy
            ),
        )
        got = [int(next(iter(e))) for r in stopped for e in json.loads(r.outputs["logprobs"][0].decode())]
        assert got == ids[:until]
        assert sum(int(r.outputs["num_output_tokens"][0]) for r in stopped) == until
        assert stopped[-1].outputs["finish_reason"][0] == b"stop"
    with pytest.raises(FlowserveError, match="'stop_token_ids' must be a list of token ids"):
        await collect(engine, request("the quick", stop_token_ids=["x"], max_tokens=2))


async def test_chat_messages_use_the_chat_template(engine: flowserve.Engine) -> None:
    req = request("", stream=False, temperature=0, max_tokens=3, ignore_eos=True)
    req.inputs["messages"] = np.array(
        [json.dumps([{"role": "user", "content": "hello"}]).encode()], dtype=object
    )
    (out,) = await collect(engine, req)
    # "<s>user: hello\n<s>assistant: " in tokens, longer than "hello" alone
    assert int(out.outputs["num_input_tokens"][0]) > len(engine_tokens(engine, "hello"))
    assert int(out.outputs["num_output_tokens"][0]) == 3


def engine_tokens(engine: flowserve.Engine, text: str) -> list[int]:
    node = llm_node(engine)
    return list(node.engine.tokenizer.encode(text))  # type: ignore[attr-defined]


async def test_concurrent_requests_share_the_running_batch(engine: flowserve.Engine) -> None:
    prompts = [f"hello world {i}" for i in range(8)]
    results = await asyncio.gather(
        *(collect(engine, request(p, temperature=0, max_tokens=10, ignore_eos=True)) for p in prompts)
    )
    for responses in results:
        assert sum(int(r.outputs["num_output_tokens"][0]) for r in responses) == 10
    alone = await collect(engine, request(prompts[3], temperature=0, max_tokens=10, ignore_eos=True))
    assert "".join(texts(alone)) == "".join(texts(results[3]))  # batching does not change greedy output


async def test_a_client_that_goes_away_frees_its_sequence(engine: flowserve.Engine) -> None:
    node = llm_node(engine)
    before = node.engine.load()  # type: ignore[attr-defined]
    stream = engine.stream_request(request("hello world", temperature=0, max_tokens=400, ignore_eos=True))
    produced = 0
    async for response in stream:
        produced += int(response.outputs["num_output_tokens"][0])
        if produced >= 64:
            break
    during = node.engine.load()  # type: ignore[attr-defined]
    assert during.running == 1
    assert during.kv_cache_usage > before.kv_cache_usage
    await stream.aclose()  # type: ignore[attr-defined]
    for _ in range(300):
        after = node.engine.load()  # type: ignore[attr-defined]
        if after.running == 0 and after.kv_cache_usage < during.kv_cache_usage:
            break
        await asyncio.sleep(0.01)
    # its sequence left the batch and its blocks went back: KV use is back where it was (the
    # complete blocks transformers keeps as an evictable prefix cache count as free, as in vLLM)
    assert (after.running, after.waiting) == (0, 0)
    assert after.kv_cache_usage == before.kv_cache_usage == 0.0
    assert node.active == 0  # type: ignore[attr-defined]
    # the engine goes on serving
    assert len(await collect(engine, request("hello", temperature=0, max_tokens=3, ignore_eos=True))) >= 1


async def test_a_request_seed_gives_the_same_text_alone_and_in_a_batch(engine: flowserve.Engine) -> None:
    def sampled(prompt: str, seed: int) -> InferRequest:
        return request(prompt, temperature=1.0, max_tokens=12, ignore_eos=True, seed=seed)

    alone = "".join(texts(await collect(engine, sampled("hello world", 7))))
    # the same request among others that sample (unseeded and seeded) and decode greedily
    others = [
        collect(engine, request("the quick brown fox", temperature=1.0, max_tokens=12, ignore_eos=True)),
        collect(engine, sampled("a small model", 3)),
        collect(engine, request("flowserve streams", temperature=0, max_tokens=12, ignore_eos=True)),
    ]
    batched, *_ = await asyncio.gather(collect(engine, sampled("hello world", 7)), *others)
    assert "".join(texts(batched)) == alone
    assert "".join(texts(await collect(engine, sampled("hello world", 8)))) != alone


async def test_bad_requests_name_the_model_and_the_field(engine: flowserve.Engine) -> None:
    with pytest.raises(FlowserveError, match=r"model 'tiny'.*'temperature' must be >= 0"):
        await collect(engine, request("hi", temperature=-1))
    with pytest.raises(
        FlowserveError, match=r"model 'tiny': unknown input 'sampling_parameters' 'tempreature'"
    ):
        await collect(engine, request("hi", tempreature=0.5))
    with pytest.raises(FlowserveError, match=r"'n' is not supported"):
        await collect(engine, request("hi", n=2))
    req = request("hi")
    req.inputs["sampling_parameters"] = np.array([b"{not json"], dtype=object)
    with pytest.raises(FlowserveError, match="not valid JSON"):
        await collect(engine, req)
    with pytest.raises(FlowserveError, match="when streaming, 'exclude_input_in_output' = false"):
        bad = request("hi")
        bad.inputs["exclude_input_in_output"] = np.array([False])
        await collect(engine, bad)


async def test_metrics_carry_vllm_names(engine: flowserve.Engine) -> None:
    families = {name: samples for name, _, _, samples in custom_metrics()}
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    ):
        assert name in families, name
    before = {name: samples for name, _, _, samples in custom_metrics()}

    def tiny(
        families: dict[str, list[tuple[str, dict[str, str], float]]], name: str, suffix: str = ""
    ) -> float:
        return sum(
            v for n, labels, v in families.get(name, []) if labels["model"] == "tiny" and n.endswith(suffix)
        )

    await collect(engine, request("hello", temperature=0, max_tokens=5, ignore_eos=True))
    after = {name: samples for name, _, _, samples in custom_metrics()}
    generated = tiny(after, "vllm:generation_tokens_total") - tiny(before, "vllm:generation_tokens_total")
    assert generated == 5.0
    ttft = "vllm:time_to_first_token_seconds"
    assert tiny(after, ttft, "_count") - tiny(before, ttft, "_count") == 1.0


async def test_guarded_chat_graph_routes_and_edits_the_stream(tiny_model: Path, tmp_path: Path) -> None:
    import shutil

    example = EXAMPLE
    repo = tmp_path / "repo"
    write_llm_model(repo, "chat_llm", tiny_model)
    graphs = tmp_path / "graphs"
    shutil.copytree(example / "graphs", graphs)
    shutil.copy(example / "llm_guard.py", tmp_path / "llm_guard.py")
    engine = await flowserve.Engine.start(repo, graphs)
    try:
        refused = [
            r async for r in engine.stream_request(InferRequest("guarded_chat", text("my password is")))
        ]
        assert texts(refused) == ["I can't help with that."]
        answered = [r async for r in engine.stream_request(InferRequest("guarded_chat", text("the quick")))]
        assert len(answered) > 1  # streamed through the redaction node, piece by piece
        assert all("fox" not in t and "dog" not in t for t in texts(answered))
    finally:
        await engine.stop()


def text(value: str) -> dict[str, np.ndarray]:
    return {"text_input": np.array([value.encode()], dtype=object)}


async def test_return_outputs_only_when_asked(engine: flowserve.Engine) -> None:
    """As Triton's vLLM backend: text_output always, each other output only when its return_*
    input is true; finish_reason "None" until the last response."""
    plain = await collect(
        engine, request("hello world", returns=(), temperature=0, max_tokens=6, ignore_eos=True)
    )
    assert len(plain) > 1 and all(set(r.outputs) == {"text_output"} for r in plain)
    asked = await collect(
        engine,
        request("hello world", returns=("finish_reason",), temperature=0, max_tokens=6, ignore_eos=True),
    )
    assert all(set(r.outputs) == {"text_output", "finish_reason"} for r in asked)
    reasons = [r.outputs["finish_reason"][0] for r in asked]
    assert reasons[-1] == b"length" and set(reasons[:-1]) <= {b"None"}
    assert "".join(texts(asked)) == "".join(texts(plain))
    # sampled: the log-probability of the tokens so far, falling as tokens come
    sampled = await collect(
        engine,
        request(
            "hello world", returns=("cumulative_logprob", "num_output_tokens"), max_tokens=8, ignore_eos=True
        ),
    )
    values = [float(r.outputs["cumulative_logprob"][0]) for r in sampled]
    assert all(r.outputs["cumulative_logprob"].dtype == np.float32 for r in sampled)
    assert values[-1] < 0 and values == sorted(values, reverse=True)
    assert sum(int(r.outputs["num_output_tokens"][0]) for r in sampled) == 8


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("top", [None, 0, 2])
async def test_logprobs_as_tritons_vllm_backend_returns_them(
    engine: flowserve.Engine, stream: bool, top: int | None
) -> None:
    """Triton's additional outputs test, greedy: ``logprobs`` (JSON) per response, one entry per
    token of that response (as many as num_output_tokens), each naming the token and the N most
    likely with their log-probability, rank and decoded text; the rank-1 tokens' texts add up to
    the text; null when the sampling parameters ask for no logprobs. The cumulative
    log-probability is the model's own, so it changes with every greedy token too."""
    params: dict[str, object] = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
    if top is not None:
        params["logprobs"] = top
    returns = ("logprobs", "num_output_tokens", "cumulative_logprob")
    responses = await collect(engine, request("hello world", stream=stream, returns=returns, **params))
    previous = 0.0
    for response in responses:
        cumulative = float(response.outputs["cumulative_logprob"][0])
        assert cumulative != previous and cumulative < 0
        previous = cumulative
        entries = json.loads(response.outputs["logprobs"][0].decode())
        if top is None:
            assert entries is None
            continue
        assert len(entries) == int(response.outputs["num_output_tokens"][0]) >= 1
        text = ""
        for entry in entries:
            assert 1 <= len(entry) <= top + 1
            ones = [v for v in entry.values() if v["rank"] == 1]
            assert len(ones) == 1
            text += ones[0]["decoded_token"]
            for token, value in entry.items():
                assert token.isdigit() and set(value) == {"logprob", "rank", "decoded_token"}
                assert isinstance(value["logprob"], float) and value["logprob"] <= 0
        assert text == texts([response])[0]
    # not asked for: absent
    plain = await collect(engine, request("hello world", stream=stream, returns=(), **params))
    assert all("logprobs" not in r.outputs for r in plain)


async def test_logprobs_beyond_the_limit_are_refused(engine: flowserve.Engine) -> None:
    with pytest.raises(FlowserveError, match=r"'logprobs' must be in 0\.\.20"):
        await collect(engine, request("hello world", logprobs=21, max_tokens=2))


async def test_a_traced_generation_has_token_counts_and_ttft(engine: flowserve.Engine) -> None:
    from flowserve.core.node import Span

    spans: list[Span] = []
    req = request("hello world", temperature=0, max_tokens=5, ignore_eos=True)
    responses = [r async for r in engine.stream_request(req, trace=spans)]
    assert len(responses) > 1
    (generation,) = [s for s in spans if s.node == "tiny"]
    (first,) = [s for s in spans if s.node == "first_token"]
    attributes = generation.attributes or {}
    assert attributes["gen_ai.usage.completion_tokens"] == 5
    assert attributes["gen_ai.usage.prompt_tokens"] == len(engine_tokens(engine, "hello world"))
    assert attributes["gen_ai.response.finish_reasons"] == "length"
    ttft = float(attributes["gen_ai.latency.time_to_first_token"])
    assert first.start_ns == generation.start_ns and first.end_ns <= generation.end_ns
    assert ttft == (first.end_ns - first.start_ns) / 1e9 > 0
    assert generation.error is None
