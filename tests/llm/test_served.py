"""The generation model served: the official ``openai`` client against the OpenAI-compatible
front end (completions, chat, SSE streaming, usage, n, stop, errors in OpenAI's shape), and
Triton's vLLM client paths (gRPC streaming with tritonclient, HTTP generate and
generate_stream) against the same model in Triton's vLLM layout."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from tests.llm.tinymodel import write_llm_model

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.asyncio(loop_scope="module")


class Served:
    def __init__(self, server: Any, plane: Any) -> None:
        self.server = server
        self.plane = plane

    def port(self, protocol: str) -> int:
        for listener, (name, _) in zip(self.server.listeners, self.server.addresses, strict=True):
            if name == protocol:
                return int(listener.port)
        raise KeyError(protocol)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    from flowserve.server import Server, ServerOptions

    repo = tmp_path_factory.mktemp("served-repo")
    write_llm_model(repo, "tiny", tiny_model)
    graphs = write_embedding_graph(tmp_path_factory.mktemp("served-project"))
    options = ServerOptions(
        model_repositories=[repo],
        graph_dirs=[graphs],
        host="127.0.0.1",
        http_port=0,
        grpc_port=0,
        metrics_port=-1,
        openai_port=0,
    )
    server = Server(options)
    plane = await server.start()
    try:
        for _ in range(600):
            if plane.model_ready("tiny") and plane.model_ready("embed"):
                break
            await asyncio.sleep(0.05)
        yield Served(server, plane)
    finally:
        for c in _clients.values():
            await c.close()
        _clients.clear()
        await server.stop()


EMBED_NODE = """
import numpy as np


class Embed:
    inputs = ["text"]
    outputs = ["vector"]

    def execute(self, inputs):
        return {"vector": embed(inputs["text"].reshape(-1)[0].decode())}


def embed(text):
    vector = np.zeros(8, np.float32)
    for i, byte in enumerate(text.encode()):
        vector[i % 8] += byte / 255
    return vector
"""
EMBED_GRAPH = """
name: embed
inputs:
  text: {datatype: BYTES, dims: [1]}
outputs:
  vector: embed.vector
nodes:
  embed:
    python: embed_node:Embed
    inputs: {text: $text}
    outputs: {vector: {datatype: FP32, dims: [8]}}
