"""The generation node as a model backend: ``backend: "vllm"`` (Triton's vLLM model layout,
unchanged) or ``backend: "llm"`` in config.pbtxt, with ``<version>/model.json`` holding the
engine's arguments and ``"engine"``: ``"transformers"``, ``"vllm"`` or ``"auto"`` (vLLM when it
is installed and a GPU is present, else transformers).

Inputs and outputs are those of Triton's vLLM backend (filled in by :func:`llm_autocomplete`
when config.pbtxt leaves them out, as Triton does), plus an optional ``messages`` input: a JSON
list of chat messages that the tokenizer's chat template turns into the prompt (``text_input``
is then ignored). One request is one sequence. As in Triton's vLLM backend, a response carries
``text_output`` and, only when the request's ``return_*`` input is true, ``finish_reason``
("None" but on the last response), ``cumulative_logprob`` (of the tokens so far), ``logprobs``
(JSON: for each token since the previous response ``{"<token id>": {"logprob", "rank",
"decoded_token"}}`` for it and the ``logprobs`` most likely tokens that its sampling parameters
ask for; ``null`` when they ask for none), ``num_input_tokens`` (the prompt's) and
``num_output_tokens`` (since the previous response); log-probabilities are the model's own, before
temperature, top-k and top-p, as vLLM reports them; a
graph wired to the others sees them absent (the node has partial outputs). With ``stream`` true each response
carries the text decoded since the last one, else one response carries it all (with the prompt in front
unless ``exclude_input_in_output``). The model is decoupled: every response travels on through
the graph on its own. A client that goes away closes the node's stream, which cancels the
sequence in the engine and frees its KV blocks. A traced request gets a span for the
generation with its token counts and time to first token (vLLM's span attribute names), and a
``first_token`` span from its start to its first token.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.errors import InvalidArgument, ResourceExhausted, Unsupported
from flowserve.core.node import Context, Span, TensorMap
from flowserve.nodes.backends.base import BackendNode
from flowserve.nodes.llm.engine import Engine, Ranked, Sampling, Tokens
from flowserve.nodes.llm.metrics import LlmMetrics
from flowserve.nodes.llm.params import (
    EngineConfig,
    parse_json_parameters,
    read_model_json,
    sampling_from,
)
from flowserve.nodes.llm.textstream import TextStream
from flowserve.nodes.loading import LoadSettings
from flowserve.runtime.registry import Registry
from flowserve.runtime.stats import ModelStats
from flowserve.spec.model_config import ModelConfig
from flowserve.spec.schema import ModelSpec, TensorSpec
from flowserve.spec.triton import Completion

log = logging.getLogger("flowserve.llm")

INPUTS = (
    TensorSpec("text_input", "BYTES", (1,)),
    TensorSpec("stream", "BOOL", (1,), optional=True),
    TensorSpec("sampling_parameters", "BYTES", (1,), optional=True),
    TensorSpec("exclude_input_in_output", "BOOL", (1,), optional=True),
    TensorSpec("return_finish_reason", "BOOL", (1,), optional=True),
    TensorSpec("return_cumulative_logprob", "BOOL", (1,), optional=True),
    TensorSpec("return_logprobs", "BOOL", (1,), optional=True),
    TensorSpec("return_num_input_tokens", "BOOL", (1,), optional=True),
    TensorSpec("return_num_output_tokens", "BOOL", (1,), optional=True),
    TensorSpec("messages", "BYTES", (1,), optional=True),
)
OUTPUTS = (
    TensorSpec("text_output", "BYTES", (-1,)),
    TensorSpec("finish_reason", "BYTES", (-1,)),
    TensorSpec("cumulative_logprob", "FP32", (-1,)),
    TensorSpec("logprobs", "BYTES", (-1,)),
    TensorSpec("num_input_tokens", "UINT32", (1,)),
    TensorSpec("num_output_tokens", "UINT32", (-1,)),
)
# the outputs a request asks for with its return_* inputs
RETURNS = ("finish_reason", "cumulative_logprob", "logprobs", "num_input_tokens", "num_output_tokens")
# how often the running/waiting/KV-cache gauges are read from the engine
LOAD_PERIOD_S = 0.5
# a traced generation's span attributes (the names of vLLM's request spans)
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
TTFT = "gen_ai.latency.time_to_first_token"
FINISH = "gen_ai.response.finish_reasons"


def llm_autocomplete(config: ModelConfig, model_dir: Path, version_dirs: list[Path]) -> Completion:
    """What Triton's vLLM backend adds to a config: its inputs and outputs, and the decoupled
    transaction policy."""
    return Completion(inputs=list(INPUTS), outputs=list(OUTPUTS), decoupled=True)


def make_engine(model: str, config: EngineConfig) -> Engine:
    from flowserve.nodes.backends._support import gpu_count
    from flowserve.nodes.llm.vllm_engine import VllmEngine, vllm_installed

    engine = config.engine
    if engine == "auto":
        engine = "vllm" if vllm_installed() and gpu_count() > 0 else "transformers"
    if engine == "vllm":
        return VllmEngine(model, config)
    from flowserve.nodes.llm.transformers_engine import TransformersEngine

    if config.ignored:
        log.warning(
            "model '%s': the transformers engine ignores model.json %s (vLLM engine arguments)",
            model,
            ", ".join(repr(k) for k in config.ignored),
        )
    return TransformersEngine(model, config)


class LlmBackend(BackendNode):
    decoupled = True
    partial_outputs = True  # the return_* outputs only when asked for
    merges_rows = False

    def __init__(
        self,
        model: ModelSpec,
        version: int,
        stats: ModelStats,
        clock: Clock = MONOTONIC,
        registry: Registry | None = None,
        load: LoadSettings | None = None,
    ) -> None:
        super().__init__(model, version, stats, clock, registry, load)
        self.engine: Engine | None = None
        self.config: EngineConfig | None = None
        self.metrics: LlmMetrics | None = None
        self.active = 0
        self._ids = itertools.count()
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if not self.model.decoupled:
            raise InvalidArgument(
                f"model '{self.name}': backend '{self.model.backend}' needs the decoupled transaction "
                "policy (model_transaction_policy { decoupled: true }, or leave it out)"
            )
        self.config = read_model_json(self.name, Path(self.version_path))
        engine = make_engine(self.name, self.config)
        await engine.start()
        self.engine = engine
        self.metrics = LlmMetrics(self.name, self.version)
        self._watch = asyncio.ensure_future(self._watch_load())
        log.info("model '%s': generation engine '%s' started", self.name, engine.name)

    async def _watch_load(self) -> None:
        while True:
            self._read_load()
            await asyncio.sleep(LOAD_PERIOD_S)

    def _read_load(self) -> None:
        if self.engine is not None and self.metrics is not None:
            self.metrics.set_load(self.engine.load())

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(BaseException):
                await self._watch
        engine, self.engine = self.engine, None
        if engine is not None:
            await engine.stop()
        self.metrics = None

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        raise Unsupported(
            f"model '{self.name}' is decoupled: use the streaming API (generate_stream, ModelStreamInfer)"
        )

    async def stream(self, inputs: TensorMap, ctx: Context) -> AsyncGenerator[TensorMap, None]:
        engine, config, metrics = self.engine, self.config, self.metrics
        if engine is None or config is None or metrics is None:
            raise Unsupported(f"model '{self.name}': the generation engine is not running")
        request = parse_request(self.name, inputs, ctx.parameters, config.max_tokens)
        prompt_text, prompt = self._prompt(engine, request)
        if self.active >= config.max_waiting:
            raise ResourceExhausted(
                f"model '{self.name}': {self.active} sequences are already in the engine "
                f"(model.json max_waiting {config.max_waiting}); try again later"
            )
        self.active += 1
        request_id = f"{ctx.request_id or 'r'}-{next(self._ids)}"
        decode = engine.tokenizer.decode
        sampling = request.sampling
        text = TextStream(
            lambda ids: decode(ids, skip_special_tokens=True), sampling.stop, sampling.include_stop
        )
        stop_ids = frozenset(sampling.stop_token_ids)
        clock = self.clock
        start = last = clock.now_ns()
        first = 0
        generated = 0
        unsent = 0  # tokens since the last response (a response may wait for text to settle)
        logprob = 0.0
        # the logprobs output's entries of the tokens since the last response, when asked for
        ranked: list[dict[str, Any]] | None = [] if request.ranked else None
        reason = "abort"
        pieces: list[str] = [prompt_text] if request.prepend else []
        tokens = engine.generate(request_id, prompt, request.sampling)
        try:
            async for chunk in tokens:
                if stop_ids:
                    chunk = _until_stop_token(chunk, stop_ids)
                now = clock.now_ns()
                if chunk.ids:
                    step = (now - last) / 1e9 / len(chunk.ids)
                    for i in range(len(chunk.ids)):
                        metrics.token(step if generated + i else (now - start) / 1e9, generated + i == 0)
                    last = now
                    first = first or now
                if chunk.logprobs:
                    logprob += float(sum(chunk.logprobs))
                if ranked is not None:
                    ranked += _ranked_entries(chunk, decode)
                generated += len(chunk.ids)
                unsent += len(chunk.ids)
                delta = text.push(chunk.ids)
                if chunk.finished:
                    delta += text.finish()
                done = chunk.finished or text.stopped
                if done:
                    reason = "stop" if text.stopped else (chunk.reason or "stop")
                if request.stream:
                    if delta or done:
                        yield request.response(
                            delta, reason if done else None, len(prompt), unsent, logprob, ranked
                        )
                        unsent = 0
                        ranked = [] if ranked is not None else None
                else:
                    pieces.append(delta)
                if done:
                    break
            if not request.stream:
                yield request.response("".join(pieces), reason, len(prompt), generated, logprob, ranked)
        finally:
            self.active -= 1
            await tokens.aclose()  # cancels the sequence unless it finished
            end = clock.now_ns()
            metrics.finished(reason, len(prompt), generated, (end - start) / 1e9)
            if ctx.trace is not None:
                ctx.trace.extend(self._spans(start, first, end, len(prompt), generated, reason))

    def _spans(
        self, start: int, first: int, end: int, prompt: int, generated: int, reason: str
    ) -> list[Span]:
        """A traced request's spans: the generation with its token counts, and its time to first
        token."""
        attributes: dict[str, int | float | str] = {
            PROMPT_TOKENS: prompt,
            COMPLETION_TOKENS: generated,
            FINISH: reason,
        }
        spans = [Span(self.name, self.name, start, end, "cancelled" if reason == "abort" else None)]
        if first:
            attributes[TTFT] = (first - start) / 1e9
            spans.append(Span(self.name, "first_token", start, first))
        spans[0].attributes = attributes
        return spans

    def _prompt(self, engine: Engine, request: GenerationRequest) -> tuple[str, list[int]]:
        tokenizer = engine.tokenizer
        if request.messages is not None:
            try:
                text = tokenizer.apply_chat_template(
                    request.messages, tokenize=False, add_generation_prompt=True
                )
            except Exception as exc:  # no template, or messages it cannot render
                failed = f"{type(exc).__name__}: {exc}"
                raise InvalidArgument(
                    f"model '{self.name}': input 'messages': the chat template failed: {failed}"
                ) from None
            return str(text), list(tokenizer.encode(str(text), add_special_tokens=False))
        return request.text, list(tokenizer.encode(request.text))


class GenerationRequest:
    """One request's inputs, read and checked; ``returns``: the outputs it asked for beside
    ``text_output`` (its true ``return_*`` inputs)."""

    def __init__(
        self,
        text: str,
        messages: list[Any] | None,
        stream: bool,
        prepend: bool,
        sampling: Sampling,
        returns: frozenset[str] = frozenset(),
        ranked: bool = False,
    ) -> None:
        self.text = text
        self.messages = messages
        self.stream = stream
        self.prepend = prepend
        self.sampling = sampling
        self.returns = returns
        self.ranked = ranked  # the logprobs output, with entries (its sampling asks for logprobs)

    def response(
        self,
        text: str,
        reason: str | None,
        prompt_tokens: int,
        output_tokens: int,
        logprob: float = 0.0,
        ranked: list[dict[str, Any]] | None = None,
    ) -> TensorMap:
        """One response's tensors: ``text_output`` and the outputs asked for, with the values
        Triton's vLLM backend gives (``finish_reason`` "None" until the last response)."""
        out = {"text_output": np.array([text.encode()], dtype=object)}
        returns = self.returns
        if returns:
            if "finish_reason" in returns:
                out["finish_reason"] = np.array([str(reason).encode()], dtype=object)
            if "cumulative_logprob" in returns:
                out["cumulative_logprob"] = np.array([logprob], dtype=np.float32)
            if "logprobs" in returns:
                out["logprobs"] = np.array([json.dumps(ranked).encode()], dtype=object)
            if "num_input_tokens" in returns:
                out["num_input_tokens"] = np.array([prompt_tokens], dtype=np.uint32)
            if "num_output_tokens" in returns:
                out["num_output_tokens"] = np.array([output_tokens], dtype=np.uint32)
        return out


def _scalar(inputs: TensorMap, name: str) -> Any:
    array = inputs.get(name)
    if array is None:
        return None
    flat = np.asarray(array).reshape(-1)
    return flat[0] if flat.size else None


def _text(model: str, inputs: TensorMap, name: str) -> str | None:
    value = _scalar(inputs, name)
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise InvalidArgument(f"model '{model}': input '{name}' is not UTF-8 text") from None
    return str(value)


def _flag(inputs: TensorMap, name: str, default: bool) -> bool:
    value = _scalar(inputs, name)
    return default if value is None else bool(value)


def parse_request(
    model: str, inputs: TensorMap, parameters: Mapping[str, Any], default_max_tokens: int
) -> GenerationRequest:
    """A request's inputs as Triton's vLLM backend reads them: ``sampling_parameters`` (JSON)
    when given, else the request's parameters; ``stream`` and ``exclude_input_in_output`` as
    inputs or parameters."""
    text = _text(model, inputs, "text_input") or ""
    messages = None
    raw = _text(model, inputs, "messages")
    if raw is not None:
        try:
            messages = json.loads(raw)
        except ValueError as exc:
            raise InvalidArgument(f"model '{model}': input 'messages' is not valid JSON: {exc}") from None
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise InvalidArgument(f"model '{model}': input 'messages' must be a JSON list of objects")
    if messages is None and not text:
        raise InvalidArgument(f"model '{model}': input 'text_input' is empty")
    params = dict(parameters)
    stream = _flag(inputs, "stream", bool(params.pop("stream", False)))
    exclude = _scalar(inputs, "exclude_input_in_output")
    exclude_param = params.pop("exclude_input_in_output", None)
    if exclude is None:
        exclude = exclude_param
    prepend = (not bool(exclude)) if exclude is not None else not stream
    if prepend and stream:
        raise InvalidArgument(
            f"model '{model}': when streaming, 'exclude_input_in_output' = false is not allowed"
        )
    if messages is not None:
        prepend = False
    sampling_text = _text(model, inputs, "sampling_parameters")
    if sampling_text is not None:
        where = "input 'sampling_parameters'"
        doc = parse_json_parameters(model, sampling_text, where)
        sampling = sampling_from(model, doc, default_max_tokens, strict=True, where=where)
    else:
        sampling = sampling_from(model, params, default_max_tokens, strict=False, where="parameter")
    returns = frozenset(name for name in RETURNS if _flag(inputs, f"return_{name}", False))
    # the logprobs output has entries when the sampling parameters ask for logprobs (else null)
    ranked = "logprobs" in returns and sampling.logprobs is not None
    if "cumulative_logprob" in returns and sampling.logprobs is None:
        sampling = dataclasses.replace(sampling, logprobs=0)  # each token's own
    return GenerationRequest(text, messages, stream, prepend, sampling, returns, ranked)