"""


def write_embedding_graph(project: Path) -> Path:
    """A graph with one text input and a vector output (a python node), as /v1/embeddings takes."""
    (project / "embed_node.py").write_text(EMBED_NODE)
    (project / "graphs").mkdir()
    (project / "graphs" / "embed.yaml").write_text(EMBED_GRAPH)
    return project / "graphs"


def expected_embedding(text: str) -> list[float]:
    vector = np.zeros(8, np.float32)
    for i, byte in enumerate(text.encode()):
        vector[i % 8] += byte / 255
    return [float(v) for v in vector]


_clients: dict[int, Any] = {}


def client(served: Served) -> Any:
    """One client for the module (closed with the server)."""
    port = served.port("OpenAI")
    if port not in _clients:
        _clients[port] = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0
        )
    return _clients[port]


async def test_models_lists_the_generation_model(served: Served) -> None:
    models = await client(served).models.list()
    assert [m.id for m in models.data] == ["tiny"]


async def test_completion_with_usage_and_max_tokens(served: Served) -> None:
    out = await client(served).completions.create(
        model="tiny", prompt="hello world", max_tokens=7, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 7
    assert out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + 7
    streamed = await client(served).completions.create(
        model="tiny", prompt="hello world", max_tokens=7, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = [c async for c in streamed]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == out.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7


async def test_a_seed_makes_sampling_repeatable(served: Served) -> None:
    async def sample(seed: int, n: int = 1) -> list[str]:
        out = await client(served).completions.create(
            model="tiny", prompt="hello world", max_tokens=12, temperature=1.0, seed=seed, n=n,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        return [c.text for c in out.choices]

    first = await sample(11)
    assert await sample(11) == first
    # n choices with a seed: choice i samples with seed + i (as vLLM), in one running batch
    three = await sample(11, n=3)
    assert three[0] == first[0]
    assert three[1:] == [*await sample(12), *await sample(13)]
    assert len(set(three)) == 3


async def test_chat_streams_deltas_and_honours_stop(served: Served) -> None:
    messages = [{"role": "user", "content": "hello"}]
    full = await client(served).chat.completions.create(
        model="tiny", messages=messages, max_tokens=16, temperature=0, seed=1, extra_body={"ignore_eos": True}
    )
    text = full.choices[0].message.content or ""
    assert full.choices[0].message.role == "assistant" and len(text) > 3
    stream = await client(served).chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    stop = text[2:4]
    stopped = await client(served).chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=16,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    )
    assert stopped.choices[0].message.content == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


async def test_logprobs_in_openais_shape(served: Served) -> None:
    """Completions ``logprobs`` N and chat ``logprobs`` / ``top_logprobs`` N, whole and streamed:
    each token's log-probability, its text (the tokens add up to the answer) and the N most
    likely tokens; absent when not asked for."""
    common: dict[str, Any] = {
        "model": "tiny",
        "max_tokens": 5,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    out = await client(served).completions.create(prompt="hello world", logprobs=2, **common)
    lp = out.choices[0].logprobs
    assert lp is not None and len(lp.tokens) == 5 and "".join(lp.tokens) == out.choices[0].text
    assert all(v < 0 for v in lp.token_logprobs) and all(len(t) == 2 for t in lp.top_logprobs)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    # greedy: each token is the most likely one
    assert all(
        max(top.values()) == pytest.approx(v)
        for top, v in zip(lp.top_logprobs, lp.token_logprobs, strict=True)
    )
    streamed = await client(served).completions.create(
        prompt="hello world", logprobs=2, stream=True, **common
    )
    tokens = [
        t
        for c in [c async for c in streamed]
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.tokens
    ]
    assert tokens == lp.tokens
    plain = await client(served).completions.create(prompt="hello world", **common)
    assert plain.choices[0].logprobs is None
    messages = [{"role": "user", "content": "hello"}]
    chat = await client(served).chat.completions.create(
        messages=messages, logprobs=True, top_logprobs=3, **common
    )
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode()) for t in content)
    assert all(t.top_logprobs[0].logprob == pytest.approx(t.logprob) for t in content)
    chat_stream = await client(served).chat.completions.create(
        messages=messages, logprobs=True, stream=True, **common
    )
    streamed_tokens = [
        t.token
        for c in [c async for c in chat_stream]
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert streamed_tokens == [t.token for t in content]
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        await client(served).chat.completions.create(messages=messages, top_logprobs=2, **common)


async def test_vllm_stop_extras_through_the_openai_api(served: Served) -> None:
    base: dict[str, Any] = {"model": "tiny", "prompt": "the quick", "max_tokens": 12, "temperature": 0}
    free = await client(served).completions.create(**base, extra_body={"ignore_eos": True})
    text = free.choices[0].text
    stop = text[2:4]
    kept = await client(served).completions.create(
        **base, stop=[stop], extra_body={"ignore_eos": True, "include_stop_str_in_output": True}
    )
    assert kept.choices[0].text == text[: text.index(stop) + len(stop)]
    # stop_token_ids is taken (tests/llm/test_llm_node.py checks where it stops); a bad one refused
    never = await client(served).completions.create(
        **base, extra_body={"ignore_eos": True, "stop_token_ids": [10**6]}
    )
    assert never.choices[0].text == text and never.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="stop_token_ids"):
        await client(served).completions.create(**base, extra_body={"stop_token_ids": "x"})


async def test_n_choices(served: Served) -> None:
    out = await client(served).completions.create(
        model="tiny", prompt="hello", max_tokens=3, n=3, temperature=0, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({c.text for c in out.choices}) == 1  # greedy: all the same
    assert out.usage is not None and out.usage.completion_tokens == 9


async def test_errors_have_openai_shape(served: Served) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        await client(served).completions.create(model="nope", prompt="hi", max_tokens=2)
    assert "nope" in missing.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        await client(served).completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=-3)
    assert "model 'tiny'" in bad.value.message and "temperature" in bad.value.message
    assert bad.value.body["type"] == "invalid_request_error"  # type: ignore[index]


async def test_a_body_over_the_limit_is_refused_and_the_server_serves_on(served: Served) -> None:
    from flowserve.frontends.openai.app import MAX_BODY

    body = json.dumps({"model": "tiny", "prompt": "x" * (MAX_BODY + 1024), "max_tokens": 1}).encode()
    url = f"http://127.0.0.1:{served.port('OpenAI')}/v1/completions"

    def post() -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, doc = await asyncio.to_thread(post)
    assert status == 400 and f"larger than {MAX_BODY} bytes" in doc["error"]["message"], doc
    out = await client(served).completions.create(model="tiny", prompt="hi", max_tokens=1)
    assert out.usage is not None and out.usage.completion_tokens == 1


async def test_triton_vllm_client_over_grpc_streaming(served: Served) -> None:
    import tritonclient.grpc.aio as grpcclient

    triton = grpcclient.InferenceServerClient(f"127.0.0.1:{served.port('gRPC')}")
    try:
        config = await triton.get_model_config("tiny", as_json=True)
        assert config["config"]["model_transaction_policy"]["decoupled"] is True
        inputs = [
            grpcclient.InferInput("text_input", [1], "BYTES"),
            grpcclient.InferInput("stream", [1], "BOOL"),
            grpcclient.InferInput("sampling_parameters", [1], "BYTES"),
        ]
        inputs[0].set_data_from_numpy(np.array([b"hello world"], dtype=object))
        inputs[1].set_data_from_numpy(np.array([True]))
        params = {"temperature": "0", "max_tokens": "6", "ignore_eos": "true"}
        inputs[2].set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=object))
        outputs = [grpcclient.InferRequestedOutput("text_output")]

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": "tiny", "inputs": inputs, "outputs": outputs, "request_id": "1"}

        pieces = []
        async for result, error in triton.stream_infer(requests()):
            assert error is None
            pieces.append(result.as_numpy("text_output")[0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        assert len(pieces) > 1
    finally:
        await triton.close()


def _post(url: str, doc: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def test_triton_generate_endpoints(served: Served) -> None:
    base = f"http://127.0.0.1:{served.port('HTTP')}/v2/models/tiny"
    doc = {"text_input": "hello world", "parameters": {"stream": False, "temperature": 0, "max_tokens": 5}}
    status, body = await asyncio.to_thread(_post, f"{base}/generate", doc)
    assert status == 200, body
    answer = json.loads(body)
    assert answer["model_name"] == "tiny" and answer["text_output"].startswith("hello world")
    doc = {"text_input": "hello world", "stream": True, "parameters": {"temperature": 0, "max_tokens": 5}}
    status, body = await asyncio.to_thread(_post, f"{base}/generate_stream", doc)
    assert status == 200, body
    events = [json.loads(line[5:]) for line in body.decode().splitlines() if line.startswith("data:")]
    assert len(events) >= 1 and all("text_output" in e for e in events)


async def test_embeddings_over_a_graph_that_outputs_a_vector(served: Served) -> None:
    out = await client(served).embeddings.create(model="embed", input=["hello world", "flowserve"])
    assert [d.index for d in out.data] == [0, 1]
    assert out.data[0].embedding == pytest.approx(expected_embedding("hello world"))
    assert out.data[1].embedding == pytest.approx(expected_embedding("flowserve"))
    assert out.model == "embed"
    # the client asks for base64 unless told otherwise; JSON numbers too
    floats = await client(served).embeddings.create(model="embed", input="hello", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(expected_embedding("hello"))
    with pytest.raises(openai.BadRequestError) as bad:  # a generation model has no vector output
        await client(served).embeddings.create(model="tiny", input="hello")
    assert "model 'tiny'" in bad.value.message


async def test_a_streaming_client_that_goes_away_frees_its_sequence(served: Served) -> None:
    node = served.plane.engine.registry.get("tiny", "").executor.nodes[0]
    aborted = node.metrics.success["abort"].value()
    body = json.dumps(
        {"model": "tiny", "prompt": "hello", "max_tokens": 400, "ignore_eos": True, "stream": True}
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port("OpenAI"))
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    events = 0
    while events < 3:
        line = await asyncio.wait_for(reader.readline(), 30)
        events += line.startswith(b"data: ")
    assert node.engine.load().running == 1
    writer.close()
    await writer.wait_closed()
    for _ in range(500):
        load = node.engine.load()
        if node.active == 0 and load.running == 0:
            break
        await asyncio.sleep(0.01)
    # the sequence was cancelled (not run to its 400 tokens), and its KV blocks are free
    assert node.metrics.success["abort"].value() == aborted + 1
    assert (node.active, load.running, load.waiting, load.kv_cache_usage) == (0, 0, 0, 0.0)