def _until_stop_token(chunk: Tokens, stop_ids: frozenset[int]) -> Tokens:
    """``chunk`` up to and with its first token of ``stop_ids`` (vLLM's ``stop_token_ids``: the
    token stays in the output, where a special one decodes to nothing), which ends the sequence."""
    for i, token in enumerate(chunk.ids):
        if token in stop_ids:
            n = i + 1
            logprobs = chunk.logprobs[:n] if chunk.logprobs is not None else None
            ranked = chunk.ranked[:n] if chunk.ranked is not None else None
            return Tokens(chunk.ids[:n], True, "stop", logprobs, ranked)
    return chunk


def _ranked_entries(chunk: Tokens, decode: Any) -> list[dict[str, Any]]:
    """The logprobs output's entries for a chunk's tokens, as Triton's vLLM backend writes them:
    per token ``{"<id>": {"logprob", "rank", "decoded_token"}}`` for the token (first) and the
    most likely tokens at its position (ranked 1, 2, ...). ``decode``: the tokenizer's, as the
    text is decoded (the decoded tokens of a greedy answer add up to its text)."""
    entries: list[dict[str, Any]] = []
    values = chunk.logprobs or ()
    ranks = chunk.ranked or ()
    for i, token in enumerate(chunk.ids):
        ranked = ranks[i] if i < len(ranks) else Ranked(1)
        value = float(values[i]) if i < len(values) else 0.0
        entry = {str(token): _entry(value, ranked.rank, token, decode)}
        for rank, (other, other_value) in enumerate(ranked.top, start=1):
            if str(other) not in entry:
                entry[str(other)] = _entry(other_value, rank, other, decode)
        entries.append(entry)
    return entries


def _entry(value: float, rank: int, token: int, decode: Any) -> dict[str, Any]:
    return {"logprob": value, "rank": rank, "decoded_token": decode([token], skip_special_tokens=True)}
